"""Writing one checkpoint (or export) into the store: its files, the manifest last, then the
commit that makes it visible whole (docs/design/checkpoints.md, "Checkpoint store", "Commit
protocol").

The writer keeps the store's rule; the stage under it (`storage.StagedEntry`) keeps the
mechanics. Each file's size is counted as it is written and its sha256 comes from whoever
wrote it (the worker hashes its large files while writing them, `worker.checkpoints.hashed_file`) or
is taken here for bytes written whole, so the manifest costs no second read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from trainctl.store.checkpoints.manifests import (
    FULL_LAYOUT,
    MANIFEST_FILE,
    build_manifest,
    is_plain_file_name,
    manifest_bytes,
)
from trainctl.store.checkpoints.storage import Sink, StagedEntry
from trainctl.store.exceptions import InvalidName


class _Counted:
    """A sink that counts what passes through it."""

    def __init__(self, sink: Sink) -> None:
        self.sink, self.size, self.closed = sink, 0, False

    def write(self, data: bytes | bytearray | memoryview) -> int:
        written = self.sink.write(data)
        self.size += written
        return written

    def close(self) -> None:
        self.sink.close()
        self.closed = True


class CheckpointWriter:
    """A checkpoint being written; `CheckpointStore.stage` makes one. Used as a context, it
    removes what it wrote when the block raises (or ends uncommitted)."""

    def __init__(self, staged: StagedEntry, *, joined: bool = False) -> None:
        self._staged = staged
        self.joined = joined
        """Another process's stage (`CheckpointStore.join`): this writer adds files, the
        owner commits."""
        self._files: dict[str, _Counted] = {}  # in the order created: the manifest's order
        self._hashes: dict[str, str] = {}
        self._adopted: list[dict[str, Any]] = []  # files other processes wrote into the stage
        self.committed = False

    @property
    def key(self) -> str:
        """The stage, for `CheckpointStore.join` in the other processes of a sharded save."""
        return self._staged.key

    def listing(self, hashes: Mapping[str, str]) -> list[dict[str, Any]]:
        """The manifest entries ``{name, size, sha256}`` of the files written here, every one
        closed: what a process that joined the stage hands the owner to `adopt`."""
        known = {**self._hashes, **hashes}
        missing = [n for n in self._files if n not in known]
        if missing or not all(f.closed for f in self._files.values()):
            raise ValueError(f"commit of unfinished files: {missing or 'some still open'}")
        return [{"name": n, "size": f.size, "sha256": known[n]} for n, f in self._files.items()]

    def adopt(self, entries: list[dict[str, Any]]) -> None:
        """List files that another process wrote into this stage (`listing` there): its
        closes made them durable, so the manifest may name them."""
        ours = set(self._files) | {e["name"] for e in self._adopted}
        for entry in entries:
            if entry["name"] in ours:
                raise ValueError(f"{entry['name']!r} was written twice into one checkpoint")
            ours.add(entry["name"])
            self._adopted.append(dict(entry))

    def create(self, name: str) -> Sink:
        """A new file of the checkpoint; its sha256 is the caller's to give at `commit`."""
        if not is_plain_file_name(name):
            raise InvalidName(f"cannot list {name!r} in a manifest: not a plain file name")
        counted = self._files[name] = _Counted(self._staged.create(name))
        return counted

    def write(self, name: str, data: bytes) -> None:
        """A whole file at once, hashed here."""
        sink = self.create(name)
        sink.write(data)
        sink.close()
        self._hashes[name] = hashlib.sha256(data).hexdigest()

    def commit(
        self,
        hashes: Mapping[str, str] | None = None,
        *,
        before_commit: Callable[[], None] | None = None,
        replace: bool = True,
        layout: str = FULL_LAYOUT,
    ) -> dict[str, Any]:
        """Write the manifest (every file closed, so durable), run `before_commit` (what it
        raises aborts the save), then make the checkpoint visible; return the manifest.
        `replace` False refuses a tag that exists (FileExistsError); `layout` is how its
        files hold the weights (`manifests.LAYOUTS`)."""
        if self.joined:  # before a manifest of this writer's files lands in the shared stage
            raise RuntimeError("only the process that staged a checkpoint commits it")
        manifest = build_manifest(self.listing(hashes or {}) + self._adopted, layout)
        sink = self._staged.create(MANIFEST_FILE)
        sink.write(manifest_bytes(manifest))
        sink.close()
        if before_commit is not None:
            before_commit()
        self._staged.commit(replace=replace)
        self.committed = True
        return manifest

    def abort(self) -> None:
        self._staged.abort()

    def __enter__(self) -> CheckpointWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.committed:
            self.abort()

"""The storage seam of the folder stores: what the checkpoint, export and dataset stores ask
of the place their entries live (docs/design/checkpoints.md, "Checkpoint store", "Storage").

A storage holds entries ``<experiment>/<tag>``, each a set of named files. It knows nothing
of manifests, latest or retention (that is `CheckpointStore`'s policy); it offers what the
policy needs and nothing more: list the committed entries, read a file without following a
link, write a new entry that becomes visible whole or not at all, delete one so that it is
never seen half removed, sweep what interrupted writers left, and the guard that protection
takes. `posix.PosixStorage` (a data dir's folders) and `s3.S3Storage` (a bucket,
TRAINCTL_STORAGE_URL) are the ones the service and the workers use, built in one place
(`factory.open_stores`); `memory.MemoryStorage` runs the store's tests a third time, which
shows that this protocol is all the store needs.

Like torchtitan's `CheckpointStorage`, callers never hold a local path of their own: a place
is described in words (`describe`) for messages, and a reader may offer a path only while it
is open (`Reader.local_path`), for libraries that must map a file.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self


class NotAFile(FileNotFoundError):
    """What a storage never reads as a file stands at its name (a link, a FIFO, a folder, a
    file with a second name): missing to every reader, and told apart where a message says
    which it is."""


class Reader(Protocol):
    """A regular file of an entry, open for reading: a binary file object that knows its
    size. Reads see the file that was opened, whatever happens to its name afterwards."""

    @property
    def size(self) -> int:
        """Its size in bytes when it was opened."""
        ...

    @property
    def local_path(self) -> str | None:
        """A path that opens this very file while the reader is open (POSIX: its open
        descriptor's entry under /proc), for libraries that map a file (safetensors) or
        serve one by path (Starlette's Range responses); None where the file is not local:
        read its bytes."""
        ...

    def read(self, size: int = -1, /) -> bytes: ...

    def seek(self, offset: int, whence: int = 0, /) -> int: ...

    def tell(self) -> int: ...

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> None: ...


class Sink(Protocol):
    """A new file of a staged entry, open for writing."""

    def write(self, data: bytes | bytearray | memoryview, /) -> int:
        """Write all of `data` (a short write is the sink's to finish) and return its length.
        The caller may reuse its buffer once this returns."""
        ...

    def close(self) -> None:
        """Finish the file: once this returns, its bytes are durable (POSIX: fsync)."""
        ...


class StagedEntry(Protocol):
    """A new entry being written, invisible until `commit`."""

    @property
    def key(self) -> str:
        """Which stage this is, in the storage's own words: what another process writing
        into the same entry passes to `Storage.join` (the ranks of a sharded save)."""
        ...

    def create(self, name: str) -> Sink:
        """A new file `name` of the entry; a name created twice is refused."""
        ...

    def commit(self, *, replace: bool = True) -> None:
        """Make the entry visible under its tag at once and whole, replacing an entry of that
        tag (atomically: a reader sees the old one or the new one), or, with `replace` False,
        raising FileExistsError when the tag exists. Every sink must be closed first."""
        ...

    def abort(self) -> None:
        """Remove whatever was written (a failed save frees its bytes at once); safe to call
        after a failed commit and more than once."""
        ...


class Files(Protocol):
    """The files of one place in a storage, read without following links."""

    def open(self, name: str) -> Reader:
        """The regular file `name`; FileNotFoundError for anything else (missing, or
        `NotAFile`: a link, a folder)."""
        ...

    def describe(self, name: str | None = None) -> str:
        """The place (or one of its files) in words, for messages and logs."""
        ...


Complete = Callable[[Files], bool]
"""Whether the files of an entry make a complete one (the store's manifest check): `cleanup`
asks it before it puts back an entry that an interrupted commit left aside."""


class Storage(Protocol):
    """A two-level store of entries ``<experiment>/<tag>`` holding named files.

    Names are the store's names (`store.names`): one path component, never hidden. Only
    committed entries are ever listed or opened; staging and trash are the storage's own.
    """

    def experiments(self) -> list[str]:
        """The experiments, sorted (one may hold no committed entry)."""
        ...

    def tags(self, experiment: str) -> list[str]:
        """The committed entries of an experiment, sorted, as of one moment: a commit that
        replaces a tag is never seen half done. [] for an experiment that is not there."""
        ...

    def exists(self, experiment: str, tag: str | None = None) -> bool:
        """Whether the experiment, or its committed entry `tag`, is there now."""
        ...

    def open(self, experiment: str, tag: str, name: str) -> Reader:
        """A file of a committed entry; FileNotFoundError as `Files.open`."""
        ...

    def reading(self, experiment: str) -> AbstractContextManager[None]:
        """Hold the experiment still while several of its files are read: no commit or
        delete swaps its entries until the context ends (never take `guard` inside it)."""
        ...

    def committed_at(self, experiment: str, tag: str) -> float | None:
        """When the entry was committed (POSIX: its manifest's mtime), as a Unix time; None
        when it is gone."""
        ...

    def stage(self, experiment: str, tag: str) -> StagedEntry:
        """A new entry to write; it becomes `tag` at its commit."""
        ...

    def join(self, experiment: str, tag: str, key: str) -> StagedEntry:
        """The stage `key` (its `StagedEntry.key`) that another process owns, to write more
        files into: the ranks of a sharded save each write their own shards into the one
        entry. Its `commit` is refused (only the owner commits, once every process is done)
        and its `abort` releases only what it created (the owner's abort removes the rest).
        FileNotFoundError when no such stage is in progress."""
        ...

    def adopt(self, experiment: str, tag: str, folder: Path) -> bool:
        """Commit a finished folder of this machine as the entry `tag`, moving it as it is,
        where the storage can (POSIX, on the folder's filesystem: one rename; the folder's
        own last file is its commit marker), and True; FileExistsError when the tag is
        taken. False where it cannot (S3, memory): write the files through `stage`. What
        `DatasetStore.publish` asks first: a prepare publishes its folder in place
        (docs/design/data.md, "Datasets")."""
        ...

    def delete(self, experiment: str, tag: str) -> bool:
        """Remove an entry: gone from listings at once, never seen half removed. False when
        it was not there (someone else removed it first)."""
        ...

    def cleanup(self, experiment: str | None, complete: Complete) -> list[tuple[str, str]]:
        """Remove what interrupted stages and deletes left, and put back an entry whose
        replacing commit was cut short when `complete` says it is whole and its tag is
        free. Only at start, before writers run: a stage in progress would go too. Returns
        what it removed or restored: (experiment, the storage's own name for it)."""
        ...

    def url(self, experiment: str, tag: str, name: str, expires: int) -> str | None:
        """A URL that serves the file of a committed entry to whoever holds it, for
        `expires` seconds, straight from where it lives (S3: a presigned GET of the very
        object the entry's manifest names, so a replace meanwhile cannot mix two saves);
        None where the storage serves no file itself (POSIX, memory): read it. The URL is a
        credential for its lifetime: never log it."""
        ...

    def guard(self, experiment: str) -> AbstractContextManager[None]:
        """The experiment's guard (docs/design/checkpoints.md, "Protection"): exclusive across the
        processes and nodes that share the storage, re-entrant within a thread."""
        ...

    def describe(
        self, experiment: str | None = None, tag: str | None = None, name: str | None = None
    ) -> str:
        """The storage, an experiment, an entry or a file, in words, for messages."""
        ...


@dataclass(frozen=True)
class Entry:
    """The files of one committed entry (`Files`), for readers that check and load them."""

    storage: Storage
    experiment: str
    tag: str

    def open(self, name: str) -> Reader:
        return self.storage.open(self.experiment, self.tag, name)

    def describe(self, name: str | None = None) -> str:
        return self.storage.describe(self.experiment, self.tag, name)

"""A checkpoint as a tar stream, produced chunk by chunk (docs/design/checkpoints.md, "Checkpoint
store").

Weights can be many GB, so the tar is never built in memory or on disk. `tarfile`'s own
writer (even in stream mode ``w|``) copies a whole member in one `addfile` call, which a
generator cannot interleave with sending; so we use `tarfile` for what it is good at, the
member headers (`TarInfo.tobuf`), and stream each file's bytes between them. The result is a
plain POSIX (pax) tar that `tarfile` and `tar` read, and its length is known up front, so
clients get a Content-Length and can show progress.
"""

from __future__ import annotations

import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

from trainctl.store.checkpoints.consolidate import ConsolidatedModel
from trainctl.store.checkpoints.info import CheckpointInfo
from trainctl.store.checkpoints.manifests import MANIFEST_FILE, MODEL_FILE, file_size
from trainctl.store.checkpoints.storage import Files, Reader
from trainctl.store.exceptions import CheckpointCorrupt, CheckpointNotFound

CHUNK = 1 << 20
BLOCK = tarfile.BLOCKSIZE
RECORD = tarfile.RECORDSIZE


@dataclass(frozen=True)
class Member:
    header: bytes
    size: int
    chunks: Callable[[], Iterator[bytes]]
    """Exactly `size` bytes: a file of the checkpoint, or its stitched model file."""


@dataclass(frozen=True)
class TarStream:
    members: list[Member]
    filename: str

    @property
    def size(self) -> int:
        body = sum(len(m.header) + _padded(m.size) for m in self.members) + 2 * BLOCK
        return _padded(body, RECORD)

    def __iter__(self) -> Iterator[bytes]:
        written = 0
        for member in self.members:
            yield member.header
            yield from member.chunks()
            yield b"\0" * (_padded(member.size) - member.size)
            written += len(member.header) + _padded(member.size)
        end = 2 * BLOCK
        yield b"\0" * (_padded(written + end, RECORD) - written)


def checkpoint_tar(
    info: CheckpointInfo, files: Files, model: ConsolidatedModel | None = None
) -> TarStream:
    """Members ``<tag>/<file>`` for every file the manifest lists, then the manifest itself;
    `files` are the checkpoint's, as the store reads them (`CheckpointStore.entry`). A
    sharded checkpoint's `model` (`CheckpointStore.consolidated`) comes first, as the
    model.safetensors a whole checkpoint holds, stitched as it is sent."""
    listed = [(f["name"], int(f["size"])) for f in info.files]
    listed.append((MANIFEST_FILE, _size(info, files, MANIFEST_FILE)))
    mtime = int(time.time())
    members = [
        Member(_header(f"{info.tag}/{name}", size, mtime), size,
               partial(_file_chunks, files, name, size))
        for name, size in listed
    ]  # fmt: skip
    if model is not None:
        header = _header(f"{info.tag}/{MODEL_FILE}", model.size, mtime)
        members.insert(0, Member(header, model.size, model.chunks))
    return TarStream(members, filename=f"{info.experiment}-{info.tag}.tar")


def _header(name: str, size: int, mtime: int) -> bytes:
    member = tarfile.TarInfo(name)
    member.size, member.mtime, member.mode = size, mtime, 0o644
    return member.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")


def _size(info: CheckpointInfo, files: Files, name: str) -> int:
    try:
        return file_size(files, name)
    except FileNotFoundError:
        raise CheckpointNotFound(
            f"checkpoint {info.experiment}/{info.tag} changed while it was being archived"
        ) from None


def _file_chunks(files: Files, name: str, size: int) -> Iterator[bytes]:
    """Exactly `size` bytes of the file: the header already promised that many. Opened
    without following links, like every read of the store."""
    with files.open(name) as f:
        yield from reader_chunks(f, size, files.describe(name))


def reader_chunks(f: Reader, size: int, what: str) -> Iterator[bytes]:
    """Exactly `size` bytes of `f`, in chunks; a file that shrank fails the stream: the
    response has started, so its status cannot change, and the client sees a truncated
    download rather than a wrong one."""
    remaining = size
    while remaining:
        chunk = f.read(min(CHUNK, remaining))
        if not chunk:
            raise CheckpointCorrupt(f"{what} shrank while it was being sent")
        remaining -= len(chunk)
        yield chunk


def _padded(size: int, unit: int = BLOCK) -> int:
    return -(-size // unit) * unit

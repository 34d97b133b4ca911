"""A write-only file that sha256-hashes its bytes as they go to disk, for checkpoint saves.

Hashing what was written by reading it back costs a second pass over every byte, after the
write. Here each large chunk is hashed by a helper thread while the calling thread copies the
same bytes into the file (hashlib and the write syscall both release the GIL), so a save
takes about as long as the slower of the two instead of their sum. The kernel is also asked
to start writing each chunk to disk at once (Linux `sync_file_range`), so the fsync that
makes the file durable finds little left to do.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
from concurrent.futures import Executor
from pathlib import Path
from types import TracebackType
from typing import Any

# Chunks at least this large are hashed beside the write; smaller ones (pickle opcodes, zip
# headers) are gathered into a buffer first, where thread hand-offs would cost more.
PARALLEL_MIN = 4 << 20
_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start write-out of dirty pages, do not wait


def _load_sync_file_range() -> Any:
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):  # not Linux: the final fsync does all the work
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _load_sync_file_range()


class HashedFile:
    """`write` bytes to a new file; `close` fsyncs it; `hexdigest` is the sha256 of it all.

    `pool` runs the hashing of large chunks; it must have a thread to spare. A chunk passed
    to `write` is done with (written and hashed) when `write` returns, so callers may reuse
    their buffers, as torch.save does.
    """

    def __init__(self, path: str | Path, pool: Executor) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        self._pool = pool
        self._digest = hashlib.sha256()
        self._buffer = bytearray()
        self._offset = 0  # bytes handed to the kernel so far
        self._flushed = 0  # bytes whose write-out has been started

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        size = view.nbytes
        if size < PARALLEL_MIN:
            self._buffer += view
            if len(self._buffer) >= PARALLEL_MIN:
                self._drain()
            return size
        self._drain()
        hashing = self._pool.submit(self._digest.update, view)
        try:
            self._write_all(view)
        finally:
            hashing.result()  # also when the write failed: the view must outlive the hashing
        return size

    def flush(self) -> None:
        """Nothing to do: `close` writes the buffer out (torch.save calls this)."""

    def tell(self) -> int:
        return self._offset + len(self._buffer)

    def hexdigest(self) -> str:
        return self._digest.hexdigest()

    def close(self) -> None:
        """Write what is buffered, fsync and close. Raises what the disk reports (ENOSPC)."""
        if self._fd < 0:
            return
        try:
            self._drain()
            os.fsync(self._fd)
        finally:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> HashedFile:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        elif self._fd >= 0:  # the save failed: just release the descriptor
            os.close(self._fd)
            self._fd = -1

    def _drain(self) -> None:
        if self._buffer:
            self._digest.update(self._buffer)
            self._write_all(memoryview(self._buffer))
            self._buffer = bytearray()

    def _write_all(self, view: memoryview) -> None:
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
            self._offset += written
        if _sync_file_range is not None and self._offset - self._flushed >= PARALLEL_MIN:
            # Advisory: an error here (EIO, ENOSPC) is reported again by the fsync in close.
            _sync_file_range(self._fd, self._flushed, self._offset - self._flushed,
                             _SYNC_FILE_RANGE_WRITE)  # fmt: skip
            self._flushed = self._offset

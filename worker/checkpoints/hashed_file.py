"""A write-only file that sha256-hashes its bytes as they go out, for checkpoint saves.

Hashing what was written by reading it back costs a second pass over every byte, after the
write. Here each large chunk is hashed by a helper thread while the calling thread hands the
same bytes to the sink (hashlib and the write syscall both release the GIL), so a save takes
about as long as the slower of the two instead of their sum. Where the bytes go, and how they
are made durable, is the sink's business: a staged entry of the checkpoint store gives it
(`store.checkpoints.storage.Sink`; on POSIX it starts the write-out of each chunk at once and
fsyncs at close).
"""

from __future__ import annotations

import hashlib
from concurrent.futures import Executor
from types import TracebackType
from typing import Any

from trainctl.store.checkpoints.storage import Sink

# Chunks at least this large are hashed beside the write; smaller ones (pickle opcodes, zip
# headers) are gathered into a buffer first, where thread hand-offs would cost more.
PARALLEL_MIN = 4 << 20


class HashedFile:
    """`write` bytes to `sink`; `close` closes it; `hexdigest` is the sha256 of it all.

    `pool` runs the hashing of large chunks; it must have a thread to spare. A chunk passed
    to `write` is done with (written and hashed) when `write` returns, so callers may reuse
    their buffers, as torch.save does. When the writing fails the sink is left as it is: the
    stage it belongs to is aborted, which releases it.
    """

    def __init__(self, sink: Sink, pool: Executor) -> None:
        self._sink = sink
        self._pool = pool
        self._digest = hashlib.sha256()
        self._buffer = bytearray()
        self._offset = 0  # bytes handed to the sink so far
        self._closed = False

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
        """Write what is buffered and close the sink. Raises what the disk reports (ENOSPC)."""
        if self._closed:
            return
        self._drain()
        self._closed = True
        self._sink.close()

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

    def _drain(self) -> None:
        if self._buffer:
            self._digest.update(self._buffer)
            self._write_all(memoryview(self._buffer))
            self._buffer = bytearray()

    def _write_all(self, view: memoryview) -> None:
        self._offset += self._sink.write(view)

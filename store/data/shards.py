"""Token data on disk, without torch: `.bin` shards (the llm.c / modded-nanogpt format) and
text files read as byte-level tokens (docs/design/data.md, "Datasets").

The CLI writes shards (`trainctl data prepare`) and the API checks data paths, neither of which
may import torch; the worker reads the same formats through `worker.data.loader`. Every file is
opened as `store.files.open_regular` opens it: a FIFO or a device put where a shard or a text
file was at submit fails the run, naming it, instead of blocking it for good.
"""

from __future__ import annotations

import io
import os
import sysconfig
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from trainctl.store.files import open_regular

SHARD_MAGIC = 20240520
# Version 1 is llm.c's: uint16 tokens (its fineweb.py GPT-2 shards read as they are).
# Version 2 holds uint32 tokens, for vocabularies above 65,536.
SHARD_DTYPES: dict[int, np.dtype[np.unsignedinteger[Any]]] = {
    1: np.dtype(np.uint16),
    2: np.dtype(np.uint32),
}
SHARD_VERSION = 1
SHARD_HEADER_INTS = 256
SHARD_HEADER_BYTES = SHARD_HEADER_INTS * 4
BYTE_VOCAB = 256


class DataError(ValueError):
    """Training data that cannot be used as given."""


@contextmanager
def open_data(path: str | Path) -> Iterator[io.BufferedReader]:
    """A data file for reading: a regular file, opened without blocking (`store.files`);
    DataError naming it for anything else, or one that cannot be read."""
    try:
        f = open_regular(path)
    except OSError as exc:
        raise DataError(f"{path}: {exc.strerror or exc}") from None
    with f:
        yield f


# --- token shards (llm.c / modded-nanogpt .bin format) ----------------------------------


def write_shard(
    path: str | Path, tokens: np.ndarray | Sequence[int], dtype: str = "uint16"
) -> None:
    """Write tokens with the 256-int32 header (magic, version, token count): version 1 for
    uint16 tokens, 2 for uint32."""
    with ShardWriter(path, dtype) as shard:
        shard.append(np.asarray(tokens))


class ShardWriter:
    """One shard written as tokens arrive, so a prepare holds a batch, never a whole shard.

    The header's count is written when the shard is closed; until then the tokens go to
    `<path>.tmp`, which is fsynced and renamed to `path` at close. A writer left by an error
    (`abort`, or leaving the `with` block by an exception) removes its tmp file.
    """

    def __init__(self, path: str | Path, dtype: str = "uint16") -> None:
        self.path = Path(path)
        self.tmp = Path(f"{path}.tmp")
        self.version = next(v for v, t in SHARD_DTYPES.items() if t == np.dtype(dtype))
        self.dtype = SHARD_DTYPES[self.version]
        self.limit = int(np.iinfo(self.dtype).max)
        self.count = 0
        # "x": nothing already at its name (a planted link) is opened, let alone written
        self.file = open(self.tmp, "xb")  # noqa: SIM115 (closed by close or abort)
        self.file.write(bytes(SHARD_HEADER_BYTES))

    def append(self, tokens: np.ndarray) -> None:
        if tokens.size and (tokens.min() < 0 or tokens.max() > self.limit):
            raise DataError(f"shard tokens must fit in {self.dtype} (0..{self.limit})")
        self.file.write(np.ascontiguousarray(tokens, dtype=self.dtype).data)
        self.count += tokens.size

    def close(self) -> None:
        header = np.zeros(SHARD_HEADER_INTS, dtype=np.int32)
        header[:3] = (SHARD_MAGIC, self.version, self.count)
        self.file.seek(0)
        self.file.write(header.tobytes())
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self.file.close()
        self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def read_shard(path: str | Path) -> np.ndarray:
    """Memory-map a shard's tokens after checking its header against the file size: the
    file that was opened and checked, whatever its name points to later."""
    path = Path(path)
    with open_data(path) as f:
        size = os.fstat(f.fileno()).st_size
        dtype, count = shard_header(f.read(SHARD_HEADER_BYTES), size, str(path))
        return np.memmap(f, dtype=dtype, mode="r", offset=SHARD_HEADER_BYTES, shape=(count,))


def shard_header(
    header: bytes, size: int, name: str
) -> tuple[np.dtype[np.unsignedinteger[Any]], int]:
    """(token dtype, token count) of a shard whose first bytes are `header` and whose file
    has `size` bytes; DataError naming `name` when it is not a shard this reads. The one
    check of a shard: the worker's before it reads one, submit's before it queues a run."""
    if size < SHARD_HEADER_BYTES or len(header) < SHARD_HEADER_BYTES:
        raise DataError(f"{name}: {size} bytes is too short for a token shard header")
    magic, version, count = (int(v) for v in np.frombuffer(header, dtype=np.int32, count=3))
    if magic != SHARD_MAGIC:
        raise DataError(f"{name}: bad magic {magic}, expected {SHARD_MAGIC} (not a .bin shard)")
    if version not in SHARD_DTYPES:
        raise DataError(
            f"{name}: unsupported shard version {version}, expected one of {sorted(SHARD_DTYPES)}"
        )
    dtype = SHARD_DTYPES[version]
    expected = SHARD_HEADER_BYTES + dtype.itemsize * count
    if count < 0 or size != expected:
        raise DataError(
            f"{name}: header says {count} tokens ({expected} bytes) but the file has {size} bytes"
        )
    return dtype, count


# --- text as byte-level tokens -----------------------------------------------------------


def read_text_bytes(paths: Iterable[str | Path], max_bytes: int | None = None) -> np.ndarray:
    """Concatenate files as bytes (token = byte value), in the given order; at most
    `max_bytes` of them are read."""
    chunks, total = [], 0
    for p in paths:
        with open_data(p) as f:
            data = f.read() if max_bytes is None else f.read(max_bytes - total)
        chunks.append(np.frombuffer(data, dtype=np.uint8))
        total += len(data)
        if max_bytes is not None and total >= max_bytes:
            break
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.uint8)


def stdlib_source_files() -> list[Path]:
    """The Python standard library's own .py files: real text that every machine has."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = ("site-packages", "test", "tests", "idlelib", "__pycache__")
    files = [p for p in root.rglob("*.py") if not any(part in skip for part in p.parts)]
    return sorted(files)


def expand_paths(patterns: Sequence[str]) -> list[Path]:
    """Expand globs in order; a pattern that matches nothing is an error, not an empty run.

    A plan's paths are the files submit expanded (`store.data.paths`), each taken as it is,
    even when its name holds a glob character. Anything else is expanded within the bounds of
    a submit, without following links to folders (`store.data.walk`)."""
    from trainctl.store.data.walk import EXPAND_SECONDS, MAX_FILES, Bounds, files_under, glob_paths

    bounds = Bounds(max_files=MAX_FILES, seconds=EXPAND_SECONDS)
    out: list[Path] = []
    for pattern in patterns:
        matches = [pattern] if os.path.lexists(pattern) else glob_paths(pattern, bounds)
        found = [Path(f) for m in sorted(matches, key=Path) for f in files_under(m, bounds)]
        if not found:
            raise DataError(f"no files match {pattern!r}")
        out.extend(found)
    return out

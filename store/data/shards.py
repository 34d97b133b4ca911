"""Token data on disk, without torch: `.bin` shards (the llm.c / modded-nanogpt format) and
text files read as byte-level tokens.

The CLI writes shards (`trainctl data prepare`) and the API checks data paths, neither of which
may import torch; the worker reads the same formats through `worker.data`.
"""

from __future__ import annotations

import glob
import os
import sysconfig
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

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
        self.file = open(self.tmp, "wb")  # noqa: SIM115 (closed by close or abort)
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
    """Memory-map a shard's tokens after checking its header against the file size."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        header = f.read(SHARD_HEADER_BYTES)
    dtype, count = shard_header(header, size, str(path))
    return np.memmap(path, dtype=dtype, mode="r", offset=SHARD_HEADER_BYTES, shape=(count,))


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
    """Concatenate files as bytes (token = byte value), in the given order."""
    chunks, total = [], 0
    for p in paths:
        data = Path(p).read_bytes()
        if max_bytes is not None:
            data = data[: max_bytes - total]
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
    """Expand globs in order; a pattern that matches nothing is an error, not an empty run."""
    out: list[Path] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern, recursive=True))
        if not matches:
            raise DataError(f"no files match {pattern!r}")
        for m in matches:
            p = Path(m)
            out.extend(sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p])
    return out

"""Text files → byte-level `.bin` token shards with a val split (`trainctl data prepare`).

The shards are the llm.c format the worker reads (`store.tokens`); a token is a byte, which
fits every model preset's vocabulary. The validation split is the tail of the concatenated
text, like `data.val_fraction` in a train spec, so the two never overlap.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainctl.store.tokens import DataError, write_shard

READ_BYTES = 1 << 24


@dataclass
class Shard:
    path: Path
    split: str
    tokens: int


class ShardWriter:
    """Buffers tokens and writes `<split>_<NNNNNN>.bin` files of `shard_tokens` each."""

    def __init__(self, out: Path, split: str, shard_tokens: int) -> None:
        self.out, self.split, self.shard_tokens = out, split, shard_tokens
        self.buffer: list[np.ndarray] = []
        self.buffered = 0
        self.written: list[Shard] = []

    def add(self, tokens: np.ndarray) -> None:
        while tokens.size:
            take = tokens[: self.shard_tokens - self.buffered]
            self.buffer.append(take)
            self.buffered += take.size
            tokens = tokens[take.size :]
            if self.buffered == self.shard_tokens:
                self.flush()

    def flush(self) -> None:
        if not self.buffered:
            return
        path = self.out / f"{self.split}_{len(self.written):06d}.bin"
        write_shard(path, np.concatenate(self.buffer))
        self.written.append(Shard(path, self.split, self.buffered))
        self.buffer, self.buffered = [], 0


def text_files(inputs: list[Path], pattern: str) -> list[Path]:
    """Files as given, and the files under folders that match `pattern` (hidden ones skipped)."""
    files: list[Path] = []
    for p in inputs:
        if p.is_dir():
            found = sorted(f for f in p.rglob(pattern) if f.is_file())
            files += [
                f for f in found if not any(s.startswith(".") for s in f.relative_to(p).parts)
            ]
        elif p.is_file():
            files.append(p)
        else:
            raise DataError(f"{p}: no such file or folder")
    if not files:
        raise DataError(f"no files matching {pattern!r} in {', '.join(map(str, inputs))}")
    return files


def read_chunks(files: list[Path]) -> Iterator[np.ndarray]:
    for f in files:
        with open(f, "rb") as src:
            while chunk := src.read(READ_BYTES):
                yield np.frombuffer(chunk, dtype=np.uint8).astype(np.uint16)


def prepare_shards(
    inputs: list[Path], out: Path, val_fraction: float, shard_tokens: int, pattern: str = "*"
) -> list[Shard]:
    files = text_files(inputs, pattern)
    total = sum(f.stat().st_size for f in files)
    n_val = round(total * val_fraction)
    if total == 0 or (val_fraction > 0 and not 0 < n_val < total):
        raise DataError(f"{total} bytes cannot be split {1 - val_fraction:.0%}/{val_fraction:.0%}")
    out.mkdir(parents=True, exist_ok=True)
    train, val = ShardWriter(out, "train", shard_tokens), ShardWriter(out, "val", shard_tokens)
    seen = 0
    for chunk in read_chunks(files):
        cut = max(0, min(chunk.size, total - n_val - seen))
        train.add(chunk[:cut])
        val.add(chunk[cut:])
        seen += chunk.size
    train.flush()
    val.flush()
    return train.written + val.written

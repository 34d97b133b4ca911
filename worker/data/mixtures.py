"""Data mixtures on the worker (docs/design/data.md, "Data mixtures"): which dataset each
training sequence comes from, and a mixture's batches.

The dataset of global sequence g (micro-batch position p holds sequences p·B to p·B + B - 1)
is a pure function of (seed, g): `choose_sources` hashes the two (SplitMix64: the seed's own
stream, at counter g) to a uniform u in [0, 1) and takes the dataset whose slice of the
normalised cumulative weights holds u, so each dataset's share is binomial around its weight.
Each dataset is read on from its own position, the sequences taken from it so far; its k-th is
a window of its own seeded order (a one-row `TokenSampler`, `source_seed`). Its position at
micro-batch p is its position at the anchor (the checkpoint a run resumes or forks from, or
its start) plus its count of sequences since: counted, not stored, so the prefetch thread, the
trainer and every rank of a multi-process run agree without talking.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from trainctl.worker.data.loader import Batch, TokenSampler

SPLITMIX_GAMMA = np.uint64(0x9E3779B97F4A7C15)
COUNT_CHUNK = 1 << 20
"""Sequences hashed at a time when counting: bounds the memory of a long count."""


def _mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, elementwise (uint64 arithmetic wraps, as it should)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def cumulative(weights: Sequence[float]) -> np.ndarray:
    """The weights' normalised cumulative sums, the last exactly 1."""
    cum = np.cumsum(np.asarray(weights, dtype=np.float64))
    cum /= cum[-1]
    cum[-1] = 1.0
    return cum


def choose_sources(seed: int, first: int, count: int, cum: np.ndarray) -> np.ndarray:
    """The dataset (an index into the weights) of global sequences first ... first+count-1."""
    g = np.arange(first, first + count, dtype=np.uint64)
    state = _mix64(np.array([seed], dtype=np.uint64))
    u = (_mix64(state + (g + np.uint64(1)) * SPLITMIX_GAMMA) >> np.uint64(11)) * 2.0**-53
    return np.searchsorted(cum, u, side="right")


def count_sources(seed: int, first: int, count: int, cum: np.ndarray) -> np.ndarray:
    """How many of global sequences first ... first+count-1 each dataset gives."""
    counts = np.zeros(len(cum), dtype=np.int64)
    for start in range(first, first + count, COUNT_CHUNK):
        chosen = choose_sources(seed, start, min(COUNT_CHUNK, first + count - start), cum)
        counts += np.bincount(chosen, minlength=len(cum))
    return counts


def source_seed(seed: int, folder: str) -> int:
    """The seed of a dataset's own order of windows: the run's data seed and the dataset, so
    a fork that keeps a dataset (by folder) reads on in the same order at any index."""
    digest = hashlib.sha256(f"{seed}\0{folder}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class MixtureSampler:
    """Batches of a mixture by position, with the (seed, position) contract of `TokenSampler`
    from its anchor on: `start_at` sets where each dataset is at a micro-batch position."""

    def __init__(
        self, sources: Sequence[TokenSampler], weights: Sequence[float], batch_size: int, seed: int
    ) -> None:
        assert all(s.batch_size == 1 for s in sources), "a dataset gives one window at a time"
        self.sources, self.cum = list(sources), cumulative(weights)
        self.batch_size, self.seed = batch_size, seed
        self.start_at(0, [0] * len(sources))

    def start_at(self, position: int, sequences: Sequence[int]) -> None:
        """Each dataset has given `sequences[i]` sequences before micro-batch `position`."""
        self._anchor = (position, np.asarray(sequences, dtype=np.int64))
        # One cursor per thread (the prefetcher's, the trainer's), each moving forward.
        self._cursor = threading.local()

    def choices(self, position: int) -> np.ndarray:
        return choose_sources(self.seed, position * self.batch_size, self.batch_size, self.cum)

    def sequences_at(self, position: int) -> np.ndarray:
        """Each dataset's position within itself before micro-batch `position`."""
        anchor, at_anchor = self._anchor
        if position < anchor:
            raise ValueError(f"position {position} is before the mixture's start, {anchor}")
        at, seen = getattr(self._cursor, "at", (anchor, at_anchor))
        if position < at:
            at, seen = anchor, at_anchor
        B = self.batch_size
        seen = seen + count_sources(self.seed, at * B, (position - at) * B, self.cum)
        self._cursor.at = (position, seen)
        return seen.copy()

    def batch(self, position: int) -> Batch:
        seen = self.sequences_at(position)
        tokens, targets = [], []
        for source in self.choices(position):
            x, y = self.sources[source].batch(int(seen[source]))  # (1, T) each
            seen[source] += 1
            tokens.append(x)
            targets.append(y)
        return torch.cat(tokens), torch.cat(targets)  # (B, T)

    def iterate(self, start: int = 0) -> Iterator[Batch]:
        position = start
        while True:
            yield self.batch(position)
            position += 1

    def max_token(self) -> int:
        return max(s.max_token() for s in self.sources)

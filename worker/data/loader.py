"""Training data: synthetic tokens, `.bin` token shards, byte-level text, and a loader that
prefetches in a background thread.

A batch is a pure function of (seed, position): `TokenSampler.batch(position)` draws its
window offsets from an RNG seeded with both. A run records how many batches it consumed, and
resuming at that position continues with exactly the batches the interrupted run would have
seen, however far the prefetcher had read ahead.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from trainctl.store.data.shards import (  # the on-disk formats live in store/, without torch
    SHARD_HEADER_BYTES,
    SHARD_HEADER_INTS,
    SHARD_MAGIC,
    SHARD_VERSION,
    DataError,
    expand_paths,
    read_shard,
    read_text_bytes,
    stdlib_source_files,
    write_shard,
)

__all__ = [
    "SHARD_HEADER_BYTES",
    "SHARD_HEADER_INTS",
    "SHARD_MAGIC",
    "SHARD_VERSION",
    "AsyncDataLoader",
    "Batch",
    "DataError",
    "SyntheticSampler",
    "TokenSampler",
    "expand_paths",
    "generate_synthetic_batch",
    "read_shard",
    "read_text_bytes",
    "split_holdout",
    "stdlib_source_files",
    "write_shard",
]

Batch = tuple[torch.Tensor, torch.Tensor]


class Sampler(Protocol):
    """Batches by position: a batch is a pure function of (seed, position), which exact
    resume needs; `iterate` yields them from `start` on."""

    def batch(self, position: int) -> Batch: ...
    def iterate(self, start: int = 0) -> Any: ...


# --- synthetic data (seed behaviour) ---------------------------------------------------


def generate_synthetic_batch(
    batch_size: int,
    seq_len: int,
    vocab_size: int,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
) -> Batch:
    """Uniform random (tokens, targets) in [0, vocab_size), for validation without data."""
    tokens = torch.randint(0, vocab_size, (batch_size, seq_len), generator=generator)
    targets = torch.randint(0, vocab_size, (batch_size, seq_len), generator=generator)
    return tokens.to(device), targets.to(device)


# --- sampling ---------------------------------------------------------------------------


class TokenSampler:
    """Random windows of `seq_len + 1` tokens from one or more 1-D token arrays.

    `batch(position)` depends only on (seed, position), so it is resumable and the same
    whether it is called from a prefetch thread or inline.
    """

    def __init__(
        self, arrays: Sequence[np.ndarray], batch_size: int, seq_len: int, seed: int = 0
    ) -> None:
        self.arrays = [a for a in arrays if len(a) > seq_len + 1]
        if not self.arrays:
            raise DataError(
                f"no token array is longer than seq_len + 1 = {seq_len + 1} tokens; "
                "add data or lower seq_len"
            )
        self.batch_size, self.seq_len, self.seed = batch_size, seq_len, seed
        spans = np.array([len(a) - seq_len - 1 for a in self.arrays], dtype=np.int64)
        self._cum = np.cumsum(spans)

    @property
    def num_tokens(self) -> int:
        return int(sum(len(a) for a in self.arrays))

    def max_token(self) -> int:
        return int(max(int(a.max()) for a in self.arrays))

    def batch(self, position: int) -> Batch:
        rng = np.random.default_rng([self.seed, position])
        starts = rng.integers(0, int(self._cum[-1]), size=self.batch_size)
        which = np.searchsorted(self._cum, starts, side="right")
        rows = []
        for w, s in zip(which, starts, strict=True):
            offset = int(s - (self._cum[w - 1] if w else 0))
            rows.append(np.asarray(self.arrays[w][offset : offset + self.seq_len + 1]))
        window = torch.from_numpy(np.stack(rows).astype(np.int64))  # (B, T+1)
        return window[:, :-1], window[:, 1:]

    def iterate(self, start: int = 0) -> Iterator[Batch]:
        position = start
        while True:
            yield self.batch(position)
            position += 1


def split_holdout(array: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """The last `val_fraction` of a token stream is held out for validation."""
    if not 0.0 < val_fraction < 1.0:
        raise DataError(f"val_fraction must be in (0, 1), got {val_fraction}")
    cut = int(len(array) * (1.0 - val_fraction))
    return array[:cut], array[cut:]


# --- async prefetching loader ------------------------------------------------------------

_DONE = object()


class _ProducerError:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class AsyncDataLoader:
    """Prefetches batches from `data_iter` in a background thread into a bounded queue.

    On CUDA, batches are pinned in the producer and copied with non_blocking=True in the
    consumer, so the host-to-device copy overlaps compute. A producer exception is re-raised
    in the consumer; `close()` stops and joins the thread. `produced`/`consumed` count batches,
    which is what the tests use to show that prefetching really happens.
    """

    def __init__(
        self,
        data_iter: Iterable[Batch],
        device: torch.device | str = "cpu",
        prefetch_factor: int = 2,
        num_workers: int = 1,
        pin_memory: bool | None = None,
        batch_size: int | None = None,
        seq_len: int | None = None,
        vocab_size: int | None = None,
    ) -> None:
        if prefetch_factor < 1:
            raise ValueError(f"prefetch_factor must be >= 1, got {prefetch_factor}")
        if num_workers != 1:
            # One producer keeps batch order identical to the sampler's positions, which
            # exact resume relies on; batch assembly is cheap next to a training step.
            raise ValueError("AsyncDataLoader supports num_workers=1 only")
        self.data_iter = iter(data_iter)
        self.device = torch.device(device)
        self.prefetch_factor, self.num_workers = prefetch_factor, num_workers
        self.pin_memory = self.device.type == "cuda" if pin_memory is None else pin_memory
        self.batch_size, self.seq_len, self.vocab_size = batch_size, seq_len, vocab_size
        self.produced = 0
        self.consumed = 0
        self.wait_seconds = 0.0
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=prefetch_factor)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, name="trainctl-prefetch", daemon=True)
        self._thread.start()

    def _produce(self) -> None:
        try:
            for tokens, targets in self.data_iter:
                if self.pin_memory and tokens.device.type == "cpu":
                    tokens, targets = tokens.pin_memory(), targets.pin_memory()
                if not self._put((tokens, targets)):
                    return
                self.produced += 1
            self._put(_DONE)
        except BaseException as exc:  # re-raised in the consumer, never swallowed
            self._put(_ProducerError(exc))

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> AsyncDataLoader:
        return self

    def __next__(self) -> Batch:
        started = time.perf_counter()
        item = self._queue.get()
        self.wait_seconds += time.perf_counter() - started
        if item is _DONE:
            self._queue.put(_DONE)  # stay exhausted on further calls
            raise StopIteration
        if isinstance(item, _ProducerError):
            self._queue.put(item)
            raise RuntimeError(f"data loader producer failed: {item.exc}") from item.exc
        tokens, targets = item
        self.consumed += 1
        nb = self.device.type == "cuda"
        return tokens.to(self.device, non_blocking=nb), targets.to(self.device, non_blocking=nb)

    def close(self) -> None:
        self._stop.set()
        while True:  # unblock a producer waiting on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout=10)
        if self._thread.is_alive():
            raise RuntimeError("data loader producer thread did not stop")

    def __enter__(self) -> AsyncDataLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def benchmark(self, num_batches: int) -> dict[str, float]:
        """Consume `num_batches` and report the delivery rate."""
        started = time.perf_counter()
        tokens = 0
        for _ in range(num_batches):
            x, _y = next(self)
            tokens += x.numel()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elapsed = time.perf_counter() - started
        return {
            "batches_per_sec": num_batches / elapsed,
            "tokens_per_sec": tokens / elapsed,
            "elapsed_sec": elapsed,
        }


class SyntheticSampler:
    """Uniform random tokens with the same (seed, position) contract as `TokenSampler`."""

    def __init__(self, batch_size: int, seq_len: int, vocab_size: int, seed: int = 0) -> None:
        self.batch_size, self.seq_len, self.vocab_size, self.seed = (
            batch_size,
            seq_len,
            vocab_size,
            seed,
        )

    def batch(self, position: int) -> Batch:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + position)
        return generate_synthetic_batch(self.batch_size, self.seq_len, self.vocab_size, generator=g)

    def iterate(self, start: int = 0) -> Iterator[Batch]:
        position = start
        while True:
            yield self.batch(position)
            position += 1

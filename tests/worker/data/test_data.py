from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support.polling import poll
from trainctl.worker.data.loader import (
    AsyncDataLoader,
    Batch,
    DataError,
    SyntheticSampler,
    TokenSampler,
    generate_synthetic_batch,
    read_shard,
    read_text_bytes,
    stdlib_source_files,
    write_shard,
)


def test_shard_round_trip_keeps_a_64k_vocabulary(tmp_path: Path) -> None:
    tokens = np.array([0, 1, 63_999, 65_535, 42], dtype=np.int64)
    write_shard(tmp_path / "a.bin", tokens)
    assert read_shard(tmp_path / "a.bin").tolist() == tokens.tolist()


def header(magic: int = 20240520, version: int = 1, count: int = 3) -> bytes:
    h = np.zeros(256, dtype=np.int32)
    h[:3] = (magic, version, count)
    return h.tobytes()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (header(magic=1) + b"\0" * 6, "bad magic 1"),
        (header(version=7) + b"\0" * 6, "unsupported shard version 7"),
        (header(count=5) + b"\0" * 6, "header says 5 tokens"),
        (b"\0" * 100, "too short"),
    ],
)
def test_bad_shard_headers_are_rejected(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.bin"
    path.write_bytes(content)
    with pytest.raises(DataError, match=message):
        read_shard(path)


def test_text_files_become_byte_tokens(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"hi")
    (tmp_path / "b.txt").write_bytes("é".encode())
    tokens = read_text_bytes([tmp_path / "a.txt", tmp_path / "b.txt"])
    assert tokens.tolist() == [104, 105, 0xC3, 0xA9]


def test_the_standard_library_is_real_text_everywhere() -> None:
    files = stdlib_source_files()
    assert len(files) > 100
    assert any(f.name == "os.py" for f in files)


def test_batches_are_a_pure_function_of_seed_and_position() -> None:
    data = np.arange(10_000, dtype=np.uint16) % 500
    a = TokenSampler([data], batch_size=4, seq_len=32, seed=7)
    b = TokenSampler([data], batch_size=4, seq_len=32, seed=7)
    it = a.iterate(start=0)
    first = [next(it) for _ in range(5)]
    assert torch.equal(first[3][0], b.batch(3)[0])
    resumed = next(b.iterate(start=3))
    assert torch.equal(resumed[0], first[3][0]) and torch.equal(resumed[1], first[3][1])
    assert not torch.equal(a.batch(3)[0], TokenSampler([data], 4, 32, seed=8).batch(3)[0])


def test_targets_are_tokens_shifted_by_one() -> None:
    data = np.arange(1000, dtype=np.uint16)
    x, y = TokenSampler([data], batch_size=2, seq_len=16).batch(0)
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(y - x, torch.ones_like(x))


def test_too_little_data_for_the_sequence_length_is_an_error() -> None:
    with pytest.raises(DataError, match="lower seq_len"):
        TokenSampler([np.zeros(10, dtype=np.uint16)], batch_size=1, seq_len=32)


def test_synthetic_sources_keep_the_seed_shapes() -> None:
    x, y = generate_synthetic_batch(2, 8, 100)
    assert x.shape == y.shape == (2, 8) and int(x.max()) < 100
    s = SyntheticSampler(2, 8, 100, seed=1)
    assert torch.equal(s.batch(5)[0], SyntheticSampler(2, 8, 100, seed=1).batch(5)[0])


class CountingSource:
    """Yields numbered batches and records how many the producer has pulled."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.pulled = 0
        self.fail_at = fail_at

    def __iter__(self) -> Iterator[Batch]:
        while True:
            if self.pulled == self.fail_at:
                raise OSError("disk went away")
            self.pulled += 1
            t = torch.full((1, 4), self.pulled - 1)
            yield t, t


def test_loader_prefetches_the_next_batch_while_the_consumer_holds_one() -> None:
    source = CountingSource()
    with AsyncDataLoader(source, prefetch_factor=2) as loader:
        batch0 = next(loader)
        assert int(batch0[0][0, 0]) == 0
        # The consumer holds batch 0 and asks for nothing; the producer moves on by itself.
        assert poll(lambda: loader.produced >= 2, timeout=10, interval=0.001)
        assert loader.consumed == 1
        # Bounded: it never runs more than prefetch_factor ahead of the queue.
        assert poll(lambda: loader.produced == 3, timeout=10, interval=0.001)
        assert loader.produced == 3 and source.pulled <= 4
        assert [int(next(loader)[0][0, 0]) for _ in range(3)] == [1, 2, 3]


def test_producer_errors_are_raised_in_the_consumer() -> None:
    with AsyncDataLoader(CountingSource(fail_at=2)) as loader:
        next(loader)
        next(loader)
        with pytest.raises(RuntimeError, match="disk went away"):
            next(loader)


def test_close_leaves_no_thread_behind() -> None:
    before = {t.ident for t in threading.enumerate()}
    loader = AsyncDataLoader(CountingSource(), prefetch_factor=1)
    next(loader)
    loader.close()
    assert {t.ident for t in threading.enumerate()} <= before


def test_loader_benchmark_reports_rates() -> None:
    sampler = TokenSampler([np.arange(5000, dtype=np.uint16) % 256], 4, 64)
    with AsyncDataLoader(sampler.iterate(), prefetch_factor=4) as loader:
        stats = loader.benchmark(20)
    assert set(stats) == {"batches_per_sec", "tokens_per_sec", "elapsed_sec"}
    assert stats["tokens_per_sec"] == pytest.approx(stats["batches_per_sec"] * 4 * 64)


@pytest.mark.gpu
def test_loader_pins_memory_and_copies_to_cuda() -> None:
    sampler = TokenSampler([np.arange(5000, dtype=np.uint16) % 256], 4, 64)
    with AsyncDataLoader(sampler.iterate(), device="cuda") as loader:
        x, _ = next(loader)
        assert loader.pin_memory and x.is_cuda

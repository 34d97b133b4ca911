"""The issue's three prepare runs at its own sizes (`make soak`): a 512 MB JSONL line in a
.jsonl.gz of half a MB, a 512 MB Parquet value, and 1 GB of lines in a .jsonl.zst of a
hundred KB. They grew the worker by 3, 4 and 2 GB; with the default max_document_bytes
each now holds no more than its batches (tests/store/data/test_prepare_memory.py runs the same at
32 MB in `make test`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.hostile_corpora import (
    MiB,
    gz_with_a_long_line,
    parquet_with_a_long_value,
    prepare_peak,
    small_corpus,
    zst_of_many_lines,
)
from trainctl.store.data.corpus import BATCH_BYTES

pytestmark = pytest.mark.soak  # a few GB of data
# Nothing these hold is longer than a batch: the long document is read past or left unread.
BOUND = 32 * BATCH_BYTES


@pytest.mark.parametrize(
    ("name", "make", "oversized"),
    [
        ("long.jsonl.gz", lambda p: gz_with_a_long_line(p, 512 * MiB), 1),
        ("long.parquet", lambda p: parquet_with_a_long_value(p, 512 * MiB, alone=True), 1),
        ("many.jsonl.zst", lambda p: zst_of_many_lines(p, 1024 * MiB), 0),
    ],
    ids=["gz-512MB-line", "parquet-512MB-value", "zst-1GB-of-lines"],
)
def test_the_issues_prepare_runs_hold_no_more_than_their_batches(
    tmp_path: Path, name: str, make: Callable[[Path], int], oversized: int
) -> None:
    make(tmp_path / name)
    small_corpus(tmp_path / f"small-{name}")

    run = prepare_peak(tmp_path / name, tmp_path / "ds")
    base = prepare_peak(tmp_path / f"small-{name}", tmp_path / "baseline")

    grown = run.peak_bytes - base.peak_bytes
    print(f"{name}: {(tmp_path / name).stat().st_size:,} bytes, grew {grown / MiB:.0f} MiB")
    assert grown < BOUND, (run.peak_bytes, base.peak_bytes)
    assert run.dataset["skipped"]["oversized"] == oversized

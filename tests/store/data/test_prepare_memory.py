"""A prepare's memory is bounded by its batch whatever the compression ratio, and a document
too long to hold is skipped and counted in dataset.json (docs/design/data.md, "Datasets").

The issue's three examples, each a real `trainctl data prepare` in a process of its own whose
peak memory the kernel reports, at 32 MB with a 1 MiB `--max-document-bytes` (its sizes, 512
MB and 1 GB, run in `make soak`: tests/reliability/test_prepare_memory.py). The bound is not
a timing: it holds on any machine. Each is compared with the same prepare of the same kind of
file without the long document, which imports the same libraries.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.hostile_corpora import (
    NORMAL_DOCUMENTS,
    MiB,
    Prepared,
    gz_with_a_long_line,
    parquet_with_a_long_value,
    parquet_with_a_repeated_value,
    prepare_peak,
    small_corpus,
    zst_of_many_lines,
)
from trainctl.store.data.corpus import BATCH_BYTES, MAX_DOCUMENT_BYTES
from trainctl.store.data.prepare import prepare_dataset
from trainctl.store.data.shards import DataError
from trainctl.store.kinds.prepare import PrepareOptions

SIZE = 32 * MiB
LIMIT = 1 * MiB
# What a reading may hold beyond the baseline: the batch being read, two in flight and the
# one being parsed, each a few times its size while it is decoded (text, JSON, UTF-8), and
# one document. The runs grew by 5 to 10 times the document instead.
BOUND = 32 * max(BATCH_BYTES, LIMIT)


def baseline(tmp_path: Path, name: str) -> Prepared:
    small_corpus(tmp_path / name)
    return prepare_peak(tmp_path / name, tmp_path / "baseline", "--max-document-bytes", str(LIMIT))


def prepared(tmp_path: Path, corpus: Path) -> Prepared:
    return prepare_peak(corpus, tmp_path / "ds", "--max-document-bytes", str(LIMIT))


def test_a_long_line_in_a_small_jsonl_gz_is_skipped_counted_and_never_held(
    tmp_path: Path,
) -> None:
    line = gz_with_a_long_line(tmp_path / "long.jsonl.gz", SIZE)
    assert (tmp_path / "long.jsonl.gz").stat().st_size < SIZE // 100  # a ratio above 100

    run, base = prepared(tmp_path, tmp_path / "long.jsonl.gz"), baseline(tmp_path, "s.jsonl.gz")

    assert run.peak_bytes - base.peak_bytes < BOUND, (run.peak_bytes, base.peak_bytes)
    skipped = run.dataset["skipped"]
    assert skipped["documents"] == skipped["oversized"] == 1
    assert skipped["max_document_bytes"] == LIMIT
    [example] = skipped["examples"]
    assert (
        example["line"] == line and "more than max_document_bytes (1,048,576)" in example["reason"]
    )
    assert run.dataset["splits"]["train"]["documents"] == NORMAL_DOCUMENTS


def test_many_lines_in_a_tiny_jsonl_zst_are_decompressed_a_block_at_a_time(
    tmp_path: Path,
) -> None:
    documents = zst_of_many_lines(tmp_path / "many.jsonl.zst", SIZE)
    assert (tmp_path / "many.jsonl.zst").stat().st_size < SIZE // 1000

    run, base = prepared(tmp_path, tmp_path / "many.jsonl.zst"), baseline(tmp_path, "s.jsonl.zst")

    assert run.peak_bytes - base.peak_bytes < BOUND, (run.peak_bytes, base.peak_bytes)
    assert run.dataset["splits"]["train"]["documents"] == documents
    assert run.dataset["skipped"]["documents"] == 0


def test_a_long_parquet_value_alone_in_its_row_group_is_skipped_unread(tmp_path: Path) -> None:
    row = parquet_with_a_long_value(tmp_path / "long.parquet", SIZE, alone=True)

    run, base = prepared(tmp_path, tmp_path / "long.parquet"), baseline(tmp_path, "s.parquet")

    assert run.peak_bytes - base.peak_bytes < BOUND, (run.peak_bytes, base.peak_bytes)
    assert run.dataset["skipped"]["oversized"] == 1
    assert run.dataset["skipped"]["examples"][0]["line"] == row
    assert run.dataset["splits"]["train"]["documents"] == NORMAL_DOCUMENTS


def test_a_long_parquet_value_among_others_leaves_their_row_group_unread(
    tmp_path: Path,
) -> None:
    """pyarrow holds a page whole while it decodes it, and a writer puts a long value in a
    page with its neighbours: the page's header says how large it is, and a row group with a
    page larger than a reader may hold is not read (the issue's 300 MB value cost +967 MB)."""
    row = parquet_with_a_long_value(tmp_path / "long.parquet", SIZE, alone=False)

    run, base = prepared(tmp_path, tmp_path / "long.parquet"), baseline(tmp_path, "s.parquet")

    assert run.peak_bytes - base.peak_bytes < BOUND, (run.peak_bytes, base.peak_bytes)
    skipped = run.dataset["skipped"]
    assert skipped["documents"] == skipped["oversized"] == 11  # the value and its group
    [example] = skipped["examples"]
    assert example["line"] == row and example["reason"].startswith("rows 101 to 111 (a row group)")
    assert run.dataset["splits"]["train"]["documents"] == NORMAL_DOCUMENTS - 10


@pytest.mark.parametrize(
    ("value_bytes", "rows", "oversized"),
    [(3 * LIMIT // 2, 256, 256), (LIMIT // 2, 128, 0)],
    ids=["oversized-1.5MB-in-256-rows", "fits-512KB-in-128-rows"],
)
def test_a_value_repeated_by_a_parquet_dictionary_is_decoded_a_few_rows_at_a_time(
    tmp_path: Path, value_bytes: int, rows: int, oversized: int
) -> None:
    """The issue's 1.5 KB file: a dictionary page holds the value once and each row is an
    index, so a batch of a thousand rows decoded to a thousand copies (+4.6 GB). A value is no
    longer than the page that holds it: batches hold a page's worth of rows, whether the value
    is skipped (longer than max_document_bytes) or kept."""
    first = parquet_with_a_repeated_value(tmp_path / "rep.parquet", value_bytes, rows)
    assert (tmp_path / "rep.parquet").stat().st_size < value_bytes // 4

    run, base = prepared(tmp_path, tmp_path / "rep.parquet"), baseline(tmp_path, "s.parquet")

    assert run.peak_bytes - base.peak_bytes < BOUND, (run.peak_bytes, base.peak_bytes)
    assert run.dataset["skipped"]["oversized"] == oversized
    if oversized:
        assert run.dataset["skipped"]["examples"][0]["line"] == first
    train = run.dataset["splits"]["train"]
    assert train["documents"] == NORMAL_DOCUMENTS + rows - oversized


def test_strict_stops_at_an_oversized_document_naming_its_file_and_line(tmp_path: Path) -> None:
    gz_with_a_long_line(tmp_path / "long.jsonl.gz", 2 * LIMIT)

    with pytest.raises(DataError, match=r"long\.jsonl\.gz:101: a line of 2,097,165 bytes"):
        prepare_dataset(
            [tmp_path / "long.jsonl.gz"], tmp_path / "ds", None, workers=1, strict=True,
            max_document_bytes=LIMIT,
        )  # fmt: skip
    assert not (tmp_path / "ds").exists()


def test_the_request_default_is_the_readers_default() -> None:
    assert PrepareOptions().max_document_bytes == MAX_DOCUMENT_BYTES

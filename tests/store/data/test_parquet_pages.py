"""Parquet page headers read without pyarrow (store/data/parquet_pages.py): every kind of page
that pyarrow writes, and a header that is not one is a DataError, never a hang or a guess."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainctl.store.data.parquet_pages import Page, column_pages
from trainctl.store.data.shards import DataError

TEXTS = [f"document {i} " * (1 + i % 50) for i in range(5000)]


def pages_of(path: Path) -> list[list[Page]]:
    metadata = pq.ParquetFile(path).metadata
    found = []
    with open(path, "rb") as f:
        for group in range(metadata.num_row_groups):
            chunk = metadata.row_group(group).column(0)
            start = chunk.dictionary_page_offset or chunk.data_page_offset
            found.append(column_pages(f, start, chunk.total_compressed_size))
    return found


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"compression": "zstd", "data_page_version": "2.0"},
        {"use_dictionary": False, "compression": "gzip", "data_page_size": 4096},
        {"use_dictionary": False, "column_encoding": {"text": "DELTA_BYTE_ARRAY"}},
        {"use_dictionary": False, "column_encoding": {"text": "DELTA_LENGTH_BYTE_ARRAY"}},
    ],
    ids=["dictionary-snappy", "v2-zstd", "plain-gzip-small-pages", "delta", "delta-length"],
)
def test_the_pages_of_each_writer_setting_hold_the_rows_and_sizes_of_their_chunk(
    tmp_path: Path, options: dict[str, Any]
) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": TEXTS}), path, row_group_size=3000, **options)
    metadata = pq.ParquetFile(path).metadata

    for group, pages in enumerate(pages_of(path)):
        chunk = metadata.row_group(group).column(0)
        data = [p for p in pages if p.kind in ("data", "data_v2")]
        assert sum(p.values for p in data) == metadata.row_group(group).num_rows
        assert sum(p.uncompressed for p in pages) < chunk.total_uncompressed_size
        assert sum(p.compressed for p in pages) < chunk.total_compressed_size
        assert (pages[0].kind == "dictionary") == options.get("use_dictionary", True)


def test_a_page_of_one_long_value_says_its_size_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": ["a" * 3_000_000]}), path, use_dictionary=False)

    [[page]] = pages_of(path)

    assert (page.kind, page.values) == ("data", 1) and page.uncompressed > 3_000_000


@pytest.mark.parametrize(
    "header",
    [
        b"",
        b"\x15",
        b"\x15\x00\x15\x80\x80",
        b"\x19\xfc\xff\xff\xff\xff\x7f" + b"\x00" * 200_000,
        b"\x1d\x00",
        b"\x15\x0e\x00",
    ],
    ids=[
        "empty",
        "cut-in-a-field",
        "cut-in-a-varint",
        "a-list-of-billions",
        "unknown-type",
        "unknown-page-type",
    ],  # fmt: skip
)
def test_a_header_that_is_not_one_is_a_data_error(tmp_path: Path, header: bytes) -> None:
    path = tmp_path / "bad"
    path.write_bytes(header)

    with open(path, "rb") as f, pytest.raises(DataError, match="Parquet page header"):
        column_pages(f, 0, 1)

"""The pages of a Parquet column chunk, from their headers alone: how many values each holds
and how many bytes it takes to read (docs/design/data.md, "Datasets", "Memory of a prepare").

pyarrow reads a column a page at a time and holds a whole page, decompressed, while it
decodes it; its metadata says nothing of pages. A page's header (a Thrift struct, compact
protocol, before its bytes) says how large it is and how many values it holds, so a reader
can know what a page will cost before pyarrow reads it. Only the headers are read: each page's
bytes, and any binary field of a header (statistics may hold a whole value), are seeked past.

A header is input like any other: a malformed one, or one that would take more than
`MAX_HEADER_ITEMS` fields and elements to read, is a `DataError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO, Literal

from trainctl.store.data.shards import DataError

MAX_HEADER_ITEMS = 100_000
"""More fields and list elements than any header a writer makes (statistics are a few)."""
MAX_DEPTH = 16
PageKind = Literal["data", "index", "dictionary", "data_v2"]
_KINDS: dict[int, PageKind] = {0: "data", 1: "index", 2: "dictionary", 3: "data_v2"}
# Thrift compact types.
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)
# PageHeader's fields, and the num_values field of its page headers (each field 1).
_TYPE, _UNCOMPRESSED, _COMPRESSED = 1, 2, 3
_VALUE_HEADERS = {5: "data", 7: "dictionary", 8: "data_v2"}


@dataclass(frozen=True)
class Page:
    kind: PageKind
    values: int
    """Values it holds (for a data page of a flat column, its rows, nulls included)."""
    uncompressed: int
    compressed: int

    @property
    def cost(self) -> int:
        """Bytes pyarrow holds to read it: the larger of its two sizes."""
        return max(self.uncompressed, self.compressed)


def column_pages(f: IO[bytes], start: int, length: int) -> list[Page]:
    """The pages of the column chunk at `start` of `f`, `length` bytes (its metadata's
    total_compressed_size, headers included)."""
    pages, at, end = [], start, start + length
    while at < end:
        f.seek(at)
        page = _Header(f).page()
        if page.compressed < 0 or page.uncompressed < 0:
            raise DataError(f"a Parquet page header at byte {at:,} gives a negative size")
        pages.append(page)
        at = f.tell() + page.compressed
    return pages


class _Header:
    """One PageHeader, read field by field from the file's current position."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f, self.items = f, 0

    def page(self) -> Page:
        fields: dict[int, int] = {}
        values = 0
        last = 0
        while (kind_id := self._field(last)) is not None:
            kind, last = kind_id
            if last in (_TYPE, _UNCOMPRESSED, _COMPRESSED) and kind == _I32:
                fields[last] = self._int()
            elif last in _VALUE_HEADERS and kind == _STRUCT:
                values = self._num_values()
            else:
                self._skip(kind, 0)
        if _TYPE not in fields or fields[_TYPE] not in _KINDS:
            raise DataError("a Parquet page header without a known page type")
        return Page(
            _KINDS[fields[_TYPE]], values, fields.get(_UNCOMPRESSED, 0), fields.get(_COMPRESSED, 0)
        )

    def _num_values(self) -> int:
        """The struct's field 1 (num_values in each kind of page header); the rest skipped."""
        values, last = 0, 0
        while (kind_id := self._field(last)) is not None:
            kind, last = kind_id
            if last == 1 and kind == _I32:
                values = self._int()
            else:
                self._skip(kind, 1)
        return values

    def _field(self, last: int) -> tuple[int, int] | None:
        """(type, id) of the next field of a struct, None at its end."""
        self._count()
        byte = self._byte()
        if byte == 0:
            return None
        delta, kind = byte >> 4, byte & 0x0F
        return kind, last + delta if delta else self._int()

    def _skip(self, kind: int, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise DataError("a Parquet page header nested too deep")
        if kind in (_TRUE, _FALSE):
            return
        if kind == _BYTE:
            self._byte()
        elif kind in (_I16, _I32, _I64):
            self._varint()
        elif kind == _DOUBLE:
            self._read(8)
        elif kind == _BINARY:
            self.f.seek(self._varint(), 1)  # statistics may hold a whole value: never read
        elif kind in (_LIST, _SET):
            head = self._byte()
            size = head >> 4 if head >> 4 != 15 else self._varint()
            for _ in range(size):
                self._count()
                self._skip_element(head & 0x0F, depth + 1)
        elif kind == _MAP:
            size = self._varint()
            types = self._byte() if size else 0
            for _ in range(size):
                self._count()
                self._skip_element(types >> 4, depth + 1)
                self._skip_element(types & 0x0F, depth + 1)
        elif kind == _STRUCT:
            last = 0
            while (kind_id := self._field(last)) is not None:
                inner, last = kind_id
                self._skip(inner, depth + 1)
        else:
            raise DataError(f"a Parquet page header with an unknown field type {kind}")

    def _skip_element(self, kind: int, depth: int) -> None:
        """An element of a list, set or map: a boolean there takes a byte."""
        if kind in (_TRUE, _FALSE):
            self._byte()
        else:
            self._skip(kind, depth)

    def _count(self) -> None:
        self.items += 1
        if self.items > MAX_HEADER_ITEMS:
            raise DataError(f"a Parquet page header of more than {MAX_HEADER_ITEMS:,} items")

    def _int(self) -> int:
        """A zigzag varint (i16, i32, i64)."""
        n = self._varint()
        return (n >> 1) ^ -(n & 1)

    def _varint(self) -> int:
        n = shift = 0
        while True:
            byte = self._byte()
            n |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return n
            shift += 7
            if shift > 63:
                raise DataError("a Parquet page header with a varint longer than 64 bits")

    def _byte(self) -> int:
        return self._read(1)[0]

    def _read(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) != n:
            raise DataError("a Parquet page header runs past the end of the file")
        return data

"""Documents from corpus files, streamed: text files, JSONL (plain, .gz, .zst) and Parquet.

A document is a text file (folders are walked in name order, hidden entries skipped), the text
field of a JSONL line, or the text column of a Parquet row. Reading is split in two so that
tokenizing processes share the parsing (`store.data.prepare`):

- `read_batches` (the reading process) streams the files and yields raw records in batches of
  about `BATCH_BYTES`: undecoded lines, file bytes, Parquet values. Nothing holds more than a
  batch and one document, whatever the compression ratio (docs/design/data.md, "Datasets",
  "Memory of a prepare").
- `parse_batch` (any process) turns a batch into texts and `Problem`s: a line that is not JSON
  or not an object, a missing, null or non-string field, text that is not UTF-8. Each names
  its file and line (row for Parquet), and the caller skips or refuses it (strict).

A text file above `PIECE_BYTES` is read in pieces, cut at a line break followed by a
printable ASCII character: after it when a printable character precedes it too, else before
it. Pre-tokenizers split there (GPT-2's ByteLevel regex, ours, at both; Llama 3's at the
first), so for them the pieces' tokens are the whole file's; only a file with no such break
is cut anywhere else. Such a file is checked for UTF-8 first, in a pass of its own, so that
a bad byte late in it skips the whole document. A JSONL line or Parquet value longer than
`max_document_bytes` is *oversized*: skipped and counted, or with `strict` an error; so are
the rows of a Parquet row group with a page too large to hold (`Limits.page_limit`), which is
not read.

A file that cannot be read as its kind (a truncated .gz or .zst, a broken Parquet file) is a
`DataError`, never a skipped document: what follows the damage is unknown. Files are opened
as every data file is (`store.data.shards.open_data`): a FIFO or a device among the inputs is
an error naming it, never a read that blocks.
"""

from __future__ import annotations

import codecs
import gzip
import io
import json
import os
import re
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal, NamedTuple

from trainctl.store.data.parquet_pages import Page, column_pages
from trainctl.store.data.shards import DataError, open_data
from trainctl.store.data.walk import Bounds, walk_files
from trainctl.store.files import NotRegularFile, check_regular

Kind = Literal["text", "jsonl", "parquet"]
BATCH_BYTES = 1 << 20
BATCH_RECORDS = 4096
PIECE_BYTES = 4 << 20
READ_BYTES = 1 << 20
PARQUET_ROWS = 1024
PARQUET_PAGE_SLACK = 64 << 10
"""What a page holds besides its values: levels, lengths."""
MAX_DOCUMENT_BYTES = 16 << 20
"""The default `max_document_bytes`: tokenizing a document costs about 30 times its size in
the process that does it, so this bounds each tokenizing process near half a GB."""
TEXT_TYPES = ("string", "large_string", "string_view", "binary", "large_binary", "binary_view")
MAX_EXAMPLES = 10
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
# Where a piece of a long text file may end (module docstring): after a line break between
# two printable ASCII characters, else before a line break followed by one.
CUTS = (re.compile(rb"(?<=[\x21-\x7e]\n)(?=[\x21-\x7e])"), re.compile(rb"(?=\n[\x21-\x7e])"))


@dataclass(frozen=True)
class Source:
    path: Path
    kind: Kind
    size: int


class PrepareStopped(DataError):
    """`should_stop` asked a prepare (or its reading) to stop; what it had written is
    removed."""


class Record(NamedTuple):
    """One raw document, or a piece of one, or a note that the reader skipped some
    (`oversized`: that many too long to read)."""

    kind: Kind | Literal["skip", "oversized"]
    file: str
    line: int
    """1-based line of a text file or JSONL file, row of a Parquet file."""
    raw: Any
    """bytes (text, jsonl, parquet); for skip and oversized, (documents, reason)."""
    last: bool = True
    """False: the document goes on in the next record (a long text file in pieces)."""


@dataclass(frozen=True)
class Problem:
    file: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}"


@dataclass
class Parsed:
    """A batch's documents (or pieces) in order, and what was skipped, in order."""

    texts: list[str] = field(default_factory=list)
    nbytes: list[int] = field(default_factory=list)
    """UTF-8 bytes of each text."""
    last: list[bool] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    skipped: int = 0
    oversized: int = 0
    """Of `skipped`, those longer than max_document_bytes."""


@dataclass
class Skipped:
    """Documents left out: how many (and how many of them for their size), and the first few
    with their place and reason."""

    max_document_bytes: int = MAX_DOCUMENT_BYTES
    documents: int = 0
    oversized: int = 0
    examples: list[Problem] = field(default_factory=list)

    def add(self, problems: Sequence[Problem], documents: int, oversized: int = 0) -> None:
        self.documents += documents
        self.oversized += oversized
        self.examples.extend(problems[: MAX_EXAMPLES - len(self.examples)])

    def to_json(self) -> dict[str, Any]:
        return {
            "documents": self.documents,
            "oversized": self.oversized,
            "max_document_bytes": self.max_document_bytes,
            "examples": [vars(p) for p in self.examples],
        }


def kind_of(path: Path) -> Kind:
    name = path.name.lower()
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    return "parquet" if name.endswith(".parquet") else "text"


def find_sources(inputs: Sequence[Path], bounds: Bounds | None = None) -> list[Source]:
    """Files as given, and the files under folders in name order (hidden ones skipped, links
    to folders not walked); every one a regular file. `bounds` limit the walks (a prepare
    run's `should_stop`); a person running the CLI stops it with Ctrl-C."""
    bounds = bounds or Bounds()
    files: list[Path] = []
    for p in map(Path, inputs):
        if p.is_dir():
            files += [Path(f) for f in walk_files(p, bounds, skip_hidden=True)]
        elif os.path.lexists(p):
            files.append(p)
        else:
            raise DataError(f"{p}: no such file or folder")
    if not files:
        raise DataError(f"no files in {', '.join(map(str, inputs))}")
    return [Source(f, kind_of(f), _regular_size(f)) for f in files]


def _regular_size(path: Path) -> int:
    try:
        st = os.stat(path)
        check_regular(st, path)
    except NotRegularFile as exc:
        raise DataError(f"{path}: {exc.strerror}; move it out of the inputs") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot be read ({exc.strerror})") from None
    return st.st_size


# --- reading (one process) ---------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """What one reading holds at most: a batch of about `batch_bytes`, and documents of at
    most `max_document_bytes` (JSONL lines, Parquet values); `should_stop` is asked while a
    long oversized line is read past."""

    batch_bytes: int = BATCH_BYTES
    max_document_bytes: int = MAX_DOCUMENT_BYTES
    should_stop: Callable[[], bool] | None = None

    @property
    def page_limit(self) -> int:
        """The largest Parquet page read (pyarrow holds one whole): room for a document of
        `max_document_bytes` and as much again of its neighbours (a writer closes a page
        after a batch of values, so a long one shares its page)."""
        return 2 * self.max_document_bytes + PARQUET_PAGE_SLACK

    def check(self) -> None:
        if self.should_stop is not None and self.should_stop():
            raise PrepareStopped("the prepare was stopped; nothing of it is left")


def read_batches(
    sources: Sequence[Source], *, text_column: str = "text", limits: Limits | None = None
) -> Iterator[list[Record]]:
    """Every source's records in order, in batches of about `limits.batch_bytes`."""
    limits = limits or Limits()
    batch: list[Record] = []
    size = 0
    for source in sources:
        for record in _records(source, text_column, limits):
            batch.append(record)
            size += len(record.raw) if isinstance(record.raw, bytes) else 0
            if size >= limits.batch_bytes or len(batch) >= BATCH_RECORDS:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch


def _records(source: Source, text_column: str, limits: Limits) -> Iterator[Record]:
    if source.kind == "jsonl":
        return _jsonl_records(source.path, limits)
    if source.kind == "parquet":
        return _parquet_records(source.path, text_column, limits)
    return _text_records(source.path)


def _text_records(path: Path) -> Iterator[Record]:
    file = str(path)
    with open_data(path) as f:
        data = f.read(PIECE_BYTES + 1)
        if len(data) <= PIECE_BYTES:
            yield Record("text", file, 1, data)
            return
        del data
        f.seek(0)
        bad = _first_bad_utf8(f)
        if bad is not None:
            yield Record("skip", file, bad[0], (1, bad[1]))
            return
        f.seek(0)
        line, rest = 1, b""
        while True:
            data = rest + f.read(PIECE_BYTES)
            if len(data) - len(rest) < PIECE_BYTES:  # the end of the file
                yield Record("text", file, line, data)
                return
            cut = _cut(data)
            yield Record("text", file, line, data[:cut], last=False)
            line += data.count(b"\n", 0, cut)
            rest = data[cut:]


def _cut(data: bytes) -> int:
    """Where to end a piece: the last cut of the first kind of `CUTS` found in its second
    half, else in all of it; else its last line break, else its last character boundary.
    Never at 0 or at the very end, so neither the piece nor the rest is empty."""
    end = len(data) - 1
    for start in (len(data) // 2, 1):
        for cuts in CUTS:
            at = None
            for at in cuts.finditer(data, start, end):  # noqa: B007 (the last one is wanted)
                pass
            if at is not None:
                return at.start()
    if (nl := data.rfind(b"\n", 0, end)) >= 0:
        return nl + 1
    while end > 1 and data[end] & 0xC0 == 0x80:  # a continuation byte: mid-character
        end -= 1
    return end


def _first_bad_utf8(f: IO[bytes]) -> tuple[int, str] | None:
    """(line, reason) of the first byte that is not UTF-8, reading in blocks."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    line = 1
    while True:
        block = f.read(READ_BYTES)
        try:
            decoder.decode(block, final=not block)
        except UnicodeDecodeError as exc:
            # the error's position counts from the bytes the decoder held back
            held = len(exc.object) - len(block)
            at = max(0, exc.start - held)
            return line + block.count(b"\n", 0, at), _not_utf8(exc)
        if not block:
            return None
        line += block.count(b"\n")


def _jsonl_records(path: Path, limits: Limits) -> Iterator[Record]:
    """A record per line, each read with a limit: a line longer than `max_document_bytes`
    is read past in blocks, never held, and is an `oversized` record."""
    file, limit = str(path), limits.max_document_bytes
    line = 0
    try:
        with open_data(path) as raw, _decompressed(path, raw) as f:
            while data := f.readline(limit + 1):
                line += 1
                if len(data) <= limit or data.endswith(b"\n"):
                    yield Record("jsonl", file, line, data)
                    continue
                del data
                length = limit + 1 + _read_past_line(f, limits)
                reason = f"a line of {length:,} bytes, more than max_document_bytes ({limit:,})"
                yield Record("oversized", file, line, (1, reason))
    except (OSError, EOFError, zlib.error, _ZstdError) as exc:
        raise DataError(f"{file}: unreadable after line {line} ({exc})") from exc


def _read_past_line(f: io.BufferedIOBase, limits: Limits) -> int:
    """Read to the end of the current line (or file), a block at a time; its length."""
    length = 0
    while block := f.readline(READ_BYTES):
        length += len(block)
        if block.endswith(b"\n"):
            break
        limits.check()
    return length


def _decompressed(path: Path, raw: io.BufferedReader) -> io.BufferedIOBase:
    """The stream of a JSONL file's lines: `raw` as it is, or decompressed (.gz, .zst)."""
    if path.name.lower().endswith(".gz"):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if path.name.lower().endswith(".zst"):
        return io.BufferedReader(_ZstdFrames(raw), READ_BYTES)
    return raw


class _ZstdError(Exception):
    """A .zst file that ends inside a frame, or is not zstd."""


_ZSTD_MAGIC = 0xFD2FB528
_SKIPPABLE_MAGIC = 0x184D2A50  # to 0x184D2A5F
_BLOCK_RLE = 1


class _ZstdFrames(io.RawIOBase):
    """zstd frames one after another, as one stream, decompressed one block at a time.

    A block regenerates at most 128 KiB (the format's Block_Maximum_Size), so feeding the
    decompressor a block at a time bounds what one call returns, whatever the ratio: a 90 KB
    file can hold a GB, and `decompress` of the whole input would return all of it at once.
    Reading the frame and block headers also says where each frame ends, so a file that ends
    inside one is an error (zstandard's own stream reader ends quietly there).
    """

    def __init__(self, raw: IO[bytes]) -> None:
        import zstandard

        self.raw, self.zstd = raw, zstandard
        self.dctx = zstandard.ZstdDecompressor()
        self.blocks = self._blocks()
        self.out = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.out:
            data = next(self.blocks, None)
            if data is None:
                return 0
            try:
                self.out = self.frame.decompress(data)
            except self.zstd.ZstdError as exc:
                raise _ZstdError(f"not zstd data: {exc}") from exc
        n = min(len(buffer), len(self.out))
        buffer[:n] = self.out[:n]
        self.out = self.out[n:]
        return n

    def _blocks(self) -> Iterator[bytes]:
        """The input cut into a frame's header, then its blocks one by one (its checksum
        with the last); a new decompressor for each frame."""
        while magic := self.raw.read(4):
            number = int.from_bytes(self._exactly(4 - len(magic), magic), "little")
            if number & 0xFFFFFFF0 == _SKIPPABLE_MAGIC:
                size = int.from_bytes(self._exactly(4), "little")
                self._exactly(size)  # a skippable frame's content means nothing to us
                continue
            if number != _ZSTD_MAGIC:
                raise _ZstdError("not zstd data (bad frame magic)")
            self.frame = self.dctx.decompressobj()
            descriptor = self._exactly(1)
            flags = descriptor[0]
            fcs = (0, 2, 4, 8)[flags >> 6] or (1 if flags & 0x20 else 0)
            window = 0 if flags & 0x20 else 1
            dictionary = (0, 1, 2, 4)[flags & 0x03]
            checksum = 4 if flags & 0x04 else 0
            yield magic + descriptor + self._exactly(window + dictionary + fcs)
            last = False
            while not last:
                header = self._exactly(3)
                value = int.from_bytes(header, "little")
                last, kind, size = bool(value & 1), (value >> 1) & 3, value >> 3
                body = self._exactly(1 if kind == _BLOCK_RLE else size)
                yield header + body + (self._exactly(checksum) if last else b"")

    def _exactly(self, size: int, start: bytes = b"") -> bytes:
        data = start + self.raw.read(size)
        if len(data) < len(start) + size:
            raise _ZstdError("the file ends inside a zstd frame: truncated?")
        return data

    def close(self) -> None:
        self.raw.close()
        super().close()


def _parquet_records(path: Path, column: str, limits: Limits) -> Iterator[Record]:
    """A record per row of the text column, in batches whose values come to about
    `batch_bytes`; a value longer than `max_document_bytes` is measured, not copied, and a
    row group with a page too large to hold is not read at all (`_row_group`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    file = str(path)
    row = 1
    try:
        with open_data(path) as raw:
            # buffer_size: pages are read as they are decoded, not a whole column chunk
            parquet = pq.ParquetFile(raw, buffer_size=READ_BYTES, pre_buffer=False)
            schema, metadata = parquet.schema_arrow, parquet.metadata
            rows = metadata.num_rows
            if (problem := _column_problem(schema, column)) is not None:
                if rows:
                    every = "its one row" if rows == 1 else f"all {rows:,} rows"
                    yield Record("skip", file, 1, (rows, f"{problem}: {every} skipped"))
                return
            for group in range(metadata.num_row_groups):
                yield from _row_group(parquet, raw, group, column, row, file, limits)
                row += metadata.row_group(group).num_rows
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"{file}: unreadable as Parquet at row {row} ({exc})") from exc


def _row_group(
    parquet: Any, raw: IO[bytes], group: int, column: str, row: int, file: str, limits: Limits
) -> Iterator[Record]:
    """The records of one row group, whose first row is `row`.

    What pyarrow holds to read it is known from its pages' headers before it reads one
    (`store.data.parquet_pages`): it holds a page whole, decompressed, and decodes a batch of
    rows at a time, each value no longer than the page that holds it (a dictionary-encoded
    value is its dictionary page's). So a row group with a page larger than `page_limit` is
    not read (its rows are oversized), and batches are of as many rows as a page's worth of
    the largest value fits: a dictionary page of one long value, repeated in every row, is
    decoded a few rows at a time, never a thousand."""
    import pyarrow as pa
    import pyarrow.compute as pc

    meta = parquet.metadata.row_group(group)
    chunks = (meta.column(i) for i in range(meta.num_columns))
    chunk = next(c for c in chunks if c.path_in_schema == column)
    rows, limit, page_limit = meta.num_rows, limits.max_document_bytes, limits.page_limit
    biggest = max((p.cost for p in _pages(raw, chunk)), default=0)
    if biggest > page_limit:
        yield Record("oversized", file, row, (rows, _unread(rows, row, biggest, limit)))
        return
    size = max(chunk.total_uncompressed_size, 1)
    per_batch = max(1, min(PARQUET_ROWS, limits.batch_bytes * rows // size,
                           page_limit // max(biggest, 1)))  # fmt: skip
    batches = parquet.iter_batches(batch_size=per_batch, row_groups=[group], columns=[column])
    for batch in batches:
        values = batch.column(0)
        lengths = pc.binary_length(values).to_pylist()
        fits = pa.array([n is None or n <= limit for n in lengths])
        # Values go out as bytes: the parsing process checks UTF-8 and says which row is bad.
        kept = iter(pc.filter(values, fits).cast(pa.large_binary()).to_pylist())
        del values
        for length in lengths:
            if length is not None and length > limit:
                reason = f"a value of {length:,} bytes, more than max_document_bytes ({limit:,})"
                yield Record("oversized", file, row, (1, reason))
            else:
                yield Record("parquet", file, row, next(kept))
            row += 1


def _pages(raw: IO[bytes], chunk: Any) -> list[Page]:
    """The pages of a column chunk, from their headers (pyarrow seeks before each read)."""
    start = chunk.data_page_offset
    if chunk.has_dictionary_page and chunk.dictionary_page_offset:
        start = min(start, chunk.dictionary_page_offset)
    return column_pages(raw, start, chunk.total_compressed_size)


def _unread(rows: int, row: int, page: int, limit: int) -> str:
    """Why a row group is not read."""
    if rows == 1:
        return f"a value of about {page:,} bytes, more than max_document_bytes ({limit:,})"
    return (
        f"rows {row:,} to {row + rows - 1:,} (a row group) not read: one of its pages holds "
        f"{page:,} bytes, more than a reader holds at once with max_document_bytes "
        f"{limit:,} (twice that)"
    )


def _column_problem(schema: Any, column: str) -> str | None:
    if schema.get_field_index(column) < 0:
        return f"no column {column!r} (columns: {', '.join(schema.names)})"
    kind = schema.field(column).type
    if str(kind) not in TEXT_TYPES:
        return f"column {column!r} holds {kind}, not text"
    return None


# --- parsing (any process) ---------------------------------------------------------------


def parse_batch(records: Sequence[Record], text_field: str = "text") -> Parsed:
    """Texts of the records in order; blank lines and empty texts are no documents."""
    out = Parsed()
    for record in records:
        if record.kind in ("skip", "oversized"):
            documents, reason = record.raw
            out.problems.append(Problem(record.file, record.line, reason))
            out.skipped += documents
            out.oversized += documents if record.kind == "oversized" else 0
            continue
        text = _text(record, text_field)
        if isinstance(text, Problem):
            out.problems.append(text)
            out.skipped += 1
        elif text:  # pieces of a long file are never empty
            out.texts.append(text)
            out.nbytes.append(len(record.raw) if record.kind != "jsonl" else _utf8_len(text))
            out.last.append(record.last)
    return out


def _text(record: Record, text_field: str) -> str | Problem:
    raw = record.raw
    if record.kind == "parquet" and raw is None:
        return Problem(record.file, record.line, "the text column is null")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = record.line
        if record.kind == "text":  # a file, or a piece of one: the line of the bad byte
            line += raw.count(b"\n", 0, exc.start)
        return Problem(record.file, line, _not_utf8(exc))
    if record.kind != "jsonl":
        return text
    text = _json_text(text, text_field, record)
    if isinstance(text, str) and _utf8_len(text) < 0:
        return Problem(record.file, record.line, "not valid Unicode (a lone surrogate escape)")
    return text


def _utf8_len(text: str) -> int:
    """Its length in UTF-8; -1 if it holds a lone surrogate (JSON's "\\ud800"), which
    no encoding can hold."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return -1


def _json_text(line: str, text_field: str, record: Record) -> str | Problem:
    if not line.strip():
        return ""
    try:
        value = json.loads(line.rstrip("\r\n"))
    except ValueError as exc:
        return Problem(record.file, record.line, f"not valid JSON ({exc})")
    except RecursionError:
        return Problem(record.file, record.line, "not valid JSON (nested too deep)")
    if not isinstance(value, dict):
        return Problem(record.file, record.line, f"{_json_type(value)}, not a JSON object")
    if text_field not in value:
        return Problem(record.file, record.line, f"no field {text_field!r}")
    text = value[text_field]
    if not isinstance(text, str):
        what = _json_type(text)
        return Problem(record.file, record.line, f"field {text_field!r} is {what}, not a string")
    return text


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "an array" if isinstance(value, list) else "an object"


def _not_utf8(exc: UnicodeDecodeError) -> str:
    return f"not UTF-8 (byte 0x{exc.object[exc.start]:02x})"


def iter_texts(
    sources: Sequence[Source], skipped: Skipped, *, text_field: str = "text",
    text_column: str = "text",
) -> Iterator[Parsed]:  # fmt: skip
    """Parsed batches in one process (tokenizer training); problems go to `skipped` too,
    documents longer than its `max_document_bytes` among them."""
    limits = Limits(max_document_bytes=skipped.max_document_bytes)
    for records in read_batches(sources, text_column=text_column, limits=limits):
        parsed = parse_batch(records, text_field)
        skipped.add(parsed.problems, parsed.skipped, parsed.oversized)
        yield parsed

"""Documents from corpus files, streamed: text files, JSONL (plain, .gz, .zst) and Parquet.

A document is a text file (folders are walked in name order, hidden entries skipped), the text
field of a JSONL line, or the text column of a Parquet row. Reading is split in two so that
tokenizing processes share the parsing (`store.data.prepare`):

- `read_batches` (the reading process) streams the files and yields raw records in batches of
  about `BATCH_BYTES`: undecoded lines, file bytes, Parquet values. Nothing holds more than a
  batch, a Parquet record batch or one JSONL line.
- `parse_batch` (any process) turns a batch into texts and `Problem`s: a line that is not JSON
  or not an object, a missing, null or non-string field, text that is not UTF-8. Each names
  its file and line (row for Parquet), and the caller skips or refuses it (strict).

A text file above `PIECE_BYTES` is read in pieces, cut at a line break followed by a
printable ASCII character: after it when a printable character precedes it too, else before
it. Pre-tokenizers split there (GPT-2's ByteLevel regex, ours, at both; Llama 3's at the
first), so for them the pieces' tokens are the whole file's; only a file with no such break
is cut anywhere else. Such a file is checked for UTF-8 first, in a pass of its own, so that
a bad byte late in it skips the whole document.

A file that cannot be read as its kind (a truncated .gz or .zst, a broken Parquet file) is a
`DataError`, never a skipped document: what follows the damage is unknown.
"""

from __future__ import annotations

import codecs
import gzip
import io
import json
import re
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal, NamedTuple

from trainctl.store.data.shards import DataError

Kind = Literal["text", "jsonl", "parquet"]
BATCH_BYTES = 1 << 20
BATCH_RECORDS = 4096
PIECE_BYTES = 4 << 20
READ_BYTES = 1 << 20
PARQUET_ROWS = 1024
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


class Record(NamedTuple):
    """One raw document, or a piece of one, or a note that the reader skipped some."""

    kind: Kind | Literal["skip"]
    file: str
    line: int
    """1-based line of a text file or JSONL file, row of a Parquet file."""
    raw: Any
    """bytes (text, jsonl, parquet); for skip, (documents, reason)."""
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


@dataclass
class Skipped:
    """Documents left out: how many, and the first few with their place and reason."""

    documents: int = 0
    examples: list[Problem] = field(default_factory=list)

    def add(self, problems: Sequence[Problem], documents: int) -> None:
        self.documents += documents
        self.examples.extend(problems[: MAX_EXAMPLES - len(self.examples)])

    def to_json(self) -> dict[str, Any]:
        return {
            "documents": self.documents,
            "examples": [vars(p) for p in self.examples],
        }


def kind_of(path: Path) -> Kind:
    name = path.name.lower()
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    return "parquet" if name.endswith(".parquet") else "text"


def _hidden(path: Path) -> bool:
    return any(part.startswith(".") for part in path.parts)


def find_sources(inputs: Sequence[Path]) -> list[Source]:
    """Files as given, and the files under folders in name order (hidden ones skipped)."""
    files: list[Path] = []
    for p in map(Path, inputs):
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file())
            files += [f for f in found if not _hidden(f.relative_to(p))]
        elif p.is_file():
            files.append(p)
        else:
            raise DataError(f"{p}: no such file or folder")
    if not files:
        raise DataError(f"no files in {', '.join(map(str, inputs))}")
    return [Source(f, kind_of(f), f.stat().st_size) for f in files]


# --- reading (one process) ---------------------------------------------------------------


def read_batches(
    sources: Sequence[Source], *, text_column: str = "text", batch_bytes: int = BATCH_BYTES
) -> Iterator[list[Record]]:
    """Every source's records in order, in batches of about `batch_bytes`."""
    batch: list[Record] = []
    size = 0
    for source in sources:
        for record in _records(source, text_column):
            batch.append(record)
            size += len(record.raw) if isinstance(record.raw, bytes) else 0
            if size >= batch_bytes or len(batch) >= BATCH_RECORDS:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch


def _records(source: Source, text_column: str) -> Iterator[Record]:
    if source.kind == "jsonl":
        return _jsonl_records(source.path)
    if source.kind == "parquet":
        return _parquet_records(source.path, text_column)
    return _text_records(source.path, source.size)


def _text_records(path: Path, size: int) -> Iterator[Record]:
    file = str(path)
    if size <= PIECE_BYTES:
        yield Record("text", file, 1, path.read_bytes())
        return
    bad = _first_bad_utf8(path)
    if bad is not None:
        yield Record("skip", file, bad[0], (1, bad[1]))
        return
    line, rest = 1, b""
    with open(path, "rb") as f:
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


def _first_bad_utf8(path: Path) -> tuple[int, str] | None:
    """(line, reason) of the first byte that is not UTF-8, reading in blocks."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    line = 1
    with open(path, "rb") as f:
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


def _jsonl_records(path: Path) -> Iterator[Record]:
    file = str(path)
    line = 0
    try:
        with _open_jsonl(path) as f:
            for line, raw in enumerate(f, 1):
                yield Record("jsonl", file, line, raw)
    except (OSError, EOFError, zlib.error, _ZstdError) as exc:
        raise DataError(f"{file}: unreadable after line {line} ({exc})") from exc


def _open_jsonl(path: Path) -> io.BufferedIOBase:
    if path.name.lower().endswith(".gz"):
        return gzip.open(path, "rb")
    if path.name.lower().endswith(".zst"):
        return io.BufferedReader(_ZstdFrames(open(path, "rb")), READ_BYTES)
    return open(path, "rb")


class _ZstdError(Exception):
    """A .zst file that ends inside a frame, or is not zstd."""


class _ZstdFrames(io.RawIOBase):
    """zstd frames one after another, as one stream; one that ends inside a frame is an
    error (zstandard's own stream reader ends quietly there)."""

    def __init__(self, raw: IO[bytes]) -> None:
        import zstandard

        self.raw, self.zstd = raw, zstandard
        self.dctx = zstandard.ZstdDecompressor()
        self.frame: Any = None
        self.pending = b""
        self.out = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.out:
            data = self.pending or self.raw.read(READ_BYTES)
            self.pending = b""
            if not data:
                if self.frame is not None and not self.frame.eof:
                    raise _ZstdError("the file ends inside a zstd frame: truncated?")
                return 0
            if self.frame is None or self.frame.eof:
                self.frame = self.dctx.decompressobj()
            try:
                self.out = self.frame.decompress(data)
            except self.zstd.ZstdError as exc:
                raise _ZstdError(f"not zstd data: {exc}") from exc
            if self.frame.eof:
                self.pending = self.frame.unused_data
        n = min(len(buffer), len(self.out))
        buffer[:n] = self.out[:n]
        self.out = self.out[n:]
        return n

    def close(self) -> None:
        self.raw.close()
        super().close()


def _parquet_records(path: Path, column: str) -> Iterator[Record]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    file = str(path)
    row = 1
    try:
        parquet = pq.ParquetFile(path)
        schema, rows = parquet.schema_arrow, parquet.metadata.num_rows
        if (problem := _column_problem(schema, column)) is not None:
            if rows:
                yield Record("skip", file, 1, (rows, f"{problem}: all {rows} rows skipped"))
            return
        # Values go out as bytes: the parsing process checks UTF-8 and says which row is bad.
        for batch in parquet.iter_batches(batch_size=PARQUET_ROWS, columns=[column]):
            for value in batch.column(0).cast(pa.large_binary()).to_pylist():
                yield Record("parquet", file, row, value)
                row += 1
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"{file}: unreadable as Parquet at row {row} ({exc})") from exc


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
        if record.kind == "skip":
            documents, reason = record.raw
            out.problems.append(Problem(record.file, record.line, reason))
            out.skipped += documents
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
    """Parsed batches in one process (tokenizer training); problems go to `skipped` too."""
    for records in read_batches(sources, text_column=text_column):
        parsed = parse_batch(records, text_field)
        skipped.add(parsed.problems, parsed.skipped)
        yield parsed

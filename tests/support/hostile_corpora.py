"""Corpora that compress far better than text (a long document of one repeated byte), written
without holding them, and the peak memory of a real `trainctl data prepare` over them.

A prepare's memory must be bounded by its batch whatever the compression ratio
(docs/design/data.md, "Datasets"): these are the issue's three examples, at any size.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

MiB = 1 << 20
NORMAL_DOCUMENTS = 200


def normal_lines() -> list[bytes]:
    return [json.dumps({"text": text}).encode() + b"\n" for text in normal_texts()]


def normal_texts() -> list[str]:
    return [f"document {i} " * 40 for i in range(NORMAL_DOCUMENTS)]


def _long_json_line(out: Any, size: int) -> None:
    """`{"text": "aaa..."}` of `size` bytes of text, written a MiB at a time."""
    out.write(b'{"text": "')
    for start in range(0, size, MiB):
        out.write(b"a" * min(MiB, size - start))
    out.write(b'"}\n')


def gz_with_a_long_line(path: Path, line_bytes: int) -> int:
    """Normal JSONL lines around one of `line_bytes`; the line number of the long one."""
    lines = normal_lines()
    with gzip.open(path, "wb", compresslevel=1) as out:
        out.writelines(lines[:100])
        _long_json_line(out, line_bytes)
        out.writelines(lines[100:])
    return 101


def zst_of_many_lines(path: Path, total_bytes: int, line_bytes: int = 100_000) -> int:
    """`total_bytes` of JSONL documents of `line_bytes` each, in one zstd frame (which holds
    hundreds of MB in a few KB); how many documents."""
    line = json.dumps({"text": "b" * (line_bytes - 13)}).encode() + b"\n"
    count = total_bytes // len(line)
    with open(path, "wb") as raw, zstandard.ZstdCompressor().stream_writer(raw) as out:
        for _ in range(count):
            out.write(line)
    return count


def parquet_with_a_long_value(path: Path, value_bytes: int, *, alone: bool) -> int:
    """Normal rows around one value of `value_bytes`: in a row group of its own (`alone`),
    else first in one with ten others (a writer puts them in one page with it); its row
    number."""
    texts, schema = normal_texts(), pa.schema([("text", pa.string())])
    long = "a" * value_bytes
    with pq.ParquetWriter(path, schema) as writer:
        writer.write_table(pa.table({"text": texts[:100]}, schema=schema))
        if alone:
            writer.write_table(pa.table({"text": [long]}, schema=schema))
            writer.write_table(pa.table({"text": texts[100:]}, schema=schema))
        else:
            writer.write_table(pa.table({"text": [long, *texts[100:110]]}, schema=schema))
            writer.write_table(pa.table({"text": texts[110:]}, schema=schema))
    return 101


def parquet_with_a_repeated_value(path: Path, value_bytes: int, rows: int) -> int:
    """The normal rows, then one value of `value_bytes` in `rows` rows, dictionary-encoded: its
    dictionary page holds it once, and each row is an index of a few bits (the issue's 1.5 KB
    file held 8,192 rows of a 1.5 MB value); its first row."""
    texts = normal_texts()
    schema = pa.schema([("text", pa.dictionary(pa.int32(), pa.string()))])
    # Written from a dictionary array, never decoded here; without the Arrow schema the
    # column reads back as plain text, as another writer's file would.
    normal = pa.DictionaryArray.from_arrays(pa.array(range(len(texts)), pa.int32()), texts)
    repeated = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), ["a" * value_bytes])
    with pq.ParquetWriter(
        path, schema, store_schema=False, dictionary_pagesize_limit=1 << 30
    ) as writer:
        writer.write_table(pa.table({"text": normal}, schema=schema))
        writer.write_table(pa.table({"text": repeated}, schema=schema))
    assert path.stat().st_size < value_bytes  # the value once, compressed
    return len(texts) + 1


def small_corpus(path: Path) -> None:
    """The same kind of file, without the long document: the baseline."""
    if path.name.endswith(".parquet"):
        pq.write_table(pa.table({"text": normal_texts()}), path)
    elif path.name.endswith(".zst"):
        path.write_bytes(zstandard.ZstdCompressor().compress(b"".join(normal_lines())))
    else:
        with gzip.open(path, "wb") as out:
            out.writelines(normal_lines())


@dataclass(frozen=True)
class Prepared:
    peak_bytes: int
    """The prepare process's peak resident memory (and that of any process it waited for)."""
    dataset: dict[str, Any]
    """Its dataset.json."""
    stderr: str


# Started from a small process: Linux carries the high-water mark of the memory a process
# replaces across exec into its ru_maxrss, so a prepare started by pytest itself (hundreds of
# MB) would report at least pytest's size, and its own growth below that would not show.
_LAUNCHER = """
import json, os, subprocess, sys
with subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL) as proc:
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
print(json.dumps({"code": proc.returncode, "maxrss": usage.ru_maxrss}))
"""


def prepare_peak(corpus: Path, out: Path, *args: str) -> Prepared:
    """Run `trainctl data prepare` (bytes, one process) in a process of its own; its peak
    resident memory, as the kernel counted it (`wait4`'s ru_maxrss, in a small launcher)."""
    command = [sys.executable, "-c", _LAUNCHER, sys.executable, "-m", "trainctl.service.cli",
               "data", "prepare", str(corpus), "--out", str(out), "--workers", "1",
               "--val-fraction", "0", *args]  # fmt: skip
    done = subprocess.run(command, capture_output=True, check=True)
    stderr = done.stderr.decode()
    launched = json.loads(done.stdout)
    assert launched["code"] == 0, stderr
    dataset = json.loads((out / "dataset.json").read_text())
    return Prepared(launched["maxrss"] * 1024, dataset, stderr)

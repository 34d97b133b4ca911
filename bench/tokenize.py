"""Datasets (issue 14): the tokenization throughput of `prepare_dataset` against tokenizers'
own `encode_batch` on the same documents in one process, both on every core; and the peak
memory of a prepare for a 100 MB and a 1 GB corpus.

- Corpus: stdlib source as JSONL, a file a document, repeated until the size is reached; each
  repeat permutes the vowels (`str.translate`), so words differ between repeats and neither
  side gets a corpus of copies that its BPE word cache would flatter.
- Tokenizer: a byte-level BPE trained here with `train_tokenizer` on stdlib source.
- Throughput: prepare end to end (read, parse JSON, tokenize in `workers` = every core
  processes, write shards) against the peer a user writes by hand: the texts already in
  memory, `Tokenizer.encode_batch` on 1,000 documents at a time (tokenizers' own threads on
  every core), the ids into one numpy array. Alternated rounds; the ratio is the median of
  the per-round ratios of the peer's time to prepare's. `encode_batch_fast` (no offsets), the
  strongest in-process peer, is reported beside it.
- Peak memory: the prepare runs in a child process (`python -c`); a thread reads the RSS of
  that process and of its tokenizing processes every 0.1 s (/proc) and keeps the peak of
  their sum, and of the largest one. (`getrusage`'s ru_maxrss cannot say this: the sum is no
  process's, and a child's starts from its parent's RSS at the fork.)
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import Figure, alternate, median, paired_ratio
from trainctl.store.data.prepare import prepare_dataset
from trainctl.store.data.shards import stdlib_source_files
from trainctl.store.data.tokenizer import load_tokenizer, train_tokenizer

FULL: dict[str, Any] = dict(vocab=16_384, speed_mb=48, rounds=3, rss_mb=(100, 1000))
QUICK: dict[str, Any] = dict(vocab=4_096, speed_mb=4, rounds=1, rss_mb=(8, 32))
PEER_BATCH = 1000
CHILD = """
import sys
from pathlib import Path
from trainctl.store.data.prepare import prepare_dataset
prepare_dataset([Path(sys.argv[1])], Path(sys.argv[2]), Path(sys.argv[3]))
"""


def stdlib_texts() -> list[str]:
    return [p.read_text(encoding="utf-8", errors="replace") for p in stdlib_source_files()]


def write_corpus(path: Path, texts: list[str], megabytes: float) -> int:
    """JSONL of `texts` repeated with variations until `megabytes`; returns its documents."""
    vowels, documents, size = "aeiou", 0, 0
    with open(path, "w", encoding="utf-8") as f:
        for perm in itertools.cycle(itertools.permutations(vowels)):
            table = str.maketrans(vowels, "".join(perm))
            for text in texts:
                line = json.dumps({"text": text.translate(table)}) + "\n"
                f.write(line)
                documents += 1
                size += len(line.encode())
                if size >= megabytes * 1e6:
                    return documents
    raise AssertionError("unreachable: the permutations cycle")


def read_texts(path: Path) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def peer_seconds(tokenizer: Any, texts: list[str], fast: bool = False) -> tuple[float, int]:
    """(seconds, tokens) of encode_batch over `texts`, ids gathered into one array."""
    encode = tokenizer.encode_batch_fast if fast else tokenizer.encode_batch
    started = time.perf_counter()
    arrays = []
    for i in range(0, len(texts), PEER_BATCH):
        for encoding in encode(texts[i : i + PEER_BATCH]):
            arrays.append(np.array(encoding.ids, dtype=np.uint32))
    tokens = np.concatenate(arrays)
    return time.perf_counter() - started, int(tokens.size)


def prepare_seconds(corpus: Path, out: Path, tokenizer: Path) -> tuple[float, int]:
    """(seconds, tokens without the end-of-text separators) of a prepare on every core."""
    started = time.perf_counter()
    dataset = prepare_dataset([corpus], out, tokenizer, val_fraction=0.05)
    seconds = time.perf_counter() - started
    splits = dataset.splits.values()
    tokens = sum(s.tokens for s in splits) - sum(s.documents for s in splits)
    shutil.rmtree(out)
    return seconds, tokens


def tree_rss(pid: int) -> list[int]:
    """Resident bytes of `pid` and of every process below it."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            parents[int(entry.name)] = int(fields[1])
            rss[int(entry.name)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):  # it exited while we looked
            continue
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [p for p, pp in parents.items() if pp == parent and p not in tree]
        tree.update(children)
        frontier.extend(children)
    return [rss.get(p, 0) for p in tree]


def peak_rss(corpus: Path, out: Path, tokenizer: Path) -> tuple[float, float, float]:
    """(peak RSS of the process tree, of its largest process, seconds) of a prepare in a
    child process; bytes."""
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(corpus), str(out), str(tokenizer)])
    peak = [0, 0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.1):
            sizes = tree_rss(child.pid)
            peak[:] = max(peak[0], sum(sizes)), max(peak[1], *sizes)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    code = child.wait()
    done.set()
    sampler.join()
    if code != 0:
        raise RuntimeError(f"the prepare child exited {code}")
    shutil.rmtree(out)
    return float(peak[0]), float(peak[1]), time.perf_counter() - started


def run(quick: bool = False) -> list[Figure]:
    size = QUICK if quick else FULL
    texts = stdlib_texts()
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(dir=os.environ.get("TRAINCTL_BENCH_TMP")) as tmp:
        root = Path(tmp)
        files = stdlib_source_files()
        tokenizer_file = train_tokenizer(files, root / "tok", size["vocab"])
        tokenizer = load_tokenizer(tokenizer_file)
        figures = throughput(root, texts, tokenizer, tokenizer_file, size, cores)
        return figures + memory(root, texts, tokenizer_file, size)


def throughput(
    root: Path, texts: list[str], tokenizer: Any, tokenizer_file: Path, size: dict[str, Any],
    cores: int,
) -> list[Figure]:  # fmt: skip
    corpus = root / "speed.jsonl"
    write_corpus(corpus, texts, size["speed_mb"])
    same_texts = read_texts(corpus)
    tokens: dict[str, int] = {}

    def side(name: str, measure: Any) -> Any:
        def timed() -> float:
            seconds, tokens[name] = measure()
            return seconds

        return timed

    sides = {
        "prepare": side("prepare", lambda: prepare_seconds(corpus, root / "out", tokenizer_file)),
        "peer": side("peer", lambda: peer_seconds(tokenizer, same_texts)),
        "fast": side("fast", lambda: peer_seconds(tokenizer, same_texts, fast=True)),
    }
    times = alternate(sides, size["rounds"])
    assert len(set(tokens.values())) == 1, tokens  # the same documents, the same tokens
    note = f"{size['speed_mb']} MB JSONL, vocab {size['vocab']:,}, {cores} cores"
    return [
        Figure("tokenize: prepare_dataset tokens/s", tokens["prepare"] / median(times["prepare"]),
               "tok/s", note=note),
        Figure("tokenize: encode_batch tokens/s (texts in memory)",
               tokens["peer"] / median(times["peer"]), "tok/s"),
        Figure("tokenize: prepare / encode_batch", paired_ratio(times["peer"], times["prepare"]),
               "x", target=0.9),
        Figure("tokenize: encode_batch_fast tokens/s (no offsets)",
               tokens["fast"] / median(times["fast"]), "tok/s"),
        Figure("tokenize: prepare / encode_batch_fast",
               paired_ratio(times["fast"], times["prepare"]), "x"),
    ]  # fmt: skip


def memory(
    root: Path, texts: list[str], tokenizer_file: Path, size: dict[str, Any]
) -> list[Figure]:
    peaks = []
    figures = []
    for megabytes in size["rss_mb"]:
        corpus = root / f"rss-{megabytes}.jsonl"
        documents = write_corpus(corpus, texts, megabytes)
        tree, largest, seconds = peak_rss(corpus, root / "out", tokenizer_file)
        corpus.unlink()
        peaks.append(tree)
        figures += [
            Figure(f"tokenize: peak RSS, prepare of {megabytes} MB (all processes)", tree / 2**20,
                   "MiB", target=1536, lower_is_better=True,
                   note=f"{documents:,} documents in {seconds:.0f} s"),
            Figure(f"tokenize: peak RSS, prepare of {megabytes} MB (largest process)",
                   largest / 2**20, "MiB"),
        ]  # fmt: skip
    small, large = size["rss_mb"]
    figures.append(
        Figure(f"tokenize: peak RSS {large} MB / {small} MB", peaks[1] / peaks[0], "x",
               target=1.25, lower_is_better=True)
    )  # fmt: skip
    return figures

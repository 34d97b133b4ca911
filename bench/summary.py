"""The summary table of docs/performance.md, written from records, never by hand.

`bench/results.json` holds one record per row of the table: what the row compares, its figure,
target and verdict, the date and machine of the run that gave the figure, and a note. A full
`python -m bench` (not `--quick`: its sizes are a smoke test's) rewrites the records of the rows
whose figures it measured, then the table; `python -m bench --summary` rewrites the table from
the records alone. `ROWS` says which figures make each row and how they read: the one place a
bench figure meets the doc. A row without an entry (the GPU session's, `bench/gpu.sh`) is
edited in the records by hand; tests/bench/test_summary.py fails when the table in the doc is
not the one the records write."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.common import Figure

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results.json"
DOC = REPO / "docs" / "performance.md"
BEGIN = "<!-- summary: written by `python -m bench` from bench/results.json; edit those -->"
END = "<!-- end of summary -->"


@dataclass
class Record:
    """One row of the summary table."""

    row: str
    what: str
    figure: str
    target: str
    met: str
    date: str
    """The day of the run that gave `figure`; empty for a row never measured."""
    machine: str
    note: str = ""
    """About this figure; a new run's figure replaces it with nothing."""


def verdict(figures: Sequence[Figure]) -> str:
    """yes when every figure with a target meets it, **no** when one misses it, – for a row
    that is only reported."""
    met = [f.met for f in figures if f.met is not None]
    if not met:
        return "–"
    return "yes" if all(met) else "**no**"


def times(digits: int) -> Callable[[list[float]], str]:
    return lambda v: " / ".join(f"{x:.{digits}f}×" for x in v)


def scientific(value: float) -> str:
    """3.0e6, not 3.0e+06."""
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def per_model(digits: int) -> Callable[[list[float]], str]:
    return lambda v: (
        f"{v[0]:.{digits}f}× / {v[1]:.{digits}f}× (tiny, batch 1 / 8); "
        f"{v[2]:.{digits}f}× / {v[3]:.{digits}f}× (d256x4)"
    )


def stalls(figures: Sequence[Figure]) -> str:
    blocking, background = (bool(f.met) for f in figures)
    return {
        (True, True): "yes",
        (False, True): "background only",
        (True, False): "blocking only",
        (False, False): "**no**",
    }[(blocking, background)]


def state_per_rank(figures: Sequence[Figure]) -> str:
    """fsdp holds 1/W of ddp's state per rank (within 5 %); peak RSS is reported."""
    exact = all(abs(f.value * w - 1) <= 0.05 for f, w in zip(figures[:2], (2, 4), strict=True))
    return "yes (state)" if exact else "**no** (state)"


def within_noise(figures: Sequence[Figure]) -> str:
    return "yes" if abs(figures[0].value - 1) <= 0.05 else "**no**"


@dataclass(frozen=True)
class Row:
    figures: tuple[str, ...]
    """The names of the figures the row reads, in the order `show` takes their values."""
    show: Callable[[list[float]], str]
    judge: Callable[[Sequence[Figure]], str] = field(default=verdict)


GENERATE = "generate {} b{} 256 new tokens: "
MODELS = [("tiny", 1), ("tiny", 8), ("d256x4", 1), ("d256x4", 8)]
CLAIMS = "claims: throughput, 8 workers, {} queued"
SHARDED = "sharded checkpoint: async stall"
FSDP = "fsdp vs ddp: W={} {}/rank, fsdp / ddp"

ROWS: dict[str, Row] = {
    "1": Row(("service overhead: API / direct",), times(3)),
    "2": Row(("model step: trainctl (AdamW) / HF Llama (AdamW)",), times(3)),
    "3": Row(("time to quality: peer time / trainctl time",), times(2)),
    "4a": Row(
        ("checkpoint: trainctl sync / raw", "checkpoint: trainctl sync / raw + fsync"),
        lambda v: f"{v[0]:.3f}× ({v[1]:.3f}× of raw + fsync)",
    ),
    "4b": Row(
        ("checkpoint: async stall / sync save", "checkpoint: async stall per save (steady state)"),
        lambda v: f"{v[0]:.3f}× (stall {v[1]:.3f} s)",
    ),
    "5a": Row(("data: loader / train step",), lambda v: f"{scientific(v[0])}×"),
    "5b": Row(("data: data_wait_frac per step (small, after step 1)",), lambda v: f"{v[0]:.3f}"),
    "6a": Row(("API under load: p99 latency",), lambda v: f"{v[0]:.1f} ms"),
    "6b": Row(("API under load: errors",), lambda v: f"{v[0]:.0f}"),
    "6c": Row(("download: HTTP / cat | cat",), times(2)),
    "8a": Row(
        ("tokenize: prepare / encode_batch", "tokenize: prepare / encode_batch_fast"),
        lambda v: f"{v[0]:.3f}×; {v[1]:.3f}× of `encode_batch_fast`",
    ),
    "8b": Row(
        tuple(f"tokenize: peak RSS, prepare of {mb} MB (all processes)" for mb in (100, 1000)),
        lambda v: f"{v[0]:.0f} / {v[1]:.0f} MiB",
    ),
    "8c": Row(("tokenize: peak RSS 1000 MB / 100 MB",), times(3)),
    "8d": Row(
        ("bits per byte: bytes", "bits per byte: BPE 4,096", "bits per byte: bytes / BPE"),
        lambda v: f"{v[0]:.3f} / {v[1]:.3f} ({v[2]:.2f}×)",
    ),
    "9a": Row(
        tuple(GENERATE.format(*m) + "KV cache vs transformers generate" for m in MODELS),
        per_model(2),
    ),
    "9b": Row(
        tuple(GENERATE.format(*m) + "KV cache speed-up over recomputation" for m in MODELS),
        per_model(1),
    ),
    "10a": Row(
        (
            "claims: 2-node gang, both placed median",
            "claims: 1-node run, claim median",
            "claims: gang / 1-node, median",
            "claims: 2-node gang, both placed p99",
            "claims: 1-node run, claim p99",
            "claims: gang / 1-node, p99",
        ),
        lambda v: (
            f"{v[0]:.1f} / {v[1]:.1f} ms = {v[2]:.2f}× "
            f"(p99 {v[3]:.1f} / {v[4]:.1f} ms = {v[5]:.2f}×)"
        ),
    ),
    "10b": Row(
        (
            CLAIMS.format("1,000"),
            CLAIMS.format("10,000"),
            "claims: throughput 10,000 / 1,000 queued",
        ),
        # the measurement raises unless every run was claimed exactly once
        lambda v: (
            f"{v[0]:.0f} / {v[1]:.0f} runs/s (10k / 1k = {v[2]:.2f}×), every run claimed once"
        ),
    ),
    "11a": Row(("hf train: trainctl loop / plain loop",), times(3)),
    "11b": Row(
        ("hf vs gpt: gpt / llama tokens/s", "hf vs gpt: llama / gpt time to the same val loss"),
        lambda v: f"{v[0]:.3f}×; {v[1]:.3f}×",
    ),
    "11c": Row(("hf train: benchmark run / trainctl loop",), times(3), within_noise),
    "12a": Row(
        (
            "sharded muon: step time, ShardedMuon / torch.optim.Muon",
            "sharded muon: collectives/step, ShardedMuon",
            "sharded muon: collectives/step, torch.optim.Muon",
        ),
        lambda v: f"{v[0]:.3f}× ({v[1]:.0f} against {v[2]:.0f})",
    ),
    "12b": Row(("sharded checkpoint: gathered / sharded save time",), times(2)),
    "12c": Row(
        (f"{SHARDED} / sync sharded save", f"{SHARDED}, background staging / sync"),
        times(3),
        stalls,
    ),
    "12d": Row(
        tuple(FSDP.format(w, what) for what in ("state", "peak RSS") for w in (2, 4)),
        lambda v: f"{v[0]:.3f}× / {v[1]:.3f}× ({v[2]:.2f}× / {v[3]:.2f}×)",
        state_per_rank,
    ),
    "12e": Row(("fsdp vs ddp: W=2: step time, fsdp / ddp",), times(3)),
}


def load(path: Path = RESULTS) -> list[Record]:
    return [Record(**r) for r in json.loads(path.read_text(encoding="utf-8"))]


def save(records: list[Record], path: Path = RESULTS) -> None:
    text = json.dumps([asdict(r) for r in records], indent=2, ensure_ascii=False)
    path.write_text(text + "\n", encoding="utf-8")


def record(records: list[Record], figures: list[Figure], date: str, machine: str) -> list[str]:
    """Give each row whose figures are all in `figures` the new figure, verdict, date and
    machine (and no note); the rows it updated."""
    by_name = {f.name: f for f in figures}
    updated = []
    for r in records:
        row = ROWS.get(r.row)
        if row is None or not all(name in by_name for name in row.figures):
            continue
        found = [by_name[name] for name in row.figures]
        r.figure = row.show([f.value for f in found])
        r.met = row.judge(found)
        r.date, r.machine, r.note = date, machine, ""
        updated.append(r.row)
    return updated


def table(records: list[Record]) -> str:
    cells = [(r.row, r.what, r.figure, r.target, r.met, r.date or "–", r.note) for r in records]
    lines = [
        "| # | what | figure | target | met? | run | note |",
        "|---|---|---|---|---|---|---|",
        *("| " + " | ".join(row) + " |" for row in cells),
    ]
    machines: dict[str, list[str]] = {}
    for r in records:
        if r.machine:
            machines.setdefault(r.machine, []).append(r.row)
    if len(machines) == 1:
        lines += ["", f"Every row with a date ran on: {next(iter(machines))}."]
    else:
        lines += ["", *(f"Rows {', '.join(rows)} ran on: {m}." for m, rows in machines.items())]
    return "\n".join(lines)


def rewrite(doc: str, records: list[Record]) -> str:
    """The doc with the table between its markers written from the records."""
    pattern = re.compile(re.escape(BEGIN) + r"\n.*?\n" + re.escape(END), re.DOTALL)
    if not pattern.search(doc):
        raise ValueError(f"docs/performance.md has no summary markers ({BEGIN} ... {END})")
    return pattern.sub(lambda _: f"{BEGIN}\n{table(records)}\n{END}", doc, count=1)


def write_doc(records: list[Record], path: Path = DOC) -> None:
    path.write_text(rewrite(path.read_text(encoding="utf-8"), records), encoding="utf-8")


def this_machine() -> str:
    """Cores, GPUs and torch, as the records name a machine."""
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if torch.cuda.is_available():
        gpus = f"{torch.cuda.device_count()}× {torch.cuda.get_device_name(0)}"
    else:
        gpus = "no GPU"
    return f"{cores} CPU cores, {gpus}, torch {torch.__version__}"

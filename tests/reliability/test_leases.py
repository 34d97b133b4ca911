"""Leases, with real worker processes: a worker that stops heartbeating (SIGSTOP) loses its
run once the lease is reaped; the run is requeued while attempts remain, then failed with the
reason. A worker that comes back (SIGCONT) is fenced: nothing it writes reaches the run (no
event, no progress, no finish, no checkpoint), and it goes on serving other runs.

The reaper is called with a `now` past the lease instead of sleeping through it.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from store.checkpoints import CheckpointStore
from store.runs import Run, RunStore
from store.specs import TrainSpec, resolve_train

REPO = Path(__file__).resolve().parents[2]
TERMINAL = ("succeeded", "failed", "cancelled")
PAST_THE_LEASE = timedelta(minutes=5)


def poll(predicate: Callable[[], Any], timeout: float = 120.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class Workers:
    """`python -m worker` processes with fixed ids, each logging to its own file."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, worker_id: str) -> subprocess.Popen[bytes]:
        args = ["--data-dir", str(self.data_dir), "--worker-id", worker_id]
        args += ["--heartbeat-seconds", "0.5", "--poll-seconds", "0.1"]
        with open(self.log_path(worker_id), "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "worker", *args], cwd=REPO, stderr=log)
        self.procs[worker_id] = proc
        return proc

    def log_path(self, worker_id: str) -> Path:
        return self.data_dir / f"{worker_id}.log"

    def log(self, worker_id: str) -> str:
        return self.log_path(worker_id).read_text(errors="replace")

    def stall(self, worker_id: str) -> None:
        """SIGSTOP the worker, at a moment it does not hold SQLite's write lock.

        A process stopped inside a write transaction would block every writer, the reaper
        included: a property of SQLite (one writer at a time), not of leases.
        """
        proc = self.procs[worker_id]
        for _ in range(100):
            os.kill(proc.pid, signal.SIGSTOP)
            if self._write_lock_is_free():
                return
            os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.01)
        raise AssertionError(f"{worker_id} always held the database write lock")

    def _write_lock_is_free(self) -> bool:
        conn = sqlite3.connect(self.data_dir / "trainctl.db", timeout=0.2, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            conn.close()

    def resume(self, worker_id: str) -> None:
        os.kill(self.procs[worker_id].pid, signal.SIGCONT)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
            proc.wait()


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[RunStore]:
    store = RunStore(f"sqlite:///{tmp_path / 'trainctl.db'}")
    store.create_all()
    yield store
    store.close()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    pool = Workers(tmp_path)
    yield pool
    pool.close()


def enqueue_train(runs: RunStore, experiment: str, steps: int, max_attempts: int = 3) -> Run:
    spec = TrainSpec(
        experiment=experiment,
        steps=steps,
        model={"preset": "tiny"},
        data={"source": "synthetic"},
        batch={"micro_batch_size": 2, "seq_len": 32},
        checkpoint_every=5,
        val_every=1_000_000,
        val_batches=1,
    )
    spec = resolve_train(spec, cuda_available=False, data_roots=[])
    return runs.enqueue(
        "train", experiment, spec.model_dump(mode="json"), max_attempts=max_attempts
    )


def wait_running(runs: RunStore, run: Run, worker_id: str, past_step: int) -> Run:
    def running() -> Run | None:
        r = runs.get(run.id)
        ok = r.state == "running" and r.worker_id == worker_id and r.progress["step"] > past_step
        return r if ok else None

    return poll(running, what=f"{worker_id} training run {run.id} past step {past_step}")


def reap(runs: RunStore) -> list[Run]:
    return runs.reap_expired(now=datetime.now(UTC) + PAST_THE_LEASE)


def checkpoints(root: Path, experiment: str) -> dict[str, str]:
    """Tag -> manifest text of every complete checkpoint: any new or rewritten one shows."""
    store = CheckpointStore(root)
    return {c.tag: (c.path / "manifest.json").read_text() for c in store.list(experiment)}


def test_a_stalled_worker_loses_its_run_to_the_reaper_and_is_fenced_when_it_returns(
    tmp_path: Path, runs: RunStore, workers: Workers
) -> None:
    root = tmp_path / "checkpoints"
    run = enqueue_train(runs, "lease", steps=1_000_000, max_attempts=2)
    workers.start("worker-a")
    wait_running(runs, run, "worker-a", past_step=5)  # step_5 is saved: there is a resume point
    workers.stall("worker-a")

    assert [r.id for r in reap(runs)] == [run.id]
    requeued = runs.get(run.id)
    assert (requeued.state, requeued.attempt, requeued.worker_id) == ("queued", 2, None)
    reason = runs.events(run.id, type="state")[-1].data["reason"]
    assert "lease expired" in reason and "worker-a" in reason and "attempt 2 of 2" in reason

    workers.start("worker-b")
    wait_running(runs, run, "worker-b", past_step=requeued.progress["step"] or 0)
    workers.stall("worker-b")
    assert [r.id for r in reap(runs)] == [run.id]
    failed = runs.get(run.id)
    assert failed.state == "failed" and failed.attempt == 2
    assert "worker-b stopped heartbeating" in (failed.error or "")
    assert "no attempts remain" in (failed.error or "")

    reap_mark = runs.events(run.id)[-1].id
    saved = checkpoints(root, "lease")
    workers.resume("worker-a")
    workers.resume("worker-b")
    for worker_id in ("worker-a", "worker-b"):
        poll(
            lambda w=worker_id: "leaving it to its new owner" in workers.log(w),  # type: ignore[misc]
            what=f"{worker_id} to notice it lost its lease",
        )
    after = runs.get(run.id)
    assert (after.state, after.error, after.attempt) == ("failed", failed.error, 2)
    assert after.progress == failed.progress and after.result is None
    assert runs.events(run.id, after_id=reap_mark) == [], "a fenced worker wrote an event"
    assert checkpoints(root, "lease") == saved, "a fenced worker published a checkpoint"

    # Both come back to serve: B leaves (SIGTERM, graceful), and A takes the next run.
    workers.procs["worker-b"].send_signal(signal.SIGTERM)
    assert workers.procs["worker-b"].wait(timeout=60) == 0
    nxt = enqueue_train(runs, "after", steps=3)
    done = poll(lambda: (r := runs.get(nxt.id)).state in TERMINAL and r, what="the next run")
    assert (done.state, done.worker_id) == ("succeeded", "worker-a"), done.error

"""Preemption that loses no work (docs/operations.md, "Preemption and drain"): SIGTERM or a
drain request gives the running train run `TRAINCTL_DRAIN_SECONDS` to save on the async path
and hand back; a save that cannot commit by then is abandoned and invisible. Real worker
processes on a SQLite run store; the bucket case against its own SeaweedFS server."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from tests.polling import poll
from tests.reliability.workers import Workers, enqueue_tiny_train, wait_finished
from tests.stores import posix_store
from trainctl.store.db.runs import Run, RunStore

STEPS = 300
"""Long enough that SIGTERM lands mid-run (a tiny step takes milliseconds), short enough that
the second worker finishes it in seconds."""


def wait_step(runs: RunStore, run: Run, step: int) -> None:
    poll(lambda: (runs.get(run.id).progress["step"] or 0) >= step, what=f"step {step}")


def drain_report(runs: RunStore, run: Run) -> dict[str, Any]:
    """What the drain's log event says of its save (worker.executor `maybe_log_drain`)."""
    reports = [e.data["drain"] for e in runs.events(run.id, type="log") if "drain" in e.data]
    assert len(reports) == 1, reports
    report: dict[str, Any] = reports[0]
    return report


def resumed_from(runs: RunStore, run: Run, tag: str) -> bool:
    return any(f"resuming from {tag}" in e.data["message"] for e in runs.events(run.id, type="log"))


@pytest.mark.slow
def test_sigterm_saves_at_the_step_reached_and_a_second_worker_finishes_the_run(
    runs: RunStore, workers: Workers, tmp_path: Path
) -> None:
    # No periodic save: the only checkpoint before the end is the drain's.
    run = enqueue_tiny_train(runs, "sigterm", STEPS, checkpoint_every=STEPS)
    first = workers.start("first")
    wait_step(runs, run, 3)
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=120) == 0, workers.logs()

    requeued = runs.get(run.id)
    assert (requeued.state, requeued.attempt) == ("queued", 1)  # no attempt used up
    saved = posix_store(tmp_path / "checkpoints").latest("sigterm")
    assert saved.run_id == run.id and saved.step == requeued.progress["step"] < STEPS
    report = drain_report(runs, run)
    assert report["abandoned"] is None
    assert 0 < report["stopped_seconds"] <= report["committed_seconds"]

    workers.start("second")
    done = wait_finished(runs, run)
    assert (done.state, done.attempt) == ("succeeded", 1), done.error
    assert resumed_from(runs, run, saved.tag)

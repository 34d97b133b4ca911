"""Leases, with real worker processes: a worker that stops heartbeating (SIGSTOP) loses its
run once the lease is reaped; the run is requeued while attempts remain, then failed with the
reason. A worker that comes back (SIGCONT) is fenced: nothing it writes reaches the run (no
event, no progress, no finish, no checkpoint), and it goes on serving other runs.

The reaper is called with a `now` past the lease instead of sleeping through it.
"""

from __future__ import annotations

import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.reliability.workers import (
    Workers,
    checkpoint_manifests,
    enqueue_tiny_train,
    wait_finished,
)
from tests.support.polling import poll
from trainctl.store.db.records import Run
from trainctl.store.db.runs import RunStore

PAST_THE_LEASE = timedelta(minutes=5)


def wait_running(runs: RunStore, run: Run, worker_id: str, past_step: int) -> Run:
    def running() -> Run | None:
        r = runs.get(run.id)
        step = r.progress["step"] or 0
        ok = r.state == "running" and r.worker_id == worker_id and step > past_step
        return r if ok else None

    return poll(running, what=f"{worker_id} training run {run.id} past step {past_step}")


def reap(runs: RunStore) -> list[Run]:
    return runs.reap_expired(now=datetime.now(UTC) + PAST_THE_LEASE)


def test_a_stalled_worker_loses_its_run_to_the_reaper_and_is_fenced_when_it_returns(
    tmp_path: Path, runs: RunStore, workers: Workers
) -> None:
    root = tmp_path / "checkpoints"
    run = enqueue_tiny_train(runs, "lease", 1_000_000, checkpoint_every=5, max_attempts=2)
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
    saved = checkpoint_manifests(root, "lease")
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
    assert checkpoint_manifests(root, "lease") == saved, "a fenced worker published a checkpoint"

    # Both come back to serve: B leaves (SIGTERM, graceful), and A takes the next run.
    workers.procs["worker-b"].send_signal(signal.SIGTERM)
    assert workers.procs["worker-b"].wait(timeout=60) == 0
    done = wait_finished(runs, enqueue_tiny_train(runs, "after", 3, checkpoint_every=3))
    assert (done.state, done.worker_id) == ("succeeded", "worker-a"), done.error

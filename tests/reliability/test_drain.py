"""Preemption that loses no work (docs/operations.md, "Preemption and drain"): SIGTERM or a
drain request gives the running train run `TRAINCTL_DRAIN_SECONDS` to save on the async path
and hand back; a save that cannot commit by then is abandoned and invisible. Real worker
processes on a SQLite run store; the bucket case against its own SeaweedFS server."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.e2e.plugin_env import ECHO, install_plugin
from tests.reliability.workers import Workers, drain_reports, enqueue_tiny_train, wait_finished
from tests.support.plans import enqueue, validate_plan
from tests.support.polling import poll
from tests.support.s3server import S3Server, running_s3_server
from tests.support.stores import posix_store, s3_store
from trainctl.store.db.records import Run
from trainctl.store.db.runs import RunStore

STEPS = 100
"""Long enough that SIGTERM lands mid-run (a tiny step takes milliseconds), short enough that
the second worker finishes it in seconds."""


def wait_step(runs: RunStore, run: Run, step: int) -> None:
    poll(lambda: (runs.get(run.id).progress["step"] or 0) >= step, what=f"step {step}")


def resumed_from(runs: RunStore, run: Run, tag: str) -> bool:
    return any(f"resuming from {tag}" in e.data["message"] for e in runs.events(run.id, type="log"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "nproc",
    # Two ranks (torchrun, the drain's start handed to them in a file) take 50 s on 2 cores:
    # make soak runs them; make test the path in the worker process.
    [pytest.param(1, id="in-the-worker"), pytest.param(2, id="two-ranks", marks=pytest.mark.soak)],
)
def test_sigterm_saves_at_the_step_reached_and_a_second_worker_finishes_the_run(
    runs: RunStore, workers: Workers, tmp_path: Path, nproc: int
) -> None:
    # No periodic save: the only checkpoint before the end is the drain's.
    run = enqueue_tiny_train(runs, "sigterm", STEPS, checkpoint_every=STEPS, nproc_per_node=nproc)
    first = workers.start("first")
    wait_step(runs, run, 3)
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=120) == 0, workers.logs()

    requeued = runs.get(run.id)
    assert (requeued.state, requeued.attempt) == ("queued", 1)  # no attempt used up
    saved = posix_store(tmp_path / "checkpoints").latest("sigterm")
    assert saved.run_id == run.id and saved.step == requeued.progress["step"]
    assert saved.step is not None and saved.step < STEPS
    (report,) = drain_reports(runs, run)
    assert report["abandoned"] is None
    assert 0 < report["stopped_seconds"] <= report["committed_seconds"]

    workers.start("second")
    done = wait_finished(runs, run)
    assert (done.state, done.attempt) == ("succeeded", 1), done.error
    assert resumed_from(runs, run, saved.tag)


@pytest.mark.slow
def test_a_validate_run_stops_within_a_batch_and_is_handed_back_before_the_deadline(
    runs: RunStore, workers: Workers, tmp_path: Path
) -> None:
    trained = enqueue_tiny_train(runs, "v", 1, checkpoint_every=1)
    worker = workers.start("w", {**os.environ, "TRAINCTL_DRAIN_SECONDS": "30"})
    assert wait_finished(runs, trained).state == "succeeded"
    validate = validate_plan(tmp_path / "checkpoints", checkpoint="v/step_1", num_batches=100_000)
    run = enqueue(runs, validate)
    poll(lambda: runs.get(run.id).state == "running", what="the validate run to start")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=120) == 0, workers.logs()

    requeued = runs.get(run.id)
    assert (requeued.state, requeued.attempt) == ("queued", 1)
    reason = runs.events(run.id, type="state")[-1].data["reason"]
    assert reason == "worker shutting down; the run continues later"  # its own stop, in time


@pytest.fixture(scope="module")
def echo_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of an environment where the `echo` plug-in kind is installed."""
    env, source = tmp_path_factory.mktemp("echo-env"), tmp_path_factory.mktemp("echo-src")
    return install_plugin(env, source, "trainctl_echo", ECHO)


@pytest.mark.slow
def test_a_run_whose_unit_of_work_outlasts_the_deadline_is_handed_back_at_it(
    runs: RunStore, workers: Workers, echo_python: Path
) -> None:
    # Every built-in kind stops within one unit of its work (worker/stops.py); a unit longer
    # than the deadline (here a plug-in's sleep that checks for no stop) must not hold the
    # worker: the deadline hands the run back and ends the process.
    plan = {"message": "hold", "steps": 3, "experiment": "echo", "hold_seconds": 600}
    run = runs.enqueue("echo", "echo", plan)
    env = {**os.environ, "TRAINCTL_DRAIN_SECONDS": "1"}
    worker = workers.start("w", env, python=str(echo_python))
    poll(lambda: runs.get(run.id).progress["step"] == 1, what="the echo run's first line")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0, workers.logs()

    requeued = runs.get(run.id)
    assert (requeued.state, requeued.attempt) == ("queued", 1)
    assert "did not stop within 1 s" in runs.events(run.id, type="state")[-1].data["reason"]


def bucket_env(server: S3Server, bucket: str) -> dict[str, str]:
    return {
        **os.environ,
        "TRAINCTL_STORAGE_URL": f"s3://{bucket}/fleet",
        **server.environ(),
        "TRAINCTL_DRAIN_SECONDS": "2",
    }


@contextmanager
def frozen(server: S3Server) -> Iterator[None]:
    """The server frozen (SIGSTOP) for the block, and always thawed after it."""
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.pid, signal.SIGCONT)


@pytest.mark.slow
def test_a_save_that_misses_the_deadline_is_abandoned_and_the_previous_checkpoint_stays_latest(
    runs: RunStore, workers: Workers, tmp_path: Path
) -> None:
    # Its own server: it is frozen mid-test, which the session's shared one must never be.
    (tmp_path / "s3").mkdir()
    with running_s3_server(tmp_path / "s3") as server:
        bucket = server.new_bucket()
        env = bucket_env(server, bucket)
        store = s3_store(server, bucket, tmp_path / "reader-cache", "fleet/checkpoints")
        run = enqueue_tiny_train(runs, "frozen", 100_000, checkpoint_every=100_000)
        first = workers.start("first", env)
        wait_step(runs, run, 3)
        first.send_signal(signal.SIGTERM)  # the bucket answers: this save commits
        assert first.wait(timeout=120) == 0, workers.logs()
        previous = store.latest("frozen")

        second = workers.start("second", env)
        wait_step(runs, run, (previous.step or 0) + 3)  # resumed: done with the bucket
        with frozen(server):
            second.send_signal(signal.SIGTERM)
            # It hands back and exits while the bucket is still frozen.
            assert second.wait(timeout=120) == 0, workers.logs()
            requeued = runs.get(run.id)
            assert (requeued.state, requeued.attempt) == ("queued", 1)
            report = drain_reports(runs, run)[-1]
            assert report["abandoned"] and report["committed_seconds"] is None

        assert store.latest("frozen").tag == previous.tag
        assert [i.tag for i in store.list_checkpoints("frozen")] == [previous.tag]
        workers.start("third", env)
        poll(lambda: resumed_from(runs, run, previous.tag), what="resume from the previous")

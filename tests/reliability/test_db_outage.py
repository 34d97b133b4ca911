"""Database outages, with a real PostgreSQL of these tests' own and real worker processes
(docs/design/runs.md, "Database outages"). A paused server (SIGSTOP of its whole process tree)
accepts and acknowledges and never answers; a restarted one refuses, then answers again.

- shorter than the lease: the run trains on through it and succeeds in its first attempt;
- longer than the lease: the run stops at a step, commits nothing, and is resumed exactly once
  from the last checkpoint committed before the outage;
- a restart during a run: the run survives, or resumes once;
- an outage as the run finishes: its success is kept, and the run never starts again;
- attempts: a run whose worker dies every time ends failed at max_attempts, with the last
  attempt's error; a run that raises fails at once with its error;
- the API answers 503 while the database is down, and serves again once it is back.

Leases of 6 s with heartbeats every 0.5 s keep the outages short.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.reliability.workers import (
    Workers,
    checkpoint_manifests,
    enqueue_tiny_train,
    wait_finished,
)
from tests.support.pg import PostgresServer
from tests.support.plans import enqueue, enqueue_vanished_resume, train_plan
from tests.support.polling import poll
from tests.support.stores import folder, posix_store
from trainctl.service.app import create_app
from trainctl.service.settings import Settings
from trainctl.store.db.outages import STALL_PATIENCE_SECONDS, STALL_PROBE_SECONDS
from trainctl.store.db.records import Run
from trainctl.store.db.runs import RunStore
from trainctl.store.exceptions import LeaseLost
from trainctl.worker.context import RunContext
from trainctl.worker.reporter import Reporter

LEASE = ["--lease-seconds", "6"]
SHORTER_THAN_THE_LEASE = 3.0
PAUSED_API_SECONDS = 20.0
"""How long the API's test pauses the server: a request that waited for it would take that."""
DOCS_PAUSE = 20.0
"""docs/operations.md's example: a pause of 20 s within the default 30 s lease."""
LONGER_THAN_THE_LEASE = 9.0
PAST_THE_LEASE = timedelta(minutes=5)


@pytest.fixture(scope="module")
def server() -> Iterator[PostgresServer]:
    """A server these tests pause and restart: not the session's, which other tests share."""
    server = PostgresServer().start()
    yield server
    server.stop()


@pytest.fixture
def database(server: PostgresServer) -> Iterator[str]:
    with server.database() as url:
        yield url


@pytest.fixture
def runs(database: str) -> Iterator[RunStore]:
    with RunStore(database) as store:
        store.create_all()
        yield store


@pytest.fixture
def workers(tmp_path: Path, database: str) -> Iterator[Workers]:
    pool = Workers(tmp_path, database)
    yield pool
    pool.close()


def starts(runs: RunStore, run: Run) -> list[int]:
    """The attempt of each time the run was claimed."""
    moves = [e.data for e in runs.events(run.id, type="state")]
    return [m["attempt"] for m in moves if m["state"] == "running"]


def wait_step(runs: RunStore, run: Run, past: int) -> int:
    def step() -> int | None:
        r = runs.get(run.id)
        return r.state == "running" and (r.progress["step"] or 0) > past and r.progress["step"]

    return int(poll(step, what=f"run {run.id} past step {past}"))


def messages(runs: RunStore, run: Run) -> list[str]:
    return [e.data["message"] for e in runs.events(run.id, type="log", limit=100_000)]


def test_a_pause_shorter_than_the_lease_neither_stops_nor_repeats_the_run(
    server: PostgresServer, runs: RunStore, workers: Workers
) -> None:
    run = enqueue_tiny_train(runs, "short", 100, checkpoint_every=1000)
    workers.start("w", extra_args=LEASE)
    before = wait_step(runs, run, past=3)

    server.pause()
    try:
        time.sleep(SHORTER_THAN_THE_LEASE)  # the outage itself, not a wait for a result
    finally:
        server.resume()

    done = wait_finished(runs, run)
    assert (done.state, done.attempt, starts(runs, run)) == ("succeeded", 1, [1]), done.error
    said = re.search(
        r"took [\d.]+ s to answer; meanwhile training went on to step (\d+)", workers.log("w")
    )
    assert said is not None, workers.logs()
    assert int(said[1]) > before + 2, "training waited for the database"
    metrics = runs.events(run.id, type="metrics")
    steps = [e.data["step"] for e in metrics if e.data.get("kind") == "train"]
    assert steps == list(range(1, 101)), "a report was lost or repeated"


@pytest.mark.slow
def test_the_pause_the_docs_name_with_checkpoints_due_and_a_reaper_costs_nothing(
    server: PostgresServer, runs: RunStore, workers: Workers
) -> None:
    """docs/operations.md: a pause shorter than the lease (30 s, the default) costs nothing.
    20 s of it, with a checkpoint due meanwhile (its commit waits to confirm the lease, on a
    pool whose open connections are all held by the paused queries, so it opens a new one,
    which the paused server lets time out) and a reaper polling as the service's does."""
    run = enqueue_tiny_train(runs, "docs-pause", 1_000_000, checkpoint_every=10)
    workers.start("w")  # the default lease: 30 s
    wait_step(runs, run, past=12)
    stop = threading.Event()

    def reap() -> None:
        while not stop.wait(1.0):
            try:
                runs.reap_expired()
            except Exception:  # the paused database: as the supervisor's tick, try again
                continue

    reaper = threading.Thread(target=reap, daemon=True)
    reaper.start()
    paused_at = time.monotonic()
    server.pause()
    try:
        time.sleep(DOCS_PAUSE)  # the outage itself, not a wait for a result
    finally:
        server.resume()
    try:
        after = wait_step(runs, run, past=(runs.get(run.id).progress["step"] or 0) + 25)
        assert time.monotonic() - paused_at > DOCS_PAUSE
    finally:
        stop.set()
        reaper.join()
        runs.request_cancel(run.id)
    done = wait_finished(runs, run)
    moves = [(e.data["state"], e.data["reason"]) for e in runs.events(run.id, type="state")]
    claims = [reason for _, reason in moves if reason.startswith("claimed by")]
    assert (done.state, done.attempt, claims) == ("cancelled", 1, ["claimed by w"]), (
        moves,
        workers.log("w")[-3000:],
    )
    assert after > 25 and posix_store(workers.data_dir / "checkpoints").latest_or_none(
        "docs-pause"
    ), "no checkpoint was committed"


@pytest.mark.slow
def test_a_pause_longer_than_the_lease_stops_the_run_and_resumes_it_once(
    tmp_path: Path, server: PostgresServer, runs: RunStore, workers: Workers
) -> None:
    root = tmp_path / "checkpoints"
    run = enqueue_tiny_train(runs, "long", 100, checkpoint_every=25)
    workers.start("w", extra_args=LEASE)
    wait_step(runs, run, past=26)  # step_25 is committed: a checkpoint to resume from

    server.pause()
    try:
        # It stops at a step, or at a save that cannot confirm the lease: both commit nothing.
        poll(lambda: "leaving it to its new owner" in workers.log("w"), what="the run to stop")
        saved = checkpoint_manifests(root, "long")
        time.sleep(2)  # the outage goes on: nothing more may be committed
        assert checkpoint_manifests(root, "long") == saved, "a save during the outage"
    finally:
        server.resume()

    done = wait_finished(runs, run)
    assert (done.state, done.attempt, starts(runs, run)) == ("succeeded", 2, [1, 2]), done.error
    last = max((t for t in saved if t.startswith("step_")), key=lambda t: int(t[5:]))
    assert f"attempt 2: resuming from {last} of this run" in messages(runs, run)


def test_a_restart_of_the_database_during_a_run_costs_at_most_one_attempt(
    server: PostgresServer, runs: RunStore, workers: Workers
) -> None:
    run = enqueue_tiny_train(runs, "restart", 100, checkpoint_every=50)
    workers.start("w", extra_args=LEASE)
    wait_step(runs, run, past=3)

    server.stop_server()
    server.start_server()
    runs.engine.dispose()  # this test's own connections died with the server

    done = wait_finished(runs, run)
    assert done.state == "succeeded", done.error
    assert starts(runs, run) in ([1], [1, 2]), workers.logs()


def test_a_run_that_succeeds_during_an_outage_keeps_its_success_and_never_starts_again(
    tmp_path: Path, server: PostgresServer, runs: RunStore, workers: Workers
) -> None:
    run = enqueue_tiny_train(runs, "ends", 30, checkpoint_every=1000)
    workers.start("w", extra_args=LEASE)
    final = folder(posix_store(tmp_path / "checkpoints"), "ends", "step_30") / "manifest.json"
    poll(final.exists, what="the run's last checkpoint", interval=0.001)

    server.stop_server()
    time.sleep(7)  # longer than the lease, while the worker waits to report its success
    server.start_server()
    runs.engine.dispose()
    # The reaper may come first: the run is queued again, unclaimed, when the success lands.
    reaped = runs.reap_expired(now=datetime.now(UTC) + PAST_THE_LEASE)

    done = wait_finished(runs, run)
    assert (done.state, done.result is not None, starts(runs, run)) == ("succeeded", True, [1])
    if reaped:
        reason = runs.events(run.id, type="state")[-1].data["reason"]
        assert "reported after its lease was reaped" in reason


def test_a_success_reported_after_a_reap_counts_only_while_nobody_has_claimed_the_run(
    runs: RunStore,
) -> None:
    def reaped(worker: str) -> Run:
        run = enqueue(runs, train_plan(experiment=worker, steps=5))
        assert runs.claim(worker, lease_seconds=6) is not None
        assert [r.id for r in runs.reap_expired(now=datetime.now(UTC) + PAST_THE_LEASE)] == [run.id]
        return run

    late = reaped("a")
    done = runs.finish(late.id, "a", 1, "succeeded", result={"step": 5})
    assert (done.state, done.result, runs.get(late.id).state) == (
        "succeeded",
        {"step": 5},
        "succeeded",
    )
    assert runs.claim("b", lease_seconds=6) is None

    failed = reaped("c")
    with pytest.raises(LeaseLost):  # a failure is retried: the next attempt may succeed
        runs.finish(failed.id, "c", 1, "failed", error="boom")
    assert runs.get(failed.id).state == "queued"
    runs.request_cancel(failed.id)  # out of the way of the next claim

    taken = reaped("d")
    assert runs.claim("e", lease_seconds=6) is not None
    with pytest.raises(LeaseLost):  # attempt 2 runs: it reports the run
        runs.finish(taken.id, "d", 1, "succeeded", result={})
    assert (runs.get(taken.id).state, runs.get(taken.id).worker_id) == ("running", "e")


def test_attempts_never_reset_a_run_failing_every_time_stops_at_max_attempts(
    runs: RunStore, workers: Workers
) -> None:
    raising = enqueue_vanished_resume(runs)
    workers.start("a", extra_args=LEASE)
    failed = wait_finished(runs, raising)
    assert (failed.state, failed.attempt, starts(runs, raising)) == ("failed", 1, [1])
    assert "step_999" in (failed.error or "")  # an error fails the run at once, with itself

    run = enqueue_tiny_train(runs, "killed", 100_000, checkpoint_every=1000, max_attempts=2)
    for worker in ("a", "b"):
        if worker not in workers.procs:
            workers.start(worker, extra_args=LEASE)

        def claimed(by: str = worker) -> bool:
            return runs.get(run.id).worker_id == by

        poll(claimed, what=f"{worker} to claim")
        workers.procs[worker].kill()
        workers.procs[worker].wait()
        runs.reap_expired(now=datetime.now(UTC) + PAST_THE_LEASE)

    done = runs.get(run.id)
    assert (done.state, done.attempt, starts(runs, run)) == ("failed", 2, [1, 2])
    assert "b stopped heartbeating" in (done.error or "")
    assert "no attempts remain (2 of 2 used)" in (done.error or "")


def test_the_api_answers_503_while_the_database_is_down_and_serves_again_after(
    tmp_path: Path, server: PostgresServer, database: str
) -> None:
    app = create_app(Settings(data_dir=tmp_path, workers=0, database_url=database))
    with TestClient(app, base_url="http://localhost") as client:
        assert client.get("/runs").status_code == 200
        server.stop_server()
        try:
            down = client.get("/runs")
        finally:
            server.start_server()
        assert (down.status_code, down.headers.get("retry-after")) == (503, "5"), down.text
        assert "run database" in down.json()["detail"]
        poll(lambda: client.get("/runs").status_code == 200, what="the API to serve again")


def test_the_api_answers_503_at_once_while_the_database_is_paused(
    tmp_path: Path, server: PostgresServer, database: str
) -> None:
    """A paused server answers nothing and refuses nothing: without a watch, /readyz and
    GET /runs would wait as long as the pause. They answer 503 within seconds instead, and
    serve again once it is over."""
    settings = Settings(data_dir=tmp_path, workers=0, database_url=database)
    with TestClient(create_app(settings), base_url="http://localhost") as client:
        assert client.get("/runs").status_code == 200
        server.pause()
        resume = threading.Timer(PAUSED_API_SECONDS, server.resume)
        resume.start()
        try:
            time.sleep(STALL_PATIENCE_SECONDS + 2 * STALL_PROBE_SECONDS)  # the watch's own wait
            for path in ("/readyz", "/runs", "/workers"):
                started = time.monotonic()
                answer = client.get(path)
                took = time.monotonic() - started
                assert answer.status_code == 503, (path, answer.text)
                assert "run database has not answered" in answer.json()["detail"]
                assert answer.headers.get("retry-after") == "5"
                assert took < PAUSED_API_SECONDS / 3, f"{path} waited {took:.1f} s for the pause"
        finally:
            resume.cancel()
            server.resume()
        poll(lambda: client.get("/runs").status_code == 200, what="the API to serve again")
        assert client.get("/readyz").json()["database"] == "ok"


def test_reports_wait_for_the_database_in_order_and_in_bounded_memory(
    server: PostgresServer, runs: RunStore, caplog: pytest.LogCaptureFixture
) -> None:
    enqueue(runs, train_plan(experiment="held", steps=5))
    run = runs.claim("w", lease_seconds=60)
    assert run is not None
    ctx = RunContext(run, runs, "w", threading.Event(), lease_seconds=60)
    ctx.reporter = Reporter(ctx, max_held=3)
    with ctx:
        server.pause()
        try:
            for step in range(1, 6):  # none of these waits for the paused database
                ctx.metrics({"step": step, "total_steps": 5})
        finally:
            server.resume()
        ctx.reporter.flush()

    steps = [e.data["step"] for e in runs.events(run.id, type="metrics")]
    # The bound (3 held) and the write under way, if the thread took one before the pause:
    # in order, the oldest kept, the overflow dropped.
    assert steps[:3] == [1, 2, 3] and len(steps) <= 4 and steps == sorted(set(steps)), steps
    assert "dropping new ones until it answers" in caplog.text
    assert runs.get(run.id).progress["step"] == 5  # progress is a value: the newest wins

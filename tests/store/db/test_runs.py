"""The run queue and event log (store/db/runs.py), on SQLite (the embedded default) and on a real
PostgreSQL server (many nodes): every test that takes `store` or `url` runs on both."""

from __future__ import annotations

import base64
import multiprocessing
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, select

from tests.support.pg import PostgresServer
from trainctl.store.db.records import Run
from trainctl.store.db.runs import RunStore
from trainctl.store.db.schema import run_events, runs, write_transaction
from trainctl.store.exceptions import (
    Conflict,
    ExperimentBusy,
    InvalidRequest,
    LeaseLost,
    RunNotCancellable,
    RunNotFound,
)


@pytest.fixture
def url(database_url: str) -> str:
    return database_url


@pytest.fixture
def store(url: str) -> Iterator[RunStore]:
    with RunStore(url) as run_store:
        run_store.create_all()
        yield run_store


def claimed_train_run(store: RunStore, experiment: str = "exp", **kwargs: Any) -> Run:
    """Enqueue a train run and claim it as worker w1."""
    store.enqueue("train", experiment, {"steps": 10}, **kwargs)
    run = store.claim("w1", lease_seconds=60)
    assert run is not None
    return run


def expire(run: Run) -> Any:
    """A `now` just past the run's lease, so reaping needs no sleep."""
    assert run.lease_expires_at is not None
    return run.lease_expires_at + timedelta(seconds=1)


# ---- enqueue, get, list --------------------------------------------------------------------


def test_enqueued_run_is_queued_and_reads_back_the_same(store: RunStore) -> None:
    run = store.enqueue("benchmark", "exp", {"steps": 5}, depends_on=[("exp", "best")])

    assert run.state == "queued"
    assert run.attempt == 1
    assert run.progress == {"step": 0, "total_steps": None}
    assert run.created_at.tzinfo is UTC
    assert run.depends_on == [("exp", "best")]
    assert store.get(run.id) == run


def test_getting_an_unknown_run_raises_run_not_found(store: RunStore) -> None:
    with pytest.raises(RunNotFound, match="nope"):
        store.get("nope")


def test_list_filters_by_kind_state_and_experiment(store: RunStore) -> None:
    train = store.enqueue("train", "a", {})
    validate = store.enqueue("validate", "a", {})
    other = store.enqueue("benchmark", "b", {})
    store.request_cancel(other.id)

    def ids(**filters: Any) -> list[str]:
        return [run.id for run in store.list_runs(**filters)[0]]

    assert ids(kind="train") == [train.id]
    assert ids(experiment="a") == [validate.id, train.id]
    assert ids(state="cancelled") == [other.id]
    assert ids(state="queued", experiment="b") == []


def test_list_pages_through_every_run_newest_first(store: RunStore) -> None:
    created = [store.enqueue("benchmark", "exp", {"n": n}).id for n in range(7)]

    pages: list[list[str]] = []
    cursor: str | None = None
    while True:
        page, cursor = store.list_runs(limit=3, cursor=cursor)
        pages.append([run.id for run in page])
        if cursor is None:
            break

    assert [len(page) for page in pages] == [3, 3, 1]
    assert [run_id for page in pages for run_id in page] == created[::-1]


def test_a_full_last_page_has_no_next_cursor(store: RunStore) -> None:
    for n in range(3):
        store.enqueue("benchmark", "exp", {"n": n})

    page, cursor = store.list_runs(limit=3)

    assert len(page) == 3
    assert cursor is None


@pytest.mark.slow
@pytest.mark.parametrize(
    "cursor",
    [
        "not base64 at all!",
        base64.urlsafe_b64encode(b"[1, 2, 3]").decode(),
        base64.urlsafe_b64encode(b'["2024-01-01T00:00:00", 1]').decode(),  # no timezone
        base64.urlsafe_b64encode(b'["2024-01-01T00:00:00+00:00", "1"]').decode(),
    ],
)
def test_a_malformed_cursor_is_an_invalid_request(store: RunStore, cursor: str) -> None:
    with pytest.raises(InvalidRequest, match="invalid cursor"):
        store.list_runs(cursor=cursor)


# ---- idempotency and one active train run per experiment ---------------------------------


def test_retrying_with_the_same_key_and_body_returns_the_first_run(store: RunStore) -> None:
    first = store.enqueue("train", "exp", {"lr": 0.02}, idempotency_key="key-1")
    again = store.enqueue("train", "exp", {"lr": 0.02}, idempotency_key="key-1")

    assert again == first
    assert len(store.list_runs()[0]) == 1


def test_reusing_a_key_for_a_different_body_is_a_conflict(store: RunStore) -> None:
    first = store.enqueue("benchmark", "exp", {"steps": 5}, idempotency_key="key-1")

    with pytest.raises(Conflict, match=f"key-1.*different request.*{first.id}"):
        store.enqueue("benchmark", "exp", {"steps": 6}, idempotency_key="key-1")
    with pytest.raises(Conflict):
        store.enqueue("validate", "exp", {"steps": 5}, idempotency_key="key-1")


def test_a_second_active_train_run_of_an_experiment_is_refused(store: RunStore) -> None:
    first = store.enqueue("train", "exp", {})

    with pytest.raises(ExperimentBusy, match=first.id):
        store.enqueue("train", "exp", {})
    store.claim("w1", lease_seconds=60)
    with pytest.raises(ExperimentBusy):
        store.enqueue("train", "exp", {})


def test_train_runs_of_other_experiments_and_other_kinds_are_not_blocked(store: RunStore) -> None:
    store.enqueue("train", "exp", {})

    store.enqueue("train", "other", {})
    store.enqueue("validate", "exp", {})
    store.enqueue("benchmark", "exp", {})


def test_an_experiment_takes_a_new_train_run_once_the_last_one_finished(store: RunStore) -> None:
    run = claimed_train_run(store)
    store.finish(run.id, "w1", run.attempt, "succeeded")

    assert store.active_train_run("exp") is None
    assert store.enqueue("train", "exp", {}).state == "queued"


def test_active_train_run_is_the_queued_or_running_one(store: RunStore) -> None:
    assert store.active_train_run("exp") is None
    run = store.enqueue("train", "exp", {})

    active = store.active_train_run("exp")

    assert active is not None and active.id == run.id


# ---- claiming ------------------------------------------------------------------------------


def test_claim_takes_the_oldest_queued_run_and_none_when_empty(store: RunStore) -> None:
    first = store.enqueue("benchmark", "exp", {"n": 1})
    second = store.enqueue("benchmark", "exp", {"n": 2})

    claimed = store.claim("w1", lease_seconds=30)
    assert claimed is not None
    assert (claimed.id, claimed.state, claimed.worker_id) == (first.id, "running", "w1")
    assert claimed.started_at is not None and claimed.lease_expires_at is not None
    assert claimed.lease_expires_at - claimed.started_at == timedelta(seconds=30)

    again = store.claim("w2", lease_seconds=30)
    assert again is not None and again.id == second.id
    assert store.claim("w3", lease_seconds=30) is None


def _claim_until_empty(url: str, worker_id: str, start: Barrier, results: Any) -> None:
    """Body of one claiming process: start together with the others, claim until empty."""
    with RunStore(url) as run_store:
        claimed: list[str] = []
        start.wait()
        while (run := run_store.claim(worker_id, lease_seconds=60)) is not None:
            claimed.append(run.id)
        results.put((worker_id, claimed))


@pytest.mark.slow
def test_concurrent_claimers_in_separate_processes_never_share_a_run(
    store: RunStore, url: str
) -> None:
    processes, runs_per_process = 4, 50
    enqueued = {
        store.enqueue("benchmark", "exp", {"n": n}).id for n in range(processes * runs_per_process)
    }
    context = multiprocessing.get_context("spawn")
    start, results = context.Barrier(processes), context.Queue()
    claimers = [
        context.Process(target=_claim_until_empty, args=(url, f"w{i}", start, results))
        for i in range(processes)
    ]
    for process in claimers:
        process.start()
    by_worker = dict(results.get(timeout=120) for _ in claimers)
    for process in claimers:
        process.join(timeout=30)
    results.close()
    results.join_thread()

    claim_counts = Counter(run_id for ids in by_worker.values() for run_id in ids)
    assert [process.exitcode for process in claimers] == [0] * processes
    assert set(claim_counts) == enqueued
    assert set(claim_counts.values()) == {1}
    for worker_id, ids in by_worker.items():
        assert all(store.get(run_id).worker_id == worker_id for run_id in ids)


# ---- the worker's writes and their fence ---------------------------------------------------


def test_heartbeat_extends_the_lease(store: RunStore) -> None:
    run = claimed_train_run(store)

    store.heartbeat(run.id, "w1", run.attempt, lease_seconds=3600)

    lease = store.get(run.id).lease_expires_at
    assert lease is not None and run.lease_expires_at is not None
    assert lease > run.lease_expires_at


def test_progress_and_result_show_in_the_run(store: RunStore) -> None:
    run = claimed_train_run(store)

    store.set_progress(run.id, "w1", run.attempt, step=7, total_steps=10)
    assert store.get(run.id).progress == {"step": 7, "total_steps": 10}

    done = store.finish(run.id, "w1", run.attempt, "succeeded", result={"loss": 2.5})
    assert (done.state, done.result, done.error) == ("succeeded", {"loss": 2.5}, None)
    assert done.finished_at is not None and done.lease_expires_at is None


def test_a_reaped_worker_can_no_longer_write_to_its_run(store: RunStore) -> None:
    run = claimed_train_run(store)
    store.reap_expired(now=expire(run))
    other = store.claim("w2", lease_seconds=60)
    assert other is not None and other.id == run.id and other.attempt == 2

    stale = (run.id, "w1", run.attempt)
    with pytest.raises(LeaseLost, match="no longer owns"):
        store.heartbeat(*stale, lease_seconds=60)
    with pytest.raises(LeaseLost):
        store.set_progress(*stale, step=1, total_steps=10)
    with pytest.raises(LeaseLost):
        store.append_event(run.id, "log", {"line": "x"}, worker_id="w1", attempt=run.attempt)
    with pytest.raises(LeaseLost):
        store.finish(*stale, "succeeded")
    with pytest.raises(LeaseLost):
        store.requeue(*stale, reason="shutting down")
    assert store.get(run.id).state == "running"
    assert store.get(run.id).worker_id == "w2"


def test_the_same_worker_cannot_write_with_an_old_attempt(store: RunStore) -> None:
    run = claimed_train_run(store)
    store.reap_expired(now=expire(run))
    again = store.claim("w1", lease_seconds=60)
    assert again is not None and again.attempt == 2

    with pytest.raises(LeaseLost):
        store.heartbeat(run.id, "w1", attempt=1, lease_seconds=60)
    store.heartbeat(run.id, "w1", attempt=2, lease_seconds=60)


def test_requeue_gives_the_run_back_without_using_an_attempt(store: RunStore) -> None:
    run = claimed_train_run(store)

    back = store.requeue(run.id, "w1", run.attempt, reason="worker shutting down")

    assert (back.state, back.worker_id, back.attempt) == ("queued", None, 1)
    assert store.events(run.id)[-1].data["reason"] == "worker shutting down"
    with pytest.raises(LeaseLost):
        store.heartbeat(run.id, "w1", run.attempt, lease_seconds=60)


# ---- recovery ------------------------------------------------------------------------------


def test_reap_requeues_with_the_next_attempt_until_attempts_run_out(store: RunStore) -> None:
    run = claimed_train_run(store, max_attempts=2)

    [requeued] = store.reap_expired(now=expire(run))
    assert (requeued.state, requeued.attempt, requeued.worker_id) == ("queued", 2, None)
    assert store.events(run.id)[-1].data["reason"] == (
        "lease expired (worker w1 stopped heartbeating); requeued, attempt 2 of 2"
    )

    second = store.claim("w2", lease_seconds=60)
    assert second is not None
    [failed] = store.reap_expired(now=expire(second))
    assert failed.state == "failed"
    assert failed.error == (
        "worker w2 stopped heartbeating (lease expired) and no attempts remain (2 of 2 used)"
    )
    assert failed.finished_at is not None
    assert store.reap_expired(now=expire(second)) == []


def test_reap_leaves_runs_with_live_leases_alone(store: RunStore) -> None:
    run = claimed_train_run(store)
    assert run.lease_expires_at is not None

    assert store.reap_expired(now=run.lease_expires_at - timedelta(seconds=1)) == []
    assert store.get(run.id).state == "running"


def test_reaping_a_run_whose_cancel_was_requested_cancels_it(store: RunStore) -> None:
    run = claimed_train_run(store)
    store.request_cancel(run.id)

    [reaped] = store.reap_expired(now=expire(run))

    assert reaped.state == "cancelled"


def test_fail_worker_runs_recovers_only_that_workers_runs(store: RunStore) -> None:
    mine = claimed_train_run(store, "a", max_attempts=1)
    store.enqueue("train", "b", {})
    theirs = store.claim("w2", lease_seconds=60)
    assert theirs is not None

    [failed] = store.fail_worker_runs("w1", "worker process exited with code -9")

    assert failed.id == mine.id
    assert failed.error == "worker process exited with code -9 and no attempts remain (1 of 1 used)"
    assert store.get(theirs.id).state == "running"


# ---- cancel --------------------------------------------------------------------------------


def test_cancelling_a_queued_run_cancels_it_at_once(store: RunStore) -> None:
    run = store.enqueue("train", "exp", {})

    cancelled = store.request_cancel(run.id)

    assert cancelled.state == "cancelled"
    assert cancelled.finished_at is not None
    assert store.claim("w1", lease_seconds=60) is None


def test_cancelling_a_running_run_asks_its_worker_to_stop(store: RunStore) -> None:
    run = claimed_train_run(store)

    assert store.request_cancel(run.id).state == "running"
    assert store.is_cancel_requested(run.id)
    done = store.finish(run.id, "w1", run.attempt, "cancelled")

    assert done.state == "cancelled"


@pytest.mark.slow
@pytest.mark.parametrize("end_state", ["succeeded", "failed", "cancelled"])
def test_cancelling_a_finished_run_is_refused_naming_its_state(
    store: RunStore, end_state: str
) -> None:
    run = claimed_train_run(store)
    store.finish(run.id, "w1", run.attempt, end_state)

    with pytest.raises(RunNotCancellable, match=f"already {end_state}"):
        store.request_cancel(run.id)


def test_a_worker_requeueing_a_run_whose_cancel_was_requested_cancels_it(
    store: RunStore,
) -> None:
    run = claimed_train_run(store)
    store.request_cancel(run.id)

    assert store.requeue(run.id, "w1", run.attempt, reason="shutting down").state == "cancelled"


# ---- events and protected checkpoints ------------------------------------------------------


def test_events_come_back_in_id_order_after_the_given_id(store: RunStore) -> None:
    run = claimed_train_run(store)
    ids = [
        store.append_event(run.id, "metrics", {"step": step}, worker_id="w1", attempt=1)
        for step in range(5)
    ]

    assert ids == sorted(ids)
    after = store.events(run.id, after_id=ids[1], type="metrics")
    assert [event.data["step"] for event in after] == [2, 3, 4]
    assert [event.id for event in store.events(run.id, limit=2)] == [
        event.id for event in store.events(run.id)[:2]
    ]


@pytest.mark.slow
def test_an_event_of_a_run_waits_for_the_runs_open_event_write_so_ids_appear_in_order(
    store: RunStore,
) -> None:
    """A reader resuming after the newest id it saw must never skip an event that commits
    later with a smaller id (PostgreSQL hands out sequence ids at INSERT, not at COMMIT)."""
    run = claimed_train_run(store)
    mark = store.events(run.id)[-1].id
    with write_transaction(store.engine) as held:
        # An event write in progress that took its id but has not committed yet.
        held.execute(
            insert(run_events).values(
                run_id=run.id, type="log", data={"n": 1}, created_at=datetime.now(UTC)
            )
        )
        writer = threading.Thread(target=store.append_event, args=(run.id, "log", {"n": 2}))
        writer.start()
        writer.join(timeout=1.0)

        assert writer.is_alive(), "the second event was written while the first was open"
        assert store.events(run.id, after_id=mark) == []
    writer.join(timeout=30)

    assert [e.data["n"] for e in store.events(run.id, after_id=mark)] == [1, 2]


def test_postgresql_claim_skips_a_run_another_transaction_has_locked(
    postgres: PostgresServer,
) -> None:
    with postgres.database() as url, RunStore(url) as store:
        store.create_all()
        first = store.enqueue("benchmark", "exp", {"n": 1})
        second = store.enqueue("benchmark", "exp", {"n": 2})
        with store.engine.connect() as conn, conn.begin():
            conn.execute(select(runs.c.id).where(runs.c.id == first.id).with_for_update())

            claimed = store.claim("w2", lease_seconds=60)  # would wait here without SKIP LOCKED

        assert claimed is not None and claimed.id == second.id
        again = store.claim("w3", lease_seconds=60)
        assert again is not None and again.id == first.id


def test_every_state_change_is_in_the_event_log(store: RunStore) -> None:
    run = claimed_train_run(store)
    store.finish(run.id, "w1", run.attempt, "failed", error="loss is NaN at step 3")

    states = [(e.data["previous"], e.data["state"]) for e in store.events(run.id, type="state")]

    assert states == [("queued", "running"), ("running", "failed")]
    assert store.events(run.id)[-1].data["reason"] == "loss is NaN at step 3"


def test_events_of_an_unknown_run_raise_run_not_found(store: RunStore) -> None:
    with pytest.raises(RunNotFound):
        store.events("nope")
    with pytest.raises(RunNotFound):
        store.append_event("nope", "log", {"line": "x"})


def test_protected_checkpoints_are_what_queued_and_running_runs_need(store: RunStore) -> None:
    running = claimed_train_run(store, "a", depends_on=[("a", "step_100")])
    store.enqueue("validate", "b", {}, depends_on=[("b", "best"), ("a", "step_100")])
    done = store.enqueue("validate", "c", {}, depends_on=[("c", "best")])
    store.request_cancel(done.id)

    assert store.protected_checkpoints() == {("a", "step_100"), ("b", "best")}
    store.finish(running.id, "w1", running.attempt, "succeeded")
    assert store.protected_checkpoints() == {("b", "best"), ("a", "step_100")}


# ---- the database itself -------------------------------------------------------------------


def test_sqlite_uses_wal_and_waits_for_other_writers(tmp_path: Path) -> None:
    with RunStore(f"sqlite:///{tmp_path}/runs.db") as store, store.engine.connect() as conn:
        journal_mode = conn.exec_driver_sql("PRAGMA journal_mode").scalar()
        busy_timeout = conn.exec_driver_sql("PRAGMA busy_timeout").scalar()

    assert journal_mode == "wal"
    assert busy_timeout == 30_000


def test_runs_survive_reopening_the_database(store: RunStore, url: str) -> None:
    run = store.enqueue("benchmark", "exp", {"steps": 5})

    with RunStore(url) as reopened:
        assert reopened.get(run.id) == run

"""The sinks' cursors and leases (store/db/sinks.py), on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import update

from trainctl.store.db.records import Run
from trainctl.store.db.runs import RunStore
from trainctl.store.db.schema import sink_mirrors, write_transaction
from trainctl.store.db.sinks import DISCOVERY_GRACE, SinkStore, _new_mark
from trainctl.store.exceptions import LeaseLost


@pytest.fixture
def store(database_url: str) -> Iterator[RunStore]:
    with RunStore(database_url) as run_store:
        run_store.create_all()
        yield run_store


def sinks(store: RunStore, holder: str = "service-a", sink: str = "tensorboard") -> SinkStore:
    return SinkStore(store.engine, sink, holder, lease_seconds=30)


def train_run(store: RunStore, experiment: str, **spec: Any) -> Run:
    return store.enqueue("train", experiment, {"steps": 10, **spec})


@pytest.mark.slow
def test_an_idle_sink_has_no_work_and_a_train_run_gives_it_some(store: RunStore) -> None:
    tb = sinks(store)
    assert not tb.has_work()

    train_run(store, "a", trackers=["tensorboard"])

    assert tb.has_work()


@pytest.mark.slow
def test_discover_opens_cursors_only_for_runs_that_name_the_sink(store: RunStore) -> None:
    tb, mlflow = sinks(store), sinks(store, sink="mlflow")
    named = train_run(store, "a", trackers=["tensorboard", "mlflow"])
    train_run(store, "b", trackers=["mlflow"])
    train_run(store, "c", trackers=[])
    train_run(store, "d")  # a plan from before trackers existed
    store.enqueue("benchmark", "benchmark", {"steps": 1})
    assert tb.acquire() and mlflow.acquire()

    assert tb.discover() == [named.id]
    assert len(mlflow.discover()) == 2
    # The new runs are in the grace window and are looked at again, but opened once.
    assert tb.discover() == []
    cursor = tb.cursor(named.id)
    assert cursor is not None and cursor.last_event_id == 0 and cursor.memo == {}
    assert [c.run_id for c in tb.open_cursors(10)] == [named.id]


def test_the_mark_passes_runs_only_once_they_are_out_of_the_grace_window() -> None:
    now = datetime(2027, 1, 1, tzinfo=UTC)
    old, young = now - DISCOVERY_GRACE - timedelta(seconds=1), now - timedelta(seconds=1)

    assert _new_mark(0, [], now) == 0
    assert _new_mark(0, [(1, old), (4, old)], now) == 4
    assert _new_mark(0, [(1, old), (4, young), (5, old)], now) == 1  # stops at the young one
    assert _new_mark(7, [(8, young)], now) == 7


def test_one_service_holds_a_sink_until_it_lets_go(store: RunStore) -> None:
    a, b = sinks(store, "service-a"), sinks(store, "service-b")
    train_run(store, "a", trackers=["tensorboard"])

    assert a.acquire()
    assert not b.acquire()
    assert a.acquire()  # renewing
    with pytest.raises(LeaseLost, match="service-a"):
        b.discover()  # it would open a cursor: that is the holder's to do

    a.release()
    assert b.acquire() and not a.acquire()
    assert len(b.discover()) == 1


def test_a_lapsed_lease_is_taken_over_and_the_old_holder_can_no_longer_write(
    store: RunStore,
) -> None:
    a, b = sinks(store, "service-a"), sinks(store, "service-b")
    run = train_run(store, "a", trackers=["tensorboard"])
    assert a.acquire()
    a.discover()
    cursor = a.cursor(run.id)
    assert cursor is not None
    with write_transaction(store.engine) as conn:  # service-a stalled past its lease
        conn.execute(
            update(sink_mirrors).values(lease_expires_at=datetime.now(UTC) - timedelta(seconds=1))
        )

    assert b.acquire()
    with pytest.raises(LeaseLost, match="service-b"):
        a.save(cursor, last_event_id=5, memo={}, outage_since=None)
    assert b.save(cursor, last_event_id=5, memo={"x": 1}, outage_since=None).last_event_id == 5


def test_a_cursor_moves_only_from_where_its_saver_read_it(store: RunStore) -> None:
    tb = sinks(store)
    run = train_run(store, "a", trackers=["tensorboard"])
    assert tb.acquire()
    tb.discover()
    read = tb.cursor(run.id)
    assert read is not None

    moved = tb.save(read, last_event_id=3, memo={"run_id": "m1"}, outage_since=None)
    with pytest.raises(LeaseLost, match="moved from event 0"):
        tb.save(read, last_event_id=9, memo={}, outage_since=None)  # a stale copy

    tb.save(moved, last_event_id=4, memo=moved.memo, outage_since=None, done=True)
    assert tb.is_done(run.id) and tb.open_cursors(10) == []
    assert tb.cursor(run.id) == moved.__class__(run.id, "tensorboard", 4, {"run_id": "m1"}, None)


def finished_run(store: RunStore, experiment: str, trackers: list[str]) -> Run:
    """A train run that wrote one metric and succeeded."""
    store.enqueue("train", experiment, {"steps": 10, "trackers": trackers})
    run = store.claim("w", lease_seconds=60)
    assert run is not None
    store.append_event(run.id, "metrics", {"kind": "train", "step": 1, "loss": 2.0},
                       worker_id="w", attempt=run.attempt)  # fmt: skip
    return store.finish(run.id, "w", run.attempt, "succeeded", result={})


SCORES = {"kind": "eval", "step": 10, "evaluate_run": "e1", "eval/arc_easy/acc": 0.5}


def test_scores_recorded_on_an_ended_run_reopen_its_finished_cursors_but_a_refused_one(
    store: RunStore,
) -> None:
    tb, mlflow = sinks(store), sinks(store, sink="mlflow")
    run = finished_run(store, "a", ["tensorboard", "mlflow"])
    assert tb.acquire() and mlflow.acquire()
    tb.discover()
    mlflow.discover()
    last = store.events(run.id)[-1].id
    for sink, memo in ((tb, {}), (mlflow, {"refused": True})):
        cursor = sink.cursor(run.id)
        assert cursor is not None
        sink.save(cursor, last_event_id=last, memo=memo, outage_since=None, done=True)
    assert tb.is_done(run.id) and tb.open_cursors(10) == []

    store.append_event(run.id, "log", {"level": "info", "message": "not a metric"})
    assert tb.is_done(run.id)
    store.append_event(run.id, "metrics", SCORES)  # as an evaluate run records them

    assert not tb.is_done(run.id)
    assert [c.run_id for c in tb.open_cursors(10)] == [run.id]
    assert mlflow.is_done(run.id)  # it refused the run: it stays refused


def test_a_cursor_is_not_finished_past_an_event_it_has_not_taken(store: RunStore) -> None:
    tb = sinks(store)
    run = finished_run(store, "a", ["tensorboard"])
    assert tb.acquire()
    tb.discover()
    read = tb.cursor(run.id)
    assert read is not None
    taken = store.events(run.id)[-1].id
    # The scores land after the mirror read the log and before it marks the run done.
    store.append_event(run.id, "metrics", SCORES)

    tb.save(read, last_event_id=taken, memo={}, outage_since=None, done=True)

    assert not tb.is_done(run.id)
    cursor = tb.cursor(run.id)
    assert cursor is not None and cursor.last_event_id == taken

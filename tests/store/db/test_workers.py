"""The worker registry (store.db.workers.WorkerStore), on SQLite and PostgreSQL: workers
registered, heartbeating and deregistered, listed with the run their claim gave them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from trainctl.store.db.records import Run
from trainctl.store.db.runs import RunStore
from trainctl.store.db.workers import WorkerStore
from trainctl.store.exceptions import WorkerNotFound


@pytest.fixture
def store(database_url: str) -> Iterator[RunStore]:
    with RunStore(database_url) as run_store:
        run_store.create_all()
        yield run_store


def claimed_train_run(store: RunStore) -> Run:
    """A train run claimed by worker w1."""
    store.enqueue("train", "exp", {"steps": 10})
    run = store.claim("w1", lease_seconds=60)
    assert run is not None
    return run


def test_registered_workers_are_listed_with_their_current_run(store: RunStore) -> None:
    store.workers.register("w1", host="node1", pid=123, device="cuda:0", info={"gpu": "H200"})
    store.workers.register("w2", host="node1", pid=124, device="cpu", info={})
    run = claimed_train_run(store)
    store.workers.heartbeat("w1")

    listed = {worker.id: worker for worker in store.workers.list_workers()}

    assert listed["w1"].current_run_id == run.id
    assert listed["w1"].info == {"gpu": "H200"}
    assert listed["w1"].last_seen_at >= listed["w1"].started_at
    assert listed["w2"].current_run_id is None


def test_registering_a_worker_again_replaces_its_record(store: RunStore) -> None:
    store.workers.register("w1", host="node1", pid=1, device="cpu", info={})
    store.workers.register("w1", host="node1", pid=2, device="cpu", info={})

    assert [worker.pid for worker in store.workers.list_workers()] == [2]


def test_a_deregistered_worker_heartbeat_raises_worker_not_found(store: RunStore) -> None:
    store.workers.register("w1", host="node1", pid=1, device="cpu", info={})
    store.workers.deregister("w1")

    assert store.workers.list_workers() == []
    with pytest.raises(WorkerNotFound, match="w1"):
        store.workers.heartbeat("w1")


def test_a_registry_on_the_run_stores_engine_sees_what_the_runs_do(store: RunStore) -> None:
    """One database, one pool: a registry of its own on the run store's engine (as the
    token and webhook stores are) sees the worker a claim made busy and the drain that
    stops its next claim."""
    registry = WorkerStore(store.engine)
    registry.register("w1", host="node1", pid=1, device="cpu", info={})
    run = claimed_train_run(store)

    assert [w.current_run_id for w in registry.list_workers()] == [run.id]
    registry.drain("w1")
    store.enqueue("train", "other", {"steps": 10})
    assert store.workers.heartbeat("w1") is True and store.claim("w1", lease_seconds=60) is None

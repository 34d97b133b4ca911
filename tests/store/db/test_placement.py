"""Placement, priorities and gangs in the run queue (store/db/placement.py, store/db/queue.py,
store/db/runs.py): claims on both databases, gangs on PostgreSQL only (SQLite refuses them)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from tests.support.databases import fresh_database
from trainctl.store.db.placement import ONE_NODE, Capacity, Placement, choose_gang, why_waiting
from trainctl.store.db.records import Run
from trainctl.store.db.runs import RunStore
from trainctl.store.db.schema import read_transaction, run_slots, runs, workers
from trainctl.store.exceptions import InvalidRequest, LeaseLost, WorkerNotFound

GPU1 = Placement(gpus_per_node=1)
TWO_NODES = Placement(nnodes=2)
LEASE = 60.0


@pytest.fixture
def store(database_url: str) -> Iterator[RunStore]:
    with RunStore(database_url) as run_store:
        run_store.create_all()
        yield run_store


@pytest.fixture
def pg(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunStore]:
    with fresh_database(request, "postgresql", tmp_path) as url, RunStore(url) as run_store:
        run_store.create_all()
        yield run_store


def register(
    store: RunStore, worker_id: str, *, node: str | None = None, gpus: int = 0, cpus: int = 2
) -> None:
    store.workers.register(
        worker_id,
        host="host",
        pid=1,
        device="cuda" if gpus else "cpu",
        info={},
        node_name=node or worker_id,
        gpus=gpus,
        cpus=cpus,
        address="127.0.0.1",
    )


def enqueue(store: RunStore, placement: Placement = ONE_NODE, **kwargs: Any) -> Run:
    return store.enqueue("benchmark", "bench", {}, placement=placement, **kwargs)


def claim(store: RunStore, worker_id: str, **kwargs: Any) -> Run | None:
    return store.claim(worker_id, LEASE, rendezvous=lambda: "127.0.0.1:29500", **kwargs)


# ---- the rules, without a database ---------------------------------------------------------


def cap(worker_id: str, node: str, gpus: int = 0, cpus: int = 2) -> Capacity:
    return Capacity(worker_id, node, gpus, cpus)


def test_a_run_needing_more_gpus_than_any_worker_has_says_so() -> None:
    live = [cap("a", "n1", gpus=4), cap("b", "n2", gpus=2)]
    assert why_waiting(Placement(gpus_per_node=8), live) == (
        "waiting: needs 8 GPUs per node; largest worker has 4"
    )
    cpu_only = [cap("a", "n1"), cap("b", "n2")]
    assert why_waiting(Placement(gpus_per_node=2, procs_per_node=2), cpu_only) == (
        "waiting: needs 2 GPUs per node; no live worker has a GPU"
    )
    assert why_waiting(Placement(procs_per_node=4), cpu_only) == (
        "waiting: needs 4 CPU processes per node; largest worker has 2 cores"
    )
    assert why_waiting(Placement(nnodes=3), cpu_only) == (
        "waiting: needs 3 nodes of 1 CPU process; 2 live workers on 2 nodes can serve it"
    )
    assert why_waiting(GPU1, []) == "waiting: needs 1 node of 1 GPU; no worker is live"
    assert why_waiting(Placement(nnodes=2, gpus_per_node=2), live) is None


def test_a_gang_is_gathered_by_the_spread_it_asks_for() -> None:
    me = cap("a", "n1")
    peers = [cap("b", "n1"), cap("c", "n2"), cap("d", "n3")]
    ids = lambda members: [m.worker_id for m in members or []]  # noqa: E731
    # "any" prefers other nodes, so the load spreads unless asked to stay together.
    assert ids(choose_gang(me, peers, Placement(nnodes=2))) == ["a", "c"]
    assert ids(choose_gang(me, peers, Placement(nnodes=2, spread="same_node"))) == ["a", "b"]
    assert choose_gang(me, peers, Placement(nnodes=3, spread="same_node")) is None
    distinct = Placement(nnodes=3, spread="distinct_nodes")
    assert ids(choose_gang(me, peers, distinct)) == ["a", "c", "d"]
    assert choose_gang(me, [cap("b", "n1"), cap("c", "n1")], distinct) is None
    assert choose_gang(cap("a", "n1"), peers, Placement(nnodes=2, gpus_per_node=1)) is None


def test_an_elastic_gang_takes_fewer_nodes_only_after_its_grace_period() -> None:
    me, peers = cap("a", "n1"), [cap("b", "n2")]
    elastic = Placement(nnodes=3, min_nnodes=2, shrink_after_seconds=60.0)
    ids = lambda members: [m.worker_id for m in members or []]  # noqa: E731
    assert elastic.fewest(59.0) == 3 and elastic.fewest(60.0) == 2
    assert Placement(nnodes=3).fewest(1e9) == 3  # a fixed gang never shrinks
    assert choose_gang(me, peers, elastic, elastic.fewest(10.0)) is None
    assert ids(choose_gang(me, peers, elastic, elastic.fewest(60.0))) == ["a", "b"]
    # With enough idle workers it takes them all, grace period or not.
    more = [*peers, cap("c", "n3"), cap("d", "n4")]
    assert ids(choose_gang(me, more, elastic, elastic.fewest(60.0))) == ["a", "b", "c"]
    assert choose_gang(me, [], elastic, elastic.fewest(60.0)) is None
    # Two live workers will do once it has waited: it lacks nothing.
    assert why_waiting(elastic, [me, *peers]) is None
    assert why_waiting(elastic, [me]) == (
        "waiting: needs 2 to 3 nodes of 1 CPU process; 1 live worker on 1 node can serve it"
    )


def test_a_gang_keeps_clear_of_the_nodes_it_avoids_where_others_can_take_it() -> None:
    ids = lambda members: [m.worker_id for m in members or []]  # noqa: E731
    avoid = Placement(nnodes=2, avoid_nodes=("n2",))
    peers = [cap("b", "n2"), cap("c", "n3")]
    assert ids(choose_gang(cap("a", "n1"), peers, avoid)) == ["a", "c"]  # n2 was first
    # Its worker leaves the lead to an idle one elsewhere: c and d can take it without n2.
    assert choose_gang(cap("b", "n2"), [cap("c", "n3"), cap("d", "n4")], avoid) is None
    # Where the gang needs the node, it takes it: avoiding is never waiting.
    assert ids(choose_gang(cap("a", "n1"), [cap("b", "n2")], avoid)) == ["a", "b"]
    assert ids(choose_gang(cap("b", "n2"), [cap("a", "n1")], avoid)) == ["b", "a"]
    assert why_waiting(avoid, [cap("a", "n1"), cap("b", "n2")]) is None
    # An elastic gang past its grace goes on the nodes it need not avoid, as few as it may.
    elastic = Placement(nnodes=3, min_nnodes=2, shrink_after_seconds=0.0, avoid_nodes=("n2",))
    assert choose_gang(cap("b", "n2"), [cap("a", "n1"), cap("c", "n3")], elastic, 2) is None
    assert ids(choose_gang(cap("a", "n1"), peers, elastic, 2)) == ["a", "c", "b"]


def test_a_run_is_claimed_off_the_nodes_it_avoids_where_another_worker_is_free(
    store: RunStore,
) -> None:
    register(store, "slow", node="n1")
    register(store, "other", node="n2")
    run = enqueue(store)
    trainer = store.enqueue("train", "avoid", {}, placement=ONE_NODE)
    # A straggler report of a run that avoids its stragglers' nodes records them on the run.
    report = {"slowdowns": {"1": 0.5}, "nodes": {"1": "n1"}, "avoid_nodes": ["n1"]}
    store.append_event(trainer.id, "log", {"message": "slow", "straggler": report})
    store.append_event(run.id, "log", {"message": "slow", "straggler": {"slowdowns": {}}})
    assert store.get(trainer.id).placement.avoid_nodes == ("n1",)
    assert store.get(run.id).placement.avoid_nodes == ()  # a report naming none to avoid

    first = claim(store, "slow")
    assert first is not None and first.id == run.id  # passed over the one it is avoided by
    assert claim(store, "slow") is None  # "other" is free: the run is left to it
    taken = claim(store, "other")
    assert taken is not None and taken.id == trainer.id

    # Once no rank is slow any more, it avoids nothing; and where no other worker is free,
    # the avoided node takes it.
    store.append_event(trainer.id, "log", {"message": "ok", "straggler": {"avoid_nodes": []}})
    assert store.get(trainer.id).placement.avoid_nodes == ()
    again = store.enqueue("train", "alone", {}, placement=ONE_NODE)
    store.append_event(again.id, "log", {"message": "slow", "straggler": report})
    got = claim(store, "slow")
    assert got is not None and got.id == again.id  # "other" is busy


# ---- claims on both databases ---------------------------------------------------------------


@pytest.mark.slow
def test_claims_take_the_highest_priority_first_then_the_oldest(store: RunStore) -> None:
    low = enqueue(store, priority=-5)
    first = enqueue(store)
    urgent = enqueue(store, priority=10)
    second = enqueue(store)
    register(store, "w")
    order = []
    for _ in range(4):
        run = claim(store, "w")
        assert run is not None
        order.append(run.id)
        store.finish(run.id, "w", run.attempt, "succeeded")
    assert order == [urgent.id, first.id, second.id, low.id]
    assert store.get(urgent.id).priority == 10


def test_a_worker_claims_only_what_it_can_serve_and_passes_over_the_rest(
    store: RunStore,
) -> None:
    needs_gpus = enqueue(store, Placement(gpus_per_node=2, procs_per_node=2), priority=5)
    needs_cores = enqueue(store, Placement(procs_per_node=4), priority=5)
    fits = enqueue(store)
    register(store, "cpu", cpus=2)
    run = claim(store, "cpu")
    assert run is not None and run.id == fits.id  # the two ahead of it block nothing
    assert claim(store, "cpu") is None  # busy or not, nothing else fits this worker
    register(store, "gpu", gpus=2, cpus=2)
    run = claim(store, "gpu")
    assert run is not None and run.id == needs_gpus.id
    register(store, "big", cpus=8)
    run = claim(store, "big")
    assert run is not None and run.id == needs_cores.id
    assert store.get(run.id).placement == Placement(procs_per_node=4)


def test_workers_show_what_they_have_and_the_run_they_are_busy_with(store: RunStore) -> None:
    register(store, "w", node="node-a", gpus=8, cpus=64)
    run = enqueue(store, GPU1)
    claimed = claim(store, "w")
    assert claimed is not None
    (worker,) = store.workers.list_workers()
    assert (worker.node_name, worker.gpus, worker.cpus) == ("node-a", 8, 64)
    assert worker.capacity == Capacity("w", "node-a", 8, 64)
    assert worker.current_run_id == run.id
    store.finish(run.id, "w", claimed.attempt, "succeeded")
    store.workers.release("w")
    assert store.workers.list_workers()[0].current_run_id is None


def test_sqlite_refuses_a_run_across_several_nodes_saying_what_it_needs(tmp_path: Path) -> None:
    with RunStore(f"sqlite:///{tmp_path / 'db'}") as store:
        store.create_all()
        with pytest.raises(InvalidRequest, match=r"nnodes 2: .* needs PostgreSQL"):
            enqueue(store, TWO_NODES)


# ---- gangs, on PostgreSQL ---------------------------------------------------------------------


def slots(store: RunStore) -> list[tuple[str, int, str, int]]:
    query = select(run_slots.c.run_id, run_slots.c.node_rank, run_slots.c.worker_id)
    with read_transaction(store.engine) as conn:
        rows = conn.execute(query.add_columns(run_slots.c.attempt)).all()
    return sorted((r.run_id, r.node_rank, r.worker_id, r.attempt) for r in rows)


def test_a_gang_takes_all_its_places_at_once_or_none(pg: RunStore) -> None:
    gang = enqueue(pg, Placement(nnodes=3))
    register(pg, "a")
    register(pg, "b")
    assert claim(pg, "a") is None  # two workers cannot hold three places
    assert slots(pg) == [] and pg.get(gang.id).state == "queued"
    register(pg, "c")
    leader = claim(pg, "b")
    assert leader is not None and leader.id == gang.id
    assert leader.gang is not None and leader.gang.node_rank == 0
    assert leader.gang.rendezvous == "127.0.0.1:29500"
    assert [s[1:] for s in slots(pg)] == [(0, "b", 1), (1, "a", 1), (2, "c", 1)]
    for worker_id, rank in (("a", 1), ("c", 2)):
        place = claim(pg, worker_id)  # a member learns its place on its next claim
        assert place is not None and place.id == gang.id and place.gang is not None
        assert (place.gang.node_rank, place.gang.nnodes) == (rank, 3)
        assert place.gang.rendezvous == "127.0.0.1:29500"
    assert pg.get(gang.id).worker_id == "b"
    assert "gang of 3 workers (b, a, c)" in pg.events(gang.id)[-1].data["reason"]


def test_a_busy_or_silent_worker_is_never_taken_into_a_gang(pg: RunStore) -> None:
    register(pg, "busy")
    single = enqueue(pg)
    assert claim(pg, "busy") is not None
    register(pg, "silent")
    old = datetime.now(UTC) - timedelta(seconds=2 * LEASE)  # last seen two leases ago
    with pg.engine.begin() as conn:
        conn.execute(workers.update().where(workers.c.id == "silent").values(last_seen_at=old))
    gang = enqueue(pg, TWO_NODES)
    register(pg, "leader")
    assert claim(pg, "leader") is None
    assert slots(pg) == []
    pg.finish(single.id, "busy", 1, "succeeded")
    pg.workers.release("busy")
    run = claim(pg, "leader")
    assert run is not None and run.id == gang.id
    assert [s[2] for s in slots(pg)] == ["leader", "busy"]


def test_every_member_is_fenced_and_a_silent_member_requeues_the_gang(pg: RunStore) -> None:
    gang = enqueue(pg, TWO_NODES, max_attempts=3)
    register(pg, "a")
    register(pg, "b")
    leader = claim(pg, "a")
    member = claim(pg, "b")
    assert leader is not None and member is not None
    # Any member may report (torchrun decides which holds global rank 0) and heartbeat.
    pg.append_event(gang.id, "log", {"message": "from b"}, worker_id="b", attempt=1)
    pg.heartbeat(gang.id, "b", 1, LEASE)
    pg.set_progress(gang.id, "b", 1, step=3, total_steps=10)
    # b stops heartbeating: its place expires, and the whole gang goes back as attempt 2.
    past = datetime.now(UTC) - timedelta(seconds=1)
    with pg.engine.begin() as conn:
        gone = run_slots.c.worker_id == "b"
        conn.execute(run_slots.update().where(gone).values(lease_expires_at=past))
    (reaped,) = pg.reap_expired()
    assert (reaped.state, reaped.attempt) == ("queued", 2)
    assert "gang member b stopped heartbeating" in pg.events(gang.id)[-1].data["reason"]
    assert slots(pg) == []
    for worker_id in ("a", "b"):
        with pytest.raises(LeaseLost):
            pg.heartbeat(gang.id, worker_id, 1, LEASE)
        with pytest.raises(LeaseLost):
            pg.finish(gang.id, worker_id, 1, "succeeded")
    # The survivor is idle again once it let go; with a new peer the gang starts anew.
    pg.workers.release("a")
    register(pg, "c")
    again = claim(pg, "c")
    assert again is not None and again.attempt == 2
    assert {s[2] for s in slots(pg)} == {"a", "c"}


def test_an_elastic_gang_shrinks_after_its_grace_period_and_grows_back(pg: RunStore) -> None:
    elastic = Placement(nnodes=3, min_nnodes=2, shrink_after_seconds=30.0)
    gang = enqueue(pg, elastic, max_attempts=3)
    for worker_id in ("a", "b", "c"):
        register(pg, worker_id)
    assert claim(pg, "a") is not None  # all three idle: it takes all three at once
    assert pg.get(gang.id).gang_nnodes == 3
    pg.give_up(gang.id, "b", 1, "a gang member's processes exited")  # c is gone for good
    with pg.engine.begin() as conn:
        conn.execute(workers.delete().where(workers.c.id == "c"))
    pg.workers.release("a")
    pg.workers.release("b")
    assert claim(pg, "a") is None  # two of three, within the grace period: it waits
    # Once it has waited long enough, two will do.
    requeued = datetime.now(UTC) - timedelta(seconds=31)
    with pg.engine.begin() as conn:
        conn.execute(runs.update().where(runs.c.id == gang.id).values(queued_at=requeued))
    leader = claim(pg, "a")
    assert leader is not None and leader.gang is not None
    assert (leader.gang.nnodes, leader.gang.resized_from) == (2, 3)  # its worker reports it
    run = pg.get(gang.id)
    assert (run.state, run.attempt, run.gang_nnodes) == ("running", 2, 2)
    place = claim(pg, "b")
    assert place is not None and place.gang is not None
    assert (place.gang.nnodes, place.gang.resized_from) == (2, None)
    # A third worker again: the shrunk gang has room to grow (rank 0 asks after a save).
    assert not pg.room_to_grow(gang.id, LEASE)
    register(pg, "d")
    assert pg.room_to_grow(gang.id, LEASE)
    pg.requeue(gang.id, "a", 2, "elastic gang growing back")
    pg.workers.release("a")
    pg.workers.release("b")
    grown = claim(pg, "d")  # within the grace period, but all three are idle
    assert grown is not None and grown.gang is not None
    assert (grown.gang.nnodes, grown.gang.resized_from) == (3, 2)
    assert not pg.room_to_grow(gang.id, LEASE)  # at its most


def test_a_member_that_loses_its_peers_requeues_the_gang_once(pg: RunStore) -> None:
    gang = enqueue(pg, TWO_NODES, max_attempts=2)
    register(pg, "a")
    register(pg, "b")
    assert claim(pg, "a") is not None and claim(pg, "b") is not None
    run = pg.give_up(gang.id, "b", 1, "a gang member's processes exited")
    assert (run.state, run.attempt) == ("queued", 2)
    with pytest.raises(LeaseLost):  # the other member saw the same and comes second
        pg.give_up(gang.id, "a", 1, "a gang member's processes exited")
    pg.workers.release("a")
    pg.workers.release("b")
    assert claim(pg, "a") is not None and claim(pg, "b") is not None
    failed = pg.give_up(gang.id, "a", 2, "lost again")
    assert failed.state == "failed" and "no attempts remain" in (failed.error or "")


def test_a_graceful_stop_requeues_a_gang_under_a_new_attempt_without_using_one(
    pg: RunStore,
) -> None:
    gang = enqueue(pg, TWO_NODES, max_attempts=1)
    register(pg, "a")
    register(pg, "b")
    assert claim(pg, "a") is not None and claim(pg, "b") is not None
    run = pg.requeue(gang.id, "a", 1, "worker b shutting down")
    assert (run.state, run.attempt, run.max_attempts) == ("queued", 2, 2)
    with pytest.raises(LeaseLost):
        pg.append_event(gang.id, "log", {"message": "late"}, worker_id="b", attempt=1)


def test_a_waiting_gang_reserves_the_workers_that_could_join_it(pg: RunStore) -> None:
    """The anti-starvation rule (store/db/queue.py): once a gang has waited `reserve_after`,
    no worker that could be one of its members takes a run behind it."""
    register(pg, "a")
    register(pg, "b")
    busy = enqueue(pg, priority=1)
    assert claim(pg, "b") is not None  # b runs something long: the gang cannot start yet
    gang = enqueue(pg, TWO_NODES)
    small = [enqueue(pg) for _ in range(3)]
    # Young, the gang blocks nobody: a takes the small runs behind it.
    young = claim(pg, "a", reserve_after=3600)
    assert young is not None and young.id == small[0].id
    pg.finish(young.id, "a", 1, "succeeded")
    pg.workers.release("a")
    # Old enough, it holds a back, and a higher-priority run still goes first.
    assert claim(pg, "a", reserve_after=0) is None
    urgent = enqueue(pg, priority=5)
    first = claim(pg, "a", reserve_after=0)
    assert first is not None and first.id == urgent.id
    pg.finish(urgent.id, "a", 1, "succeeded")
    pg.workers.release("a")
    assert claim(pg, "a", reserve_after=0) is None
    # b finishes; whichever of them polls next gathers the gang, before the small runs.
    pg.finish(busy.id, "b", 1, "succeeded")
    pg.workers.release("b")
    run = claim(pg, "b", reserve_after=0)
    assert run is not None and run.id == gang.id
    assert pg.get(small[1].id).state == "queued"


def test_a_gang_no_live_workers_could_run_reserves_nobody(pg: RunStore) -> None:
    register(pg, "a")
    enqueue(pg, Placement(nnodes=3))
    small = enqueue(pg)
    run = claim(pg, "a", reserve_after=0)
    assert run is not None and run.id == small.id


def test_racing_claimers_never_put_a_worker_in_two_runs(pg: RunStore) -> None:
    names = [f"w{i}" for i in range(8)]
    for i, name in enumerate(names):
        register(pg, name, node=f"node-{i % 4}")
    gangs = [enqueue(pg, Placement(nnodes=2 + i % 3)) for i in range(6)]
    singles = [enqueue(pg) for _ in range(10)]
    held: dict[str, list[str]] = {name: [] for name in names}
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(names))

    def worker(name: str) -> None:
        try:
            with RunStore(str(pg.engine.url.render_as_string(hide_password=False))) as mine:
                barrier.wait()
                for _ in range(20):
                    run = mine.claim(name, LEASE, rendezvous=lambda: "h:1", reserve_after=3600)
                    if run is not None:
                        held[name].append(run.id)
                        return  # holds its run; never claims again
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    # A worker given a gang place learns it on its own claim: each holds at most one run.
    assert all(len(ids) <= 1 for ids in held.values())
    taken = Counter(run_id for ids in held.values() for run_id in ids)
    by_id = {r.id: r for r in [*gangs, *singles]}
    for run_id, count in taken.items():
        assert count == by_id[run_id].placement.nnodes  # every place of a gang, or the single
    for row in slots(pg):
        assert pg.get(row[0]).state == "running"
    busy = [w.current_run_id for w in pg.workers.list_workers() if w.current_run_id]
    assert sorted(busy) == sorted(run_id for ids in held.values() for run_id in ids)


# ---- drain (POST /workers/{id}/drain) ---------------------------------------------------------


def test_a_draining_worker_hears_it_at_its_heartbeat_and_claims_nothing(store: RunStore) -> None:
    register(store, "w")
    enqueue(store)
    assert store.workers.heartbeat("w") is False
    drained = store.workers.drain("w")
    assert drained.drain_requested_at is not None
    assert store.workers.drain("w").drain_requested_at == drained.drain_requested_at  # the first
    assert store.workers.heartbeat("w") is True
    assert claim(store, "w") is None
    register(store, "w")  # a restart under the same id starts afresh
    assert store.workers.heartbeat("w") is False and claim(store, "w") is not None


def test_draining_an_unknown_worker_names_it(store: RunStore) -> None:
    with pytest.raises(WorkerNotFound, match=r"worker 'nobody' is not registered; GET /workers"):
        store.workers.drain("nobody")


def test_a_draining_worker_is_never_taken_into_a_gang(pg: RunStore) -> None:
    gang = enqueue(pg, TWO_NODES)
    register(pg, "leader")
    register(pg, "leaving")
    pg.workers.drain("leaving")
    assert claim(pg, "leader") is None and slots(pg) == []
    register(pg, "other")
    run = claim(pg, "leader")
    assert run is not None and run.id == gang.id
    assert [s[2] for s in slots(pg)] == ["leader", "other"]

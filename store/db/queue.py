"""The queue's claim, in SQL: which queued runs a worker may take, and gathering a gang.

`RunStore.claim` (store/db/runs.py) drives it inside one write transaction; the rules are
docs/design/placement.md, "Placement and gangs":

- A worker sees the queued runs whose nodes it can serve (GPUs per node, or cores for a CPU
  run's processes), highest priority first, then oldest; runs it cannot serve never block it.
- A single-node run is taken by the worker alone. A gang (nnodes > 1, PostgreSQL only) is taken
  by the worker that meets it together with idle live peers, all in the same transaction:
  either every place is filled or none. Every assignment locks the worker's row first
  (`FOR UPDATE`; a leader locks its peers with `SKIP LOCKED`), so a worker is never given two
  runs: one claiming for itself is skipped by a leader, and one a leader took sees its place.
- Fairness for gangs: once a gang has waited `reserve_after` seconds and enough live workers
  exist to run it, a worker that could be one of its members takes nothing behind it (lower
  or equal priority, younger); it stays idle, and so do the others, until the gang's members
  are all free and the next of them to poll gathers it. Small runs therefore cannot starve a
  gang for longer than that delay plus the longest run already going.
- Elastic gangs (`min_nnodes`): a gang is placed on as many of its `nnodes` as are idle, but
  on fewer than all of them only once it has waited its `shrink_after_seconds` since it was
  queued (`waited_fewest`); the leader's place says the last attempt's size when it differs,
  and its worker reports the resize. A shrunk gang whose missing workers are all idle again
  (`room_to_grow`) hands back after its next checkpoint, to be placed on all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Row, and_, func, insert, or_, select, update
from sqlalchemy.engine import Connection

from trainctl.store.db.placement import (
    Capacity,
    Placement,
    choose_gang,
    clear_gang_exists,
    could_serve,
)
from trainctl.store.db.schema import run_slots, runs, workers

CANDIDATES = 32
"""Queued runs a claim looks at: a worker passes over runs that are locked or that it cannot
gather a gang for, so more than one; the first it can take is almost always near the top."""

GANG_RESERVE_SECONDS = 60.0
"""How long a gang waits before the workers that could join it stop taking smaller runs."""


def plugins_of(value: Any) -> frozenset[str]:
    """A worker row's `model_plugins`: a list of names; anything else reads as none."""
    if not isinstance(value, list):
        return frozenset()
    return frozenset(name for name in value if isinstance(name, str))


def capacity_of(row: Row[Any]) -> Capacity:
    return Capacity(row.id, row.node_name, row.gpus, row.cpus, plugins_of(row.model_plugins))


def placement_of_row(row: Row[Any]) -> Placement:
    return Placement(
        row.nnodes,
        row.gpus_per_node,
        row.procs_per_node,
        row.spread,
        row.model_plugin,
        row.min_nnodes,
        row.shrink_after_seconds or 0.0,
        tuple(sorted({n for n in row.avoid_nodes or () if isinstance(n, str)})),
    )


def waited_fewest(gang: Row[Any], now: datetime) -> int:
    """The fewest nodes a queued gang takes now: all its nodes until it has waited its
    grace period since it was (re)queued, then its minimum."""
    since = gang.queued_at or gang.created_at
    return placement_of_row(gang).fewest((now - since).total_seconds())


def servable_by(cap: Capacity | None) -> ColumnElement[bool]:
    """The runs whose nodes `cap` can serve; None (a claimer that never registered, as in
    scripts and tests) is taken to serve any single-node run."""
    if cap is None:
        return runs.c.nnodes == 1
    gpu_run = and_(runs.c.gpus_per_node > 0, runs.c.gpus_per_node <= cap.gpus)
    cpu_run = and_(runs.c.gpus_per_node == 0, runs.c.procs_per_node <= cap.cpus)
    plugin = or_(runs.c.model_plugin.is_(None), runs.c.model_plugin.in_(sorted(cap.model_plugins)))
    return and_(or_(gpu_run, cpu_run), plugin)


def candidates(conn: Connection, cap: Capacity | None) -> Sequence[str]:
    """Ids of queued runs `cap` can serve, in claim order."""
    query = (
        select(runs.c.id)
        .where(runs.c.state == "queued", servable_by(cap))
        .order_by(runs.c.priority.desc(), runs.c.created_at, runs.c.seq)
        .limit(CANDIDATES)
    )
    return conn.execute(query).scalars().all()


def lock_queued(conn: Connection, run_id: str) -> Row[Any] | None:
    """The run, locked, if it is still queued and no other claimer holds it."""
    query = (
        select(runs)
        .where(runs.c.id == run_id, runs.c.state == "queued")
        .with_for_update(skip_locked=True)
    )
    return conn.execute(query).one_or_none()


def _live(now: datetime, lease_seconds: float) -> ColumnElement[bool]:
    return workers.c.last_seen_at >= now - timedelta(seconds=lease_seconds)


def _idle(need: Placement, now: datetime, lease_seconds: float) -> ColumnElement[bool]:
    """Live idle workers that could each serve a node of `need`."""
    fits = (
        workers.c.gpus >= need.gpus_per_node
        if need.gpus_per_node
        else workers.c.cpus >= need.procs_per_node
    )
    return and_(
        workers.c.run_id.is_(None),
        _live(now, lease_seconds),
        fits,
        workers.c.drain_requested_at.is_(None),  # a draining worker joins nothing
    )


def idle_peers(
    conn: Connection, me: str, need: Placement, now: datetime, lease_seconds: float
) -> list[Capacity]:
    """Live idle workers other than `me` that could each serve a node of `need`, locked; one
    busy claiming for itself right now is skipped."""
    query = (
        select(workers)
        .where(workers.c.id != me, _idle(need, now, lease_seconds))
        .order_by(workers.c.node_name, workers.c.id)
        .with_for_update(skip_locked=True)
    )
    return [capacity_of(row) for row in conn.execute(query)]


def room_to_grow(conn: Connection, gang: Row[Any], now: datetime, lease_seconds: float) -> bool:
    """Whether a running elastic gang placed on fewer than its nnodes would get all of them
    if it were queued now: enough idle live workers could each serve one of the missing
    nodes (by capacity; its spread is not checked). All of them, not some: a gang requeued
    for fewer would wait out its grace period before it took what it had."""
    if gang.state != "running" or gang.gang_nnodes is None or gang.gang_nnodes >= gang.nnodes:
        return False
    idle = select(func.count()).select_from(workers)
    count = conn.execute(idle.where(_idle(placement_of_row(gang), now, lease_seconds))).scalar()
    return (count or 0) >= gang.nnodes - gang.gang_nnodes


def choose_gang_members(
    conn: Connection, me: Capacity, gang: Row[Any], now: datetime, lease_seconds: float
) -> list[Capacity] | None:
    """The gang's members with `me` leading, from the idle live peers; None if too few."""
    need = placement_of_row(gang)
    peers = idle_peers(conn, me.worker_id, need, now, lease_seconds)
    return choose_gang(me, peers, need, waited_fewest(gang, now))


def avoided_nodes(type: str, data: dict[str, Any]) -> list[str] | None:
    """The nodes a straggler report of a run that avoids its stragglers' nodes names (its
    `straggler.avoid_nodes`: worker.training.hangs.straggler_report; [] once none is slow),
    None for any other event: the run's next placement keeps clear of them."""
    straggler = data.get("straggler") if type == "log" else None
    avoid = straggler.get("avoid_nodes") if isinstance(straggler, dict) else None
    if not isinstance(avoid, list):
        return None
    return [n for n in avoid if isinstance(n, str)]


def leave_to_others(
    conn: Connection, me: Capacity | None, row: Row[Any], now: datetime, lease_seconds: float
) -> bool:
    """Whether `me`, on a node the run avoids, should leave a one-node run to an idle live
    worker elsewhere that can take it (docs/design/hangs.md, "Stragglers"; `choose_gang`
    does the same for a gang)."""
    need = placement_of_row(row)
    if me is None or me.node_name not in need.avoid_nodes:
        return False
    query = select(workers).where(workers.c.id != me.worker_id, _idle(need, now, lease_seconds))
    peers = [capacity_of(r) for r in conn.execute(query)]
    return clear_gang_exists(peers, need, None)


def reserved_for(
    conn: Connection,
    gang: Row[Any],
    now: datetime,
    lease_seconds: float,
    reserve_after: float,
) -> bool:
    """Whether the workers that could join `gang` must wait for it rather than take smaller
    runs: it has waited long enough, and the live workers could run it once free."""
    since = gang.queued_at or gang.created_at
    if now - since < timedelta(seconds=reserve_after):
        return False
    live = [capacity_of(r) for r in conn.execute(select(workers).where(_live(now, lease_seconds)))]
    return could_serve(live, placement_of_row(gang), waited_fewest(gang, now))


def place_gang(
    conn: Connection,
    gang: Row[Any],
    members: Sequence[str],
    rendezvous: str,
    lease_until: datetime,
) -> None:
    """Give each member (a worker id) its node rank (the leader, members[0], is 0) and mark
    it busy."""
    conn.execute(
        insert(run_slots),
        [
            {
                "run_id": gang.id,
                "node_rank": rank,
                "attempt": gang.attempt,
                "worker_id": member,
                "rendezvous": rendezvous,
                "lease_expires_at": lease_until,
            }
            for rank, member in enumerate(members)
        ],
    )
    conn.execute(update(workers).where(workers.c.id.in_(members)).values(run_id=gang.id))
    conn.execute(update(runs).where(runs.c.id == gang.id).values(gang_nnodes=len(members)))


def sizes_allow(gang: Row[Any], size: int) -> bool:
    """Whether a gang may run on `size` nodes: its `nnodes`, or down to `min_nnodes` for an
    elastic one (docs/design/placement.md, "Elastic gangs")."""
    low = gang.min_nnodes if gang.min_nnodes is not None else gang.nnodes
    return low <= size <= gang.nnodes


def members_of(conn: Connection, run_id: str) -> list[str]:
    query = select(run_slots.c.worker_id).where(run_slots.c.run_id == run_id)
    return list(conn.execute(query.order_by(run_slots.c.node_rank)).scalars())


def my_place(conn: Connection, worker_id: str) -> Row[Any] | None:
    """The gang place a leader gave this worker, if its run is still running that attempt."""
    # A gang placed before elastic gangs existed has no gang_nnodes: it has all its nnodes.
    size = func.coalesce(runs.c.gang_nnodes, runs.c.nnodes).label("nnodes")
    query = select(run_slots, runs.c.state, size).join(
        runs, and_(runs.c.id == run_slots.c.run_id, runs.c.attempt == run_slots.c.attempt)
    )
    row = conn.execute(
        query.where(run_slots.c.worker_id == worker_id, runs.c.state == "running")
    ).one_or_none()
    return row


def leave_gang(conn: Connection, run_id: str) -> None:
    """The run left `running`: its places are free (each member clears its own busy mark
    when its work on the run has stopped)."""
    conn.execute(run_slots.delete().where(run_slots.c.run_id == run_id))


def expired_member(now: datetime) -> ColumnElement[bool]:
    """A running gang one of whose members (this attempt's) stopped heartbeating."""
    return (
        select(run_slots.c.run_id)
        .where(
            run_slots.c.run_id == runs.c.id,
            run_slots.c.attempt == runs.c.attempt,
            run_slots.c.lease_expires_at < now,
        )
        .exists()
    )


def is_member(worker_id: str, attempt: int) -> ColumnElement[bool]:
    """The fence for a gang member: it holds a place in this attempt of the run."""
    return (
        select(run_slots.c.run_id)
        .where(
            run_slots.c.run_id == runs.c.id,
            run_slots.c.worker_id == worker_id,
            run_slots.c.attempt == attempt,
        )
        .exists()
    )

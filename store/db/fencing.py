"""Fencing and the event log's rows: every write a worker makes to a run is fenced by `(run,
worker, attempt)`, and a state change is recorded as an event in the same transaction
(docs/design/runs.md, "Runs", "Fencing")."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Row, and_, insert, or_, select, update
from sqlalchemy.engine import Connection

from trainctl.store.db.queue import (
    is_member,
)
from trainctl.store.db.records import utcnow
from trainctl.store.db.schema import (
    run_events,
    run_slots,
    runs,
)
from trainctl.store.exceptions import (
    InvalidRequest,
    LeaseLost,
    RunNotFound,
)
from trainctl.store.vocabulary import (
    ACTIVE_STATES,
)


def fetch_one(
    conn: Connection, condition: ColumnElement[bool], *, lock: bool = False
) -> Row[Any] | None:
    query = select(runs).where(condition)
    if lock:
        query = query.with_for_update()
    return conn.execute(query).one_or_none()


def require_row(conn: Connection, run_id: str, *, lock: bool = False) -> Row[Any]:
    row = fetch_one(conn, runs.c.id == run_id, lock=lock)
    if row is None:
        raise RunNotFound(run_id)
    return row


def active_train_row(conn: Connection, experiment: str) -> Row[Any] | None:
    condition = and_(
        runs.c.kind == "train",
        runs.c.experiment == experiment,
        runs.c.state.in_(ACTIVE_STATES),
    )
    return conn.execute(select(runs).where(condition).limit(1)).one_or_none()


def running_rows(conn: Connection, condition: ColumnElement[bool]) -> Sequence[Row[Any]]:
    """Running runs matching `condition`, locked; rows another reaper holds are skipped."""
    query = (
        select(runs)
        .where(runs.c.state == "running", condition)
        .order_by(runs.c.created_at, runs.c.seq)
        .with_for_update(skip_locked=True)
    )
    return conn.execute(query).all()


def same_worker(worker_id: str | None) -> ColumnElement[bool]:
    return runs.c.worker_id.is_(None) if worker_id is None else runs.c.worker_id == worker_id


def owned_by(run_id: str, worker_id: str, attempt: int) -> ColumnElement[bool]:
    """The fence: the run is running under this worker (or a gang with it as a member) and
    this attempt."""
    return and_(
        runs.c.id == run_id,
        or_(runs.c.worker_id == worker_id, is_member(worker_id, attempt)),
        runs.c.attempt == attempt,
        runs.c.state == "running",
    )


def silent_worker(conn: Connection, row: Row[Any], now: datetime) -> str:
    """Who of a run's workers stopped heartbeating, in words: a gang member, or its worker."""
    if row.nnodes > 1:
        late = select(run_slots.c.worker_id).where(
            run_slots.c.run_id == row.id, run_slots.c.lease_expires_at < now
        )
        names = list(conn.execute(late).scalars())
        if names:
            return f"gang member {', '.join(names)}"
    return f"worker {row.worker_id}"


def fenced_update(
    conn: Connection, run_id: str, worker_id: str, attempt: int, **values: Any
) -> Row[Any]:
    """Update a run only if `worker_id` still owns `attempt` of it; else raise `LeaseLost`."""
    statement = (
        update(runs).where(owned_by(run_id, worker_id, attempt)).values(**values).returning(*runs.c)
    )
    row = conn.execute(statement).one_or_none()
    if row is None:
        raise lease_lost(conn, run_id, worker_id, attempt)
    return row


def require_owned(conn: Connection, run_id: str, worker_id: str, attempt: int) -> Row[Any]:
    """Read and lock the run if `worker_id` still owns `attempt` of it; else raise `LeaseLost`.

    The lock (PostgreSQL) or the write transaction (SQLite) keeps a reaper from moving the run
    before the caller's write commits.
    """
    row = fetch_one(conn, owned_by(run_id, worker_id, attempt), lock=True)
    if row is None:
        raise lease_lost(conn, run_id, worker_id, attempt)
    return row


def reaped_unclaimed(conn: Connection, run_id: str, worker_id: str, attempt: int) -> bool:
    """Whether the run is queued because `attempt`, which `worker_id` claimed, was reaped,
    and nobody has claimed it since: its last two state events are that claim and the
    requeue with the next attempt (every claim and move appends one). One node's runs only:
    a gang's members report on their own and may still be stopping. The row is locked, so a
    claimer waits for this transaction and then finds the run no longer queued."""
    row = require_row(conn, run_id, lock=True)
    if row.state != "queued" or row.attempt != attempt + 1 or row.nnodes != 1:
        return False
    last_two = conn.execute(
        select(run_events.c.data)
        .where(run_events.c.run_id == run_id, run_events.c.type == "state")
        .order_by(run_events.c.id.desc())
        .limit(2)
    ).scalars().all()  # fmt: skip
    if len(last_two) != 2 or not all(isinstance(data, dict) for data in last_two):
        return False
    requeued, claimed = last_two
    return (
        (claimed.get("state"), claimed.get("worker_id"), claimed.get("attempt"))
        == ("running", worker_id, attempt)
        and (requeued.get("state"), requeued.get("previous")) == ("queued", "running")
        and requeued.get("attempt") == attempt + 1
    )


def lease_lost(conn: Connection, run_id: str, worker_id: str, attempt: int) -> Exception:
    """Explain why a fenced write was refused, so the worker's log says what happened."""
    row = fetch_one(conn, runs.c.id == run_id)
    if row is None:
        return RunNotFound(run_id)
    return LeaseLost(
        f"worker {worker_id} no longer owns run {run_id} (attempt {attempt}): the run is now "
        f"{row.state}, attempt {row.attempt}, worker {row.worker_id or 'none'}; "
        "stop working on it"
    )


def state_data(row: Row[Any], previous: str, reason: str) -> dict[str, Any]:
    return {
        "state": row.state,
        "previous": previous,
        "reason": reason,
        "attempt": row.attempt,
        "worker_id": row.worker_id,
    }


def insert_event(conn: Connection, run_id: str, type: str, data: dict[str, Any]) -> int:
    """Append an event; the caller must hold the run's row lock in this transaction.

    A client resuming a stream asks for the events of one run with id > Last-Event-ID, so the
    ids of one run must become visible in increasing order. On PostgreSQL ids come from a
    sequence, handed out at INSERT, not at COMMIT: two transactions inserting events of the
    same run could take ids 10 and 11 and commit 11 first, and a reader between the two
    commits would move past 10 for good. Every caller therefore takes the run's row lock first
    (SELECT ... FOR UPDATE, or the UPDATE of a state change), which serialises the event
    writers of a run: the next one takes its id only after the previous one committed. (The
    foreign-key check of a bare INSERT takes only a shared key lock, which two inserters hold
    at once, so it does not serialise them.) Events
    of different runs need no order between them, and do not wait for each other. On SQLite
    BEGIN IMMEDIATE serialises every writer anyway.
    """
    result = conn.execute(
        insert(run_events).values(run_id=run_id, type=type, data=data, created_at=utcnow())
    )
    event_id = result.inserted_primary_key[0] if result.inserted_primary_key else None
    assert isinstance(event_id, int), "the database did not return the new event's id"
    return event_id


def encode_cursor(created_at: datetime, seq: int) -> str:
    raw = json.dumps([created_at.isoformat(), seq]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, int]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_text, seq = json.loads(raw)
        created_at = datetime.fromisoformat(created_text)
        if created_at.tzinfo is None or not isinstance(seq, int):
            raise ValueError("cursor fields have the wrong types")
        if not 0 <= seq < 2**63:  # a forged one: the database's integers are 64-bit
            raise ValueError("cursor sequence number out of range")
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError) as exc:
        raise InvalidRequest(
            f"invalid cursor {cursor!r}: pass the next_cursor of a previous page unchanged"
        ) from exc
    return created_at, seq

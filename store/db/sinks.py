"""How far the metrics sinks have mirrored the event log (docs/design/sinks.md, "Metrics
sinks").

The service mirrors train runs' events into TensorBoard and MLflow; the event log stays the
record and a sink only follows it, by event id. `SinkStore` keeps, for one sink, a cursor per
train run (the last event id the sink has taken), so a restarted service goes on where the
last one stopped, repeating and skipping nothing.

One service per deployment mirrors a sink: the one holding the sink's row in `sink_mirrors`,
a lease it renews while it works and another service takes over once it lapses. Every write
here names the holder and lands only while it still holds the row, so a service that stalled
and was taken over from cannot move a cursor under the new holder.

Which runs a sink follows is in their plans (`trackers`). The store finds them by walking the
runs in `seq` order past a mark kept in the sink's row, so a tick reads only runs it has not
looked at, however many there are.

A run's log can grow after it ended: an evaluate run records its scores on the train run that
wrote its checkpoint (docs/evals.md), often long after. Such a metrics event reopens the run's
finished cursors (`reopen_finished`, in the event's own transaction), so the sinks mirror it
as they mirror the rest; a cursor is only marked done while no event lies past it, checked
under the run's row lock that every event writer takes, so none slips in between.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Row, and_, exists, insert, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from trainctl.store.db.schema import (
    read_transaction,
    run_events,
    runs,
    sink_cursors,
    sink_mirrors,
    write_transaction,
)
from trainctl.store.exceptions import LeaseLost

DISCOVERY_GRACE = timedelta(seconds=30)
"""How long a new run is looked at again. On PostgreSQL `runs.seq` comes from a sequence at
INSERT, not at COMMIT, so a run can become visible after one with a higher seq; the mark never
passes a run younger than this, by which time every enqueue that took a lower seq has long
committed (they take milliseconds)."""
DISCOVERY_BATCH = 200
"""Runs looked at per call: a database with a long history is walked a slice per tick."""
REFUSED = "refused"
"""The memo key of a cursor whose sink refused the run: it stays done, whatever comes later."""


@dataclass(frozen=True)
class Cursor:
    """Where one sink stands in one train run's event log."""

    run_id: str
    sink: str
    last_event_id: int
    """The sink has taken every event of the run up to this id."""
    memo: dict[str, Any]
    """What the sink keeps about the run (the MLflow run it made for it), and `REFUSED` once
    the sink refused it."""
    outage_since: datetime | None
    """When the sink started failing for this run, while it fails: the run's log said so then."""


class SinkStore:
    """The cursors and the mirror row of one sink, for the service `holder`."""

    def __init__(self, engine: Engine, sink: str, holder: str, lease_seconds: float) -> None:
        self.engine, self.sink, self.holder = engine, sink, holder
        self.lease = timedelta(seconds=lease_seconds)

    def has_work(self) -> bool:
        """Whether an open cursor or a train run not looked at yet awaits (a read: an idle
        service never takes the write lock for its sinks)."""
        with read_transaction(self.engine) as conn:
            seen = conn.execute(
                select(sink_mirrors.c.runs_seen).where(sink_mirrors.c.sink == self.sink)
            ).scalar_one_or_none()
            new_run = select(runs.c.seq).where(runs.c.kind == "train", runs.c.seq > (seen or 0))
            return bool(
                conn.execute(select(exists(self._open_cursors()) | exists(new_run))).scalar()
            )

    def acquire(self) -> bool:
        """Take or renew the sink's lease; False while another service holds it. A lease with
        more than half its time left is not renewed: most ticks write nothing."""
        now = _utcnow()
        with read_transaction(self.engine) as conn:
            held_until = conn.execute(
                select(sink_mirrors.c.lease_expires_at).where(
                    sink_mirrors.c.sink == self.sink, sink_mirrors.c.holder == self.holder
                )
            ).scalar_one_or_none()
        if held_until is not None and held_until > now + self.lease / 2:
            return True
        try:
            with write_transaction(self.engine) as conn:
                row = self._mirror_row(conn)
                if row is None:
                    conn.execute(
                        insert(sink_mirrors).values(
                            sink=self.sink, runs_seen=0, holder=self.holder,
                            lease_expires_at=now + self.lease,
                        )
                    )  # fmt: skip
                    return True
                lapsed = row.lease_expires_at is None or row.lease_expires_at < now
                if row.holder not in (None, self.holder) and not lapsed:
                    return False
                self._renew(conn, now)
                return True
        except IntegrityError:
            return False  # another service made the sink's row first (PostgreSQL): it holds it

    def release(self) -> None:
        """Let another service take the sink at once (this one is stopping)."""
        with write_transaction(self.engine) as conn:
            conn.execute(
                update(sink_mirrors)
                .where(sink_mirrors.c.sink == self.sink, sink_mirrors.c.holder == self.holder)
                .values(holder=None, lease_expires_at=None)
            )

    def discover(self, limit: int = DISCOVERY_BATCH) -> list[str]:
        """Open a cursor for each train run past the mark whose plan names this sink; the ids
        of the runs opened. Looks first and writes only what changed; a write raises
        `LeaseLost` unless this service holds the sink."""
        now = _utcnow()
        with read_transaction(self.engine) as conn:
            mark = conn.execute(
                select(sink_mirrors.c.runs_seen).where(sink_mirrors.c.sink == self.sink)
            ).scalar_one_or_none()
            mark = mark or 0
            found = conn.execute(
                select(runs.c.seq, runs.c.id, runs.c.spec, runs.c.created_at)
                .where(runs.c.kind == "train", runs.c.seq > mark)
                .order_by(runs.c.seq)
                .limit(limit)
            ).all()
            named = [r.id for r in found if self.sink in (r.spec.get("trackers") or [])]
            new = [run_id for run_id in named if run_id not in self._opened(conn, named)]
        new_mark = _new_mark(mark, [(r.seq, r.created_at) for r in found], now)
        if not new and new_mark == mark:
            return []
        with write_transaction(self.engine) as conn:
            if self._require_lease(conn).runs_seen != mark:
                return []  # moved meanwhile; the next tick looks again
            opened = self._open(conn, new, now)
            conn.execute(
                update(sink_mirrors)
                .where(sink_mirrors.c.sink == self.sink)
                .values(runs_seen=new_mark)
            )
        return opened

    def open_cursors(self, limit: int) -> list[Cursor]:
        """The cursors of runs the sink has not finished, least recently served first."""
        query = self._open_cursors().order_by(sink_cursors.c.updated_at).limit(limit)
        with read_transaction(self.engine) as conn:
            return [_cursor(row) for row in conn.execute(query)]

    def cursor(self, run_id: str) -> Cursor | None:
        query = select(sink_cursors).where(
            sink_cursors.c.run_id == run_id, sink_cursors.c.sink == self.sink
        )
        with read_transaction(self.engine) as conn:
            row = conn.execute(query).one_or_none()
        return None if row is None else _cursor(row)

    def is_done(self, run_id: str) -> bool:
        query = select(sink_cursors.c.done).where(
            sink_cursors.c.run_id == run_id, sink_cursors.c.sink == self.sink
        )
        with read_transaction(self.engine) as conn:
            return bool(conn.execute(query).scalar_one_or_none())

    def save(
        self,
        cursor: Cursor,
        *,
        last_event_id: int,
        memo: dict[str, Any],
        outage_since: datetime | None,
        done: bool = False,
    ) -> Cursor:
        """Move the cursor on from where `cursor` says it was. Raises `LeaseLost` when this
        service no longer holds the sink or the cursor moved meanwhile (another holder).

        `done` finishes the run for the sink, unless an event came after `last_event_id`
        meanwhile (a score recorded as the run ended): then the cursor stays open for it. A
        memo marked `REFUSED` finishes it whatever comes."""
        now = _utcnow()
        with write_transaction(self.engine) as conn:
            self._require_lease(conn)
            if done and not memo.get(REFUSED):
                done = not _events_after(conn, cursor.run_id, last_event_id)
            moved = conn.execute(
                update(sink_cursors)
                .where(
                    sink_cursors.c.run_id == cursor.run_id,
                    sink_cursors.c.sink == self.sink,
                    sink_cursors.c.last_event_id == cursor.last_event_id,
                    sink_cursors.c.done.is_(False),
                )
                .values(
                    last_event_id=last_event_id, memo=memo, outage_since=outage_since,
                    done=done, updated_at=now,
                )
            )  # fmt: skip
            if moved.rowcount != 1:
                raise LeaseLost(
                    f"the {self.sink} cursor of run {cursor.run_id} moved from event "
                    f"{cursor.last_event_id} meanwhile: another service mirrors it now"
                )
            self._renew(conn, now)
        return Cursor(cursor.run_id, self.sink, last_event_id, memo, outage_since)

    # ---- helpers -----------------------------------------------------------------------------

    def _open_cursors(self) -> Any:
        return select(sink_cursors).where(
            sink_cursors.c.sink == self.sink, sink_cursors.c.done.is_(False)
        )

    def _mirror_row(self, conn: Connection) -> Row[Any] | None:
        query = select(sink_mirrors).where(sink_mirrors.c.sink == self.sink).with_for_update()
        return conn.execute(query).one_or_none()

    def _require_lease(self, conn: Connection) -> Row[Any]:
        row = self._mirror_row(conn)
        if row is None or row.holder != self.holder:
            holder = row.holder if row is not None else None
            raise LeaseLost(f"the {self.sink} sink is mirrored by {holder or 'nobody'} now")
        return row

    def _renew(self, conn: Connection, now: datetime) -> None:
        conn.execute(
            update(sink_mirrors)
            .where(sink_mirrors.c.sink == self.sink)
            .values(holder=self.holder, lease_expires_at=now + self.lease)
        )

    def _opened(self, conn: Connection, run_ids: Sequence[str]) -> set[str]:
        """Which of these runs have a cursor for this sink already."""
        if not run_ids:
            return set()
        query = select(sink_cursors.c.run_id).where(
            and_(sink_cursors.c.sink == self.sink, sink_cursors.c.run_id.in_(run_ids))
        )
        return set(conn.execute(query).scalars())

    def _open(self, conn: Connection, run_ids: Sequence[str], now: datetime) -> list[str]:
        """Cursors at the start of each run's log, for the runs that have none yet (a run in
        the grace window is seen again, and must not be opened twice)."""
        new = [run_id for run_id in run_ids if run_id not in self._opened(conn, run_ids)]
        if new:
            conn.execute(
                insert(sink_cursors),
                [
                    {"run_id": run_id, "sink": self.sink, "last_event_id": 0, "done": False,
                     "memo": {}, "outage_since": None, "updated_at": now}
                    for run_id in new
                ],
            )  # fmt: skip
        return new


def reopen_finished(conn: Connection, run_id: str) -> None:
    """Reopen every sink's finished cursor of the run, but those whose sink refused it: an
    event was appended after the run ended (the caller holds the run's row lock, as every event
    writer does, and `SinkStore.save` takes it before finishing a cursor)."""
    finished = conn.execute(
        select(sink_cursors.c.sink, sink_cursors.c.memo).where(
            sink_cursors.c.run_id == run_id, sink_cursors.c.done.is_(True)
        )
    ).all()
    reopened = [row.sink for row in finished if not row.memo.get(REFUSED)]
    if reopened:
        conn.execute(
            update(sink_cursors)
            .where(sink_cursors.c.run_id == run_id, sink_cursors.c.sink.in_(reopened))
            .values(done=False)
        )


def _events_after(conn: Connection, run_id: str, event_id: int) -> bool:
    """Whether the run has an event past `event_id`, read under the run's row lock: an event
    writer that holds it commits first, and one that comes later sees the cursor finished
    and reopens it (`reopen_finished`)."""
    conn.execute(select(runs.c.id).where(runs.c.id == run_id).with_for_update())
    after = select(run_events.c.id).where(run_events.c.run_id == run_id, run_events.c.id > event_id)
    return bool(conn.execute(select(exists(after))).scalar())


def _new_mark(mark: int, found: Sequence[tuple[int, datetime]], now: datetime) -> int:
    """Past every run found (seq, created_at), up to the first still in the grace window."""
    for seq, created_at in found:
        if created_at > now - DISCOVERY_GRACE:
            break
        mark = seq
    return mark


def _cursor(row: Row[Any]) -> Cursor:
    return Cursor(row.run_id, row.sink, row.last_event_id, dict(row.memo), row.outage_since)


def _utcnow() -> datetime:
    return datetime.now(UTC)

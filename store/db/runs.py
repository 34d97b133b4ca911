"""The durable run queue and event log: `RunStore`, each method one short transaction
(docs/design/runs.md, "Runs"; the claim of a gang: "Placement and gangs").

The service enqueues runs and reads them; workers claim runs, report progress and events, and
finish them, every write fenced by `(run, worker, attempt)` ("Runs", "Fencing"). The records
it hands out and reads rows into are store/db/records.py; what an enqueue checks besides its
row (limits, idempotency keys), store/db/submissions.py; the fencing and event-log helpers its
transactions share, store/db/fencing.py; the worker registry, store/db/workers.py.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Row, and_, func, insert, literal, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from trainctl.store.db.fencing import (
    active_train_row,
    decode_cursor,
    encode_cursor,
    fenced_update,
    fetch_one,
    insert_event,
    reaped_unclaimed,
    require_owned,
    require_row,
    running_rows,
    same_worker,
    silent_worker,
    state_data,
)
from trainctl.store.db.launches import Launches
from trainctl.store.db.migrations import upgrade_to_head
from trainctl.store.db.placement import ONE_NODE, Placement
from trainctl.store.db.queue import (
    GANG_RESERVE_SECONDS,
    avoided_nodes,
    candidates,
    capacity_of,
    choose_gang_members,
    expired_member,
    leave_gang,
    leave_to_others,
    lock_queued,
    members_of,
    my_place,
    place_gang,
    reserved_for,
    room_to_grow,
)
from trainctl.store.db.records import (
    Checkpoint,
    Event,
    GangPlace,
    Run,
    RunToQueue,
    checkpoint_pairs,
    event_from_row,
    leader_place,
    run_from_row,
    utcnow,
)
from trainctl.store.db.rows import as_json, storable_json
from trainctl.store.db.schema import (
    UTCDateTime,
    build_engine,
    read_transaction,
    run_events,
    run_slots,
    runs,
    workers,
    write_transaction,
)
from trainctl.store.db.sinks import reopen_finished
from trainctl.store.db.submissions import (
    QueueLimits,
    check_owner,
    key_reused,
    keyed_by,
    member_keys,
    queued_values,
    replay_rows,
)
from trainctl.store.db.workers import WorkerStore
from trainctl.store.exceptions import (
    AmbiguousRunId,
    ExperimentBusy,
    LeaseLost,
    RunNotCancellable,
    RunNotFound,
)
from trainctl.store.plans import ForkPoint
from trainctl.store.text import column_text
from trainctl.store.vocabulary import (
    ACTIVE_STATES,
    EVENT_TYPES,
    SHORT_ID_LENGTH,
    TERMINAL_STATES,
)

_PREFIX_PATTERN = re.compile(rf"[0-9a-f]{{{SHORT_ID_LENGTH},31}}")


class RunStore:
    """Runs and their events in one SQL database (SQLite or PostgreSQL), and the registry of
    the workers that run them (`workers`) on the same engine.

    Every method is one short transaction, so the service and several worker processes can
    share the database. Close the store (or use it as a context manager) to release its pool.
    """

    def __init__(self, url: str) -> None:
        self.engine = build_engine(url)
        self.workers = WorkerStore(self.engine)
        """The worker registry (store/db/workers.py): register, heartbeat, drain, list."""
        self.launches = Launches(self)
        """The jobs launch backends submitted (store/db/launches.py)."""

    def create_all(self) -> None:
        """Bring the schema to the newest migration (creating it in an empty database).

        Safe to call from several processes at once; see `store.db.migrations`.
        """
        upgrade_to_head(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---- the service side: submit, read, cancel -------------------------------------------

    def enqueue(
        self,
        kind: str,
        experiment: str,
        spec: dict[str, Any],
        *,
        idempotency_key: str | None = None,
        max_attempts: int = 3,
        depends_on: Iterable[Checkpoint] = (),
        request_digest: str | None = None,
        submitted_by: str | None = None,
        queue_limits: QueueLimits | None = None,
        priority: int = 0,
        placement: Placement = ONE_NODE,
        parent: ForkPoint | None = None,
    ) -> Run:
        """Add a queued run, or return the run an earlier request with the same key created.
        `parent`: where a fork starts, its lineage (`lineage`).

        Raises `Conflict` when the idempotency key was used for a different request,
        `ExperimentBusy` when a train run is enqueued while the experiment has an active one,
        `QueueFull` when `queue_limits` are reached, and `InvalidRequest` for a gang on
        SQLite, whose workers all share one host.
        """
        run = RunToQueue(
            kind, experiment, spec, max_attempts, tuple(depends_on), priority, placement, parent
        )
        [queued] = self.enqueue_all(
            [run],
            idempotency_key=idempotency_key,
            request_digest=request_digest,
            submitted_by=submitted_by,
            queue_limits=queue_limits,
        )
        return queued

    def enqueue_all(
        self,
        queue: Sequence[RunToQueue],
        *,
        idempotency_key: str | None = None,
        request_digest: str | None = None,
        submitted_by: str | None = None,
        queue_limits: QueueLimits | None = None,
    ) -> list[Run]:
        """Add the runs of one request (a sweep's forks) in one transaction: all of them, or
        none when one is refused (`enqueue` says why one is). One idempotency key stands for
        them all: the first run holds it, the others keys derived from it (`member_keys`),
        and a retry gets the same runs back in the same order."""
        if not queue:
            raise ValueError("enqueue_all needs at least one run")
        keys = member_keys(idempotency_key, len(queue))
        rows = [
            queued_values(run, key, request_digest, submitted_by, self.engine.dialect.name)
            for run, key in zip(queue, keys, strict=True)
        ]
        try:
            return self._enqueue_once(rows, queue_limits)
        except IntegrityError:
            # A concurrent request inserted the same key or an active train run between our
            # check and our insert (possible on PostgreSQL); checking again now explains why.
            return self._enqueue_once(rows, queue_limits)

    def _enqueue_once(self, rows: list[dict[str, Any]], limits: QueueLimits | None) -> list[Run]:
        with write_transaction(self.engine) as conn:
            first = rows[0]
            if first["idempotency_key"] is not None:
                existing = fetch_one(
                    conn, keyed_by(first["submitted_by"], first["idempotency_key"])
                )
                if existing is not None:
                    return replay_rows(conn, existing, rows)
            queued = []
            for values in rows:
                if limits is not None:
                    limits.check(conn, values["submitted_by"])
                if values["kind"] == "train":
                    active = active_train_row(conn, values["experiment"])
                    if active is not None:
                        raise ExperimentBusy(values["experiment"], active.id)
                run_id, now = uuid.uuid4().hex, utcnow()
                conn.execute(
                    insert(runs).values(
                        id=run_id, state="queued", created_at=now, queued_at=now,
                        cancel_requested=False, step=0, attempt=1, **values,
                    )
                )  # fmt: skip
                queued.append(run_from_row(require_row(conn, run_id)))
            return queued

    def replay(
        self,
        idempotency_key: str,
        kind: str,
        request_digest: str,
        submitted_by: str | None = None,
    ) -> Run | None:
        """The run an earlier request of this submitter with this key created, if any (before
        resolving again). A key is its submitter's own: another token's is another request.

        Raises `Conflict` when the key was used for a different request.
        """
        replayed = self.replay_all(idempotency_key, kind, request_digest, submitted_by, 1)
        return replayed[0] if replayed else None

    def replay_all(
        self,
        idempotency_key: str,
        kind: str,
        request_digest: str,
        submitted_by: str | None,
        count: int,
    ) -> list[Run] | None:
        """`replay` for a request that queued `count` runs (`enqueue_all`): all of them, in
        their order, or None where the key is new."""
        keys = member_keys(idempotency_key, count)
        scoped = [keyed_by(submitted_by, key) for key in keys if key is not None]
        with read_transaction(self.engine) as conn:
            found = [fetch_one(conn, condition) for condition in scoped]
        first = found[0]
        if first is None:
            return None
        if first.kind != kind or first.request_digest != request_digest:
            raise key_reused(idempotency_key, first.id)
        return [run_from_row(row) for row in found if row is not None]

    def get(self, run_id: str) -> Run:
        with read_transaction(self.engine) as conn:
            return run_from_row(require_row(conn, run_id))

    def resolve_id(self, id_or_prefix: str) -> str:
        """The id of the run that `id_or_prefix` names: its whole id, or a prefix of it of at
        least SHORT_ID_LENGTH characters (its short id is one). The one place an id a person
        typed becomes a run's id; the API resolves every `{run_id}` of a path through it.

        Raises `RunNotFound` when no run has that id or prefix (a shorter text names a run
        only as its whole id), `AmbiguousRunId` when several runs start with it.
        """
        with read_transaction(self.engine) as conn:
            if conn.execute(select(runs.c.id).where(runs.c.id == id_or_prefix)).first():
                return id_or_prefix
            if len(id_or_prefix) < SHORT_ID_LENGTH:
                why = f"a prefix of a run's id names it only from {SHORT_ID_LENGTH} characters on"
                raise RunNotFound(id_or_prefix, why)
            if _PREFIX_PATTERN.fullmatch(id_or_prefix) is None:
                raise RunNotFound(id_or_prefix)  # no run id has another character
            # Hex digits only: LIKE's wildcards cannot occur, and lowercase reads alike on
            # SQLite (LIKE ignores ASCII case there) and PostgreSQL (it does not).
            matching = runs.c.id.like(f"{id_or_prefix}%")
            count, first = conn.execute(
                select(func.count(), func.min(runs.c.id)).where(matching)
            ).one()
        if count == 0:
            raise RunNotFound(id_or_prefix)
        if count > 1:
            raise AmbiguousRunId(id_or_prefix, count)
        return str(first)

    def list_runs(
        self,
        *,
        kind: str | None = None,
        state: str | None = None,
        experiment: str | None = None,
        submitted_by: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> tuple[list[Run], str | None]:
        """Runs newest first, `limit` at a time; pass the returned cursor to get the next page.

        Keyset pagination (not OFFSET): a page stays correct while new runs are enqueued.
        """
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        conditions: list[ColumnElement[bool]] = []
        if kind is not None:
            conditions.append(runs.c.kind == kind)
        if state is not None:
            conditions.append(runs.c.state == state)
        if experiment is not None:
            conditions.append(runs.c.experiment == experiment)
        if submitted_by is not None:
            conditions.append(runs.c.submitted_by == submitted_by)
        if cursor is not None:
            created_at, seq = decode_cursor(cursor)
            conditions.append(
                or_(
                    runs.c.created_at < created_at,
                    and_(runs.c.created_at == created_at, runs.c.seq < seq),
                )
            )
        query = (
            select(runs)
            .where(*conditions)
            .order_by(runs.c.created_at.desc(), runs.c.seq.desc())
            .limit(limit + 1)  # one extra row tells us whether another page exists
        )
        with read_transaction(self.engine) as conn:
            rows = conn.execute(query).all()
        page = rows[:limit]
        next_cursor = (
            encode_cursor(page[-1].created_at, page[-1].seq) if len(rows) > limit else None
        )
        return [run_from_row(row) for row in page], next_cursor

    def forks_of(self, run_ids: Iterable[str]) -> list[Run]:
        """The runs forked from checkpoints that any of `run_ids` saved, oldest first."""
        ids = sorted(set(run_ids))
        if not ids:
            return []
        query = (
            select(runs)
            .where(runs.c.parent_run_id.in_(ids))
            .order_by(runs.c.created_at, runs.c.seq)
        )
        with read_transaction(self.engine) as conn:
            return [run_from_row(row) for row in conn.execute(query).all()]

    def request_cancel(self, run_id: str, only_of: str | None = None) -> Run:
        """Cancel a queued run now; ask the worker of a running run to stop at a step boundary.

        With `only_of` (a token name), only a run that token submitted: another's, or one
        queued without token identities, raises `Forbidden` (docs/design/access.md,
        "Admission and access").
        """
        with write_transaction(self.engine) as conn:
            row = require_row(conn, run_id, lock=True)
            if only_of is not None:
                check_owner(row, only_of)
            if row.state in TERMINAL_STATES:
                raise RunNotCancellable(
                    f"run {run_id} is already {row.state}; only queued or running runs "
                    "can be cancelled"
                )
            if row.state == "queued":
                return self._transition(
                    conn, row, "cancelled", "cancelled before it started", finished=True
                )
            if not row.cancel_requested:
                conn.execute(update(runs).where(runs.c.id == run_id).values(cancel_requested=True))
                insert_event(conn, run_id, "state", state_data(
                    row, "running", "cancel requested; the worker stops at the next step"
                ) | {"cancel_requested": True})  # fmt: skip
            return run_from_row(require_row(conn, run_id))

    def cancel_if_queued(self, run_id: str, reason: str) -> bool:
        """Cancel the run if it is still queued, saying why; False (and nothing written) once
        a worker has claimed it or it has ended: a run at work is not taken from its worker."""
        with write_transaction(self.engine) as conn:
            row = require_row(conn, run_id, lock=True)
            if row.state != "queued":
                return False
            self._transition(conn, row, "cancelled", reason, finished=True)
            return True

    def is_cancel_requested(self, run_id: str) -> bool:
        with read_transaction(self.engine) as conn:
            return bool(require_row(conn, run_id).cancel_requested)

    def active_train_run(self, experiment: str) -> Run | None:
        """The queued or running train run of `experiment`; there is at most one."""
        with read_transaction(self.engine) as conn:
            row = active_train_row(conn, experiment)
        return None if row is None else run_from_row(row)

    def protected_checkpoints(self) -> set[Checkpoint]:
        """Checkpoints that queued or running runs still need; retention must keep them."""
        query = select(runs.c.depends_on).where(runs.c.state.in_(ACTIVE_STATES))
        with read_transaction(self.engine) as conn:
            lists = conn.execute(query).scalars().all()
        return {pair for depends_on in lists for pair in checkpoint_pairs(depends_on)}

    # ---- the worker side: claim, report, finish ---------------------------------------------

    def claim(
        self,
        worker_id: str,
        lease_seconds: float,
        *,
        rendezvous: Callable[[], str] | None = None,
        reserve_after: float = GANG_RESERVE_SECONDS,
    ) -> Run | None:
        """The next run for `worker_id`, or None: a gang place a leader gave it, else the first
        queued run it can serve (highest priority, then oldest), else None.

        A gang run met first is gathered with idle live peers in this transaction, this worker
        leading it; `rendezvous()` gives the host:port its members meet at (a free port on this
        node). Rules and races: store/db/queue.py. Two claimers never get the same run: SQLite
        serialises them with BEGIN IMMEDIATE; PostgreSQL locks the chosen row and lets other
        claimers skip it (FOR UPDATE SKIP LOCKED).
        """
        now = utcnow()
        lease_until = now + timedelta(seconds=lease_seconds)
        with write_transaction(self.engine) as conn:
            me = conn.execute(
                select(workers).where(workers.c.id == worker_id).with_for_update()
            ).one_or_none()
            if me is not None and me.drain_requested_at is not None:
                return None  # draining: it hands back what it has and takes nothing more
            if me is not None and me.run_id is not None:
                placed = self._given_place(conn, worker_id)
                if placed is not None:
                    return placed
                # Left over from a run this worker no longer works on (it asks only when idle).
                conn.execute(update(workers).where(workers.c.id == worker_id).values(run_id=None))
            cap = None if me is None else capacity_of(me)
            for run_id in candidates(conn, cap):
                row = lock_queued(conn, run_id)
                if row is None:
                    continue  # another claimer holds it
                if row.nnodes == 1:
                    if leave_to_others(conn, cap, row, now, lease_seconds):
                        continue  # its stragglers were on this node, and another is free
                    return self._start(
                        conn, row, worker_id, now, lease_until, f"claimed by {worker_id}"
                    )
                assert me is not None and cap is not None  # the unregistered see no gangs
                members = choose_gang_members(conn, cap, row, now, lease_seconds)
                if members is not None:
                    endpoint = rendezvous() if rendezvous else f"{me.address or me.host}:29400"
                    place_gang(conn, row, [m.worker_id for m in members], endpoint, lease_until)
                    names = ", ".join(m.worker_id for m in members)
                    reason = (
                        f"claimed by a gang of {len(members)} workers ({names}); leader {worker_id}"
                    )
                    started = self._start(conn, row, worker_id, now, lease_until, reason)
                    gang = leader_place(row, len(members), endpoint)
                    return dataclasses.replace(started, gang=gang)
                if reserved_for(conn, row, now, lease_seconds, reserve_after):
                    return None  # keep this worker free for the gang (store/db/queue.py)
        return None

    def _start(
        self,
        conn: Connection,
        row: Row[Any],
        worker_id: str,
        now: datetime,
        lease_until: datetime,
        reason: str,
    ) -> Run:
        started = conn.execute(
            update(runs)
            .where(runs.c.id == row.id, runs.c.state == "queued")
            .values(
                state="running",
                worker_id=worker_id,
                started_at=func.coalesce(runs.c.started_at, literal(now, UTCDateTime())),
                lease_expires_at=lease_until,
            )
            .returning(*runs.c)
        ).one()
        conn.execute(update(workers).where(workers.c.id == worker_id).values(run_id=row.id))
        insert_event(conn, row.id, "state", state_data(started, "queued", reason))
        return run_from_row(started)

    def _given_place(self, conn: Connection, worker_id: str) -> Run | None:
        place = my_place(conn, worker_id)
        if place is None:
            return None
        run = run_from_row(require_row(conn, place.run_id))
        # The attempt the place was given for: a later one fences this member out.
        gang = GangPlace(place.node_rank, place.nnodes, place.rendezvous)
        return dataclasses.replace(run, attempt=place.attempt, gang=gang)

    def room_to_grow(self, run_id: str, lease_seconds: float) -> bool:
        """Whether a running elastic gang on fewer than its nnodes could have all of them
        now (store/db/queue.py); asked by its rank 0 after each checkpoint."""
        with read_transaction(self.engine) as conn:
            return room_to_grow(conn, require_row(conn, run_id), utcnow(), lease_seconds)

    def gang_members(self, run_id: str) -> list[str]:
        """The workers of a running gang, by node rank (empty for other runs)."""
        with read_transaction(self.engine) as conn:
            return members_of(conn, run_id)

    def heartbeat(self, run_id: str, worker_id: str, attempt: int, lease_seconds: float) -> None:
        """Extend the lease (a gang member's own, and the run's for its leader); raises
        `LeaseLost` when the run is no longer this worker's."""
        lease = utcnow() + timedelta(seconds=lease_seconds)
        with write_transaction(self.engine) as conn:
            row = require_owned(conn, run_id, worker_id, attempt)
            if row.worker_id == worker_id:
                conn.execute(update(runs).where(runs.c.id == run_id).values(lease_expires_at=lease))
            if row.nnodes > 1:
                mine = and_(run_slots.c.run_id == run_id, run_slots.c.worker_id == worker_id)
                conn.execute(update(run_slots).where(mine).values(lease_expires_at=lease))

    def set_progress(
        self, run_id: str, worker_id: str, attempt: int, step: int, total_steps: int | None
    ) -> None:
        with write_transaction(self.engine) as conn:
            fenced_update(conn, run_id, worker_id, attempt, step=step, total_steps=total_steps)

    def append_event(
        self,
        run_id: str,
        type: str,
        data: dict[str, Any],
        *,
        worker_id: str | None = None,
        attempt: int | None = None,
    ) -> int:
        """Append an event and return its id. A worker passes its id and attempt to be fenced."""
        if type not in EVENT_TYPES:
            raise ValueError(f"unknown event type {type!r}; expected one of {EVENT_TYPES}")
        if (worker_id is None) != (attempt is None):
            raise ValueError("pass worker_id and attempt together, or neither")
        with write_transaction(self.engine) as conn:
            if worker_id is not None and attempt is not None:
                row = require_owned(conn, run_id, worker_id, attempt)
            else:
                row = require_row(conn, run_id, lock=True)  # see insert_event: ids in order
            event_id = insert_event(conn, run_id, type, storable_json(as_json(data)))
            if type == "metrics" and row.state in TERMINAL_STATES:
                # Scores recorded on a run that has ended (docs/evals.md): its sinks mirror them.
                reopen_finished(conn, run_id)
            avoid = avoided_nodes(type, data)
            if avoid is not None:  # for its next placement, with the report that names them
                conn.execute(
                    update(runs).where(runs.c.id == run_id).values(avoid_nodes=avoid or None)
                )
            return event_id

    def events(
        self, run_id: str, *, after_id: int = 0, limit: int = 1000, type: str | None = None
    ) -> list[Event]:
        """Events of a run with id > `after_id`, oldest first (what a resuming stream needs)."""
        conditions = [run_events.c.run_id == run_id, run_events.c.id > after_id]
        if type is not None:
            conditions.append(run_events.c.type == type)
        query = select(run_events).where(*conditions).order_by(run_events.c.id).limit(limit)
        with read_transaction(self.engine) as conn:
            require_row(conn, run_id)
            rows = conn.execute(query).all()
        return [event_from_row(r) for r in rows]

    def last_event_ids(self, run_ids: Iterable[str]) -> dict[str, int]:
        """The id of each run's newest event (a run without events is left out), in one
        query per 500 runs: how one poller learns which of many followed runs have news
        (service/sse.py). One run's ids become visible in order ("Event log"), so a larger
        id than a follower has seen means events it has not."""
        wanted, newest = list(dict.fromkeys(run_ids)), {}
        with read_transaction(self.engine) as conn:
            for start in range(0, len(wanted), 500):
                query = (
                    select(run_events.c.run_id, func.max(run_events.c.id))
                    .where(run_events.c.run_id.in_(wanted[start : start + 500]))
                    .group_by(run_events.c.run_id)
                )
                newest.update({run_id: int(last) for run_id, last in conn.execute(query)})
        return newest

    def finish(
        self,
        run_id: str,
        worker_id: str,
        attempt: int,
        state: str,
        *,
        result: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> Run:
        """Record how the run ended; raises `LeaseLost` when it is no longer this worker's.

        A success still counts after the run's lease was reaped, as long as nobody has claimed
        it since (`reaped_unclaimed`): its last checkpoint was committed under the lease, so
        running it again would only redo finished work ("Runs", "Fencing").
        """
        if state not in TERMINAL_STATES:
            raise ValueError(f"a run finishes as one of {sorted(TERMINAL_STATES)}, not {state!r}")
        values = {
            "state": state,
            "result": None if result is None else storable_json(as_json(result)),
            "error": None if error is None else column_text(error),
            "finished_at": utcnow(),
            "lease_expires_at": None,
        }
        with write_transaction(self.engine) as conn:
            try:
                row = fenced_update(conn, run_id, worker_id, attempt, **values)
            except LeaseLost:
                if state != "succeeded" or not reaped_unclaimed(conn, run_id, worker_id, attempt):
                    raise
                row = conn.execute(
                    update(runs).where(runs.c.id == run_id, runs.c.state == "queued")
                    .values(worker_id=worker_id, **values).returning(*runs.c)
                ).one()  # fmt: skip
                reason = (
                    f"succeeded in attempt {attempt} on {worker_id}, reported after its lease "
                    f"was reaped and before anyone claimed the run again"
                )
                insert_event(conn, run_id, "state", state_data(row, "queued", reason))
                return run_from_row(row)
            leave_gang(conn, run_id)
            reason = error or f"finished by {worker_id}"
            insert_event(conn, run_id, "state", state_data(row, "running", reason))
        return run_from_row(row)

    def requeue(self, run_id: str, worker_id: str, attempt: int, reason: str) -> Run:
        """Give a running run back to the queue (a worker shutting down gracefully).

        The attempt is not used up: the run did not fail. A gang's next try still gets a new
        attempt number, which fences out members still stopping, with one more allowed. A run
        whose cancel was requested is cancelled instead, since nobody wants it to run again.
        """
        with write_transaction(self.engine) as conn:
            row = require_owned(conn, run_id, worker_id, attempt)
            if row.cancel_requested:
                return self._transition(
                    conn, row, "cancelled", f"{reason}; cancel was requested", finished=True
                )
            fence = {}
            if row.nnodes > 1:
                fence = {"attempt": row.attempt + 1, "max_attempts": row.max_attempts + 1}
            return self._transition(conn, row, "queued", reason, worker_id=None, **fence)

    def give_up(self, run_id: str, worker_id: str, attempt: int, reason: str) -> Run:
        """A gang member lost its peers, or a run broke on the database's absence: requeue
        the run as a new attempt (or fail it when none remain), as a reaper would. Raises
        `LeaseLost` when another member or a reaper did so first."""
        with write_transaction(self.engine) as conn:
            row = require_owned(conn, run_id, worker_id, attempt)
            return self._recover(conn, row, requeue_cause=reason, fail_cause=reason, now=utcnow())

    # ---- recovery: runs whose worker is gone -------------------------------------------------

    def reap_expired(self, now: datetime | None = None) -> list[Run]:
        """Requeue (or fail, when out of attempts) every running run whose lease has expired."""
        now = now or utcnow()
        expired = or_(runs.c.lease_expires_at < now, expired_member(now))
        with write_transaction(self.engine) as conn:
            rows = running_rows(conn, expired)
            recovered = []
            for row in rows:
                who = silent_worker(conn, row, now)
                recovered.append(
                    self._recover(
                        conn,
                        row,
                        requeue_cause=f"lease expired ({who} stopped heartbeating)",
                        fail_cause=f"{who} stopped heartbeating (lease expired)",
                        now=now,
                    )
                )
            return recovered

    def fail_worker_runs(self, worker_id: str, reason: str, *, retry: bool = True) -> list[Run]:
        """Recover every running run of a worker known to be dead, as `reap_expired` would.

        `retry` False fails them at once: what killed the worker (running out of memory)
        would kill the next attempt too.
        """
        now = utcnow()
        with write_transaction(self.engine) as conn:
            rows = running_rows(conn, runs.c.worker_id == worker_id)
            return [
                self._recover(
                    conn, row, requeue_cause=reason, fail_cause=reason, now=now, retry=retry
                )
                for row in rows
            ]

    def _recover(
        self,
        conn: Connection,
        row: Row[Any],
        *,
        requeue_cause: str,
        fail_cause: str,
        now: datetime,
        retry: bool = True,
    ) -> Run:
        """Requeue a run whose worker is gone while attempts remain; fail it otherwise."""
        if row.cancel_requested:
            return self._transition(
                conn,
                row,
                "cancelled",
                f"{fail_cause}; cancel was requested",
                finished=True,
                now=now,
            )
        if not retry:
            error = f"{fail_cause}; not retried"
            return self._transition(conn, row, "failed", error, error=error, finished=True, now=now)
        if row.attempt < row.max_attempts:
            next_attempt = row.attempt + 1
            reason = f"{requeue_cause}; requeued, attempt {next_attempt} of {row.max_attempts}"
            return self._transition(
                conn, row, "queued", reason, worker_id=None, attempt=next_attempt, now=now
            )
        error = (
            f"{fail_cause} and no attempts remain ({row.max_attempts} of {row.max_attempts} used)"
        )
        return self._transition(conn, row, "failed", error, error=error, finished=True, now=now)

    def _transition(
        self,
        conn: Connection,
        row: Row[Any],
        state: str,
        reason: str,
        *,
        finished: bool = False,
        now: datetime | None = None,
        **values: Any,
    ) -> Run:
        """Move `row` to `state` if it is still as read (same state, worker and attempt).

        The callers read the row in the same write transaction, so the guard only matters on
        PostgreSQL when a row was not locked; losing the race there means another writer
        already moved the run, which `LeaseLost` reports.
        """
        now = now or utcnow()
        if values.get("error") is not None:
            values["error"] = column_text(values["error"])
        if finished:
            values["finished_at"] = now
        if state != "running":
            values["lease_expires_at"] = None
        if state == "queued":
            values["queued_at"] = now
        moved = conn.execute(
            update(runs)
            .where(
                runs.c.id == row.id,
                runs.c.state == row.state,
                runs.c.attempt == row.attempt,
                same_worker(row.worker_id),
            )
            .values(state=state, **values)
            .returning(*runs.c)
        ).one_or_none()
        if moved is None:
            raise LeaseLost(f"run {row.id} changed while it was being moved to {state}; retry")
        if row.state == "running":
            leave_gang(conn, row.id)
        insert_event(conn, row.id, "state", state_data(moved, row.state, reason))
        return run_from_row(moved)


# ---- helpers: rows, fencing, events, cursors ------------------------------------------------

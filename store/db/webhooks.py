"""Webhooks: URLs told of run state changes, what is sent to them and how it went
(docs/design/webhooks.md, "Webhooks").

The store keeps four things: the webhooks (URL, events, signing secret), one delivery per
webhook and state change (its body frozen when it is made, so every attempt sends the same
bytes), the delivery log (each attempt's status code or error), and the dispatcher's row
(how far it has read the event log, and a lease so that one service of several dispatches).

Deliveries are made from the event log in the same transaction that moves the cursor past
their events, and the pair (webhook, event) is unique: a restart neither loses a state change
nor makes a second delivery of one. Sending is at least once: a service that dies between a
receiver's 2xx and recording it sends that delivery again, under the same delivery id.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from sqlalchemy import Row, case, delete, func, insert, literal, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from trainctl.store.db.rows import RowReader
from trainctl.store.db.schema import (
    read_transaction,
    run_events,
    webhook_attempts,
    webhook_deliveries,
    webhook_dispatcher,
    webhooks,
    write_transaction,
)
from trainctl.store.exceptions import NotFound
from trainctl.store.text import repair
from trainctl.store.vocabulary import WEBHOOK_EVENTS, RunState, WebhookEvent

SECRET_PREFIX = "whsec_"
DeliveryState = Literal["pending", "succeeded", "failed"]
_ROW = 1  # the dispatcher's row: there is one


@dataclass(frozen=True)
class Webhook:
    id: int
    url: str
    events: list[WebhookEvent]
    secret: str
    after_event_id: int
    """The newest event when the webhook was made: it hears of later changes only."""
    created_by: str | None
    created_at: datetime


@dataclass(frozen=True)
class Attempt:
    """One try at sending a delivery: the receiver's status code, or why there is none."""

    attempt: int
    started_at: datetime
    duration_ms: float
    status_code: int | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None and self.status_code is not None and 200 <= self.status_code < 300


@dataclass(frozen=True)
class Delivery:
    id: str
    webhook_id: int
    run_id: str
    event_id: int
    event: WebhookEvent
    state: DeliveryState
    next_attempt_at: datetime | None
    created_at: datetime
    attempts: list[Attempt]


@dataclass(frozen=True)
class StateChange:
    """A `state` event of the log that moved a run from one state to another, or a `log`
    event recording a loss-health intervention (`state` "health", its record in `health`)."""

    event_id: int
    run_id: str
    state: WebhookEvent
    previous: RunState | None
    reason: str
    created_at: datetime
    health: dict[str, Any] | None = None


@dataclass(frozen=True)
class LogBatch:
    """The event ids after a cursor (every type: the cursor must see gaps), and among those
    events the state changes."""

    event_ids: list[int]
    changes: list[StateChange]


@dataclass(frozen=True)
class NewDelivery:
    id: str
    webhook_id: int
    event_id: int
    run_id: str
    event: WebhookEvent
    body: str


@dataclass(frozen=True)
class Outgoing:
    """A delivery claimed for sending, with what sending needs."""

    id: str
    url: str
    secret: str
    event: WebhookEvent
    body: str
    attempt: int
    """The number of this attempt: 1 for the first."""
    webhook_id: int = 0


@dataclass(frozen=True)
class RetryPolicy:
    """Attempts per delivery, and the wait before each retry: `base_seconds`, doubling, at
    most `max_seconds`."""

    max_attempts: int
    base_seconds: float
    max_seconds: float

    def delay(self, attempts_made: int) -> float:
        return float(min(self.base_seconds * 2.0 ** min(attempts_made - 1, 60), self.max_seconds))


class WebhookNotFound(NotFound):
    def __init__(self, webhook_id: int) -> None:
        super().__init__(
            f"webhook {webhook_id} does not exist; `trainctl webhooks list` shows them"
        )


def new_secret() -> str:
    """256 random bits: a receiver's HMAC key."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


class WebhookStore:
    """The webhook tables of the run database; each method is one short transaction."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # ---- the API: register, list, remove, read the log --------------------------------------

    def create(self, url: str, events: Sequence[WebhookEvent], created_by: str | None) -> Webhook:
        with write_transaction(self.engine) as conn:
            newest = conn.execute(select(func.max(run_events.c.id))).scalar_one()
            values = {
                "url": url,
                "events": sorted(set(events)),
                "secret": new_secret(),
                "after_event_id": newest or 0,
                "created_by": created_by,
                "created_at": _utcnow(),
            }
            webhook_id = conn.execute(insert(webhooks).values(values)).inserted_primary_key
            assert webhook_id is not None, "the database did not return the new webhook's id"
            return _webhook(_require(conn, int(webhook_id[0])))

    def list_webhooks(self) -> list[Webhook]:
        with read_transaction(self.engine) as conn:
            rows = conn.execute(select(webhooks).order_by(webhooks.c.id)).all()
        return [_webhook(row) for row in rows]

    def delete(self, webhook_id: int) -> Webhook:
        """Remove a webhook with its deliveries and their log; nothing more is sent to it."""
        with write_transaction(self.engine) as conn:
            row = _require(conn, webhook_id)
            mine = webhook_deliveries.c.webhook_id == webhook_id
            theirs = select(webhook_deliveries.c.id).where(mine)
            conn.execute(delete(webhook_attempts).where(webhook_attempts.c.delivery_id.in_(theirs)))
            conn.execute(delete(webhook_deliveries).where(mine))
            conn.execute(delete(webhooks).where(webhooks.c.id == webhook_id))
        return _webhook(row)

    def deliveries(self, webhook_id: int, limit: int = 50) -> list[Delivery]:
        """The webhook's newest deliveries, each with its attempts, newest first."""
        query = (
            select(webhook_deliveries)
            .where(webhook_deliveries.c.webhook_id == webhook_id)
            .order_by(webhook_deliveries.c.created_at.desc(), webhook_deliveries.c.event_id.desc())
            .limit(limit)
        )
        with read_transaction(self.engine) as conn:
            _require(conn, webhook_id)
            rows = conn.execute(query).all()
            ids = [row.id for row in rows]
            attempts = conn.execute(
                select(webhook_attempts)
                .where(webhook_attempts.c.delivery_id.in_(ids))
                .order_by(webhook_attempts.c.attempt)
            ).all()
        log: dict[str, list[Attempt]] = {}
        for a in attempts:
            log.setdefault(a.delivery_id, []).append(
                Attempt(a.attempt, a.started_at, a.duration_ms, a.status_code, _error(a.error))
            )
        return [
            Delivery(
                r.id,
                r.webhook_id,
                r.run_id,
                r.event_id,
                r.event,
                r.state,
                r.next_attempt_at,
                r.created_at,
                log.get(r.id, []),
            )
            for r in rows
        ]

    # ---- the dispatcher: lease, event log, deliveries -----------------------------------------

    def take_lease(self, holder: str, seconds: float) -> bool:
        """Become (or stay) the dispatcher for `seconds`; False while another one holds it."""
        now = _utcnow()
        values = {"holder": holder, "lease_expires_at": now + timedelta(seconds=seconds)}
        try:
            with write_transaction(self.engine) as conn:
                row = conn.execute(
                    select(webhook_dispatcher)
                    .where(webhook_dispatcher.c.id == _ROW)
                    .with_for_update()
                ).one_or_none()
                if row is None:
                    conn.execute(insert(webhook_dispatcher).values(id=_ROW, cursor=0, **values))
                    return True
                free = row.lease_expires_at is None or row.lease_expires_at <= now
                if row.holder != holder and not free:
                    return False
                conn.execute(
                    update(webhook_dispatcher).where(webhook_dispatcher.c.id == _ROW).values(values)
                )
                return True
        except IntegrityError:  # another service inserted the row first (PostgreSQL)
            return False

    def release_lease(self, holder: str) -> None:
        """Let another service dispatch at once rather than after the lease runs out."""
        with write_transaction(self.engine) as conn:
            conn.execute(
                update(webhook_dispatcher)
                .where(webhook_dispatcher.c.id == _ROW, webhook_dispatcher.c.holder == holder)
                .values(holder=None, lease_expires_at=None)
            )

    def cursor(self) -> int:
        """The last event id the dispatcher has handled; 0 before it ever ran."""
        query = select(webhook_dispatcher.c.cursor).where(webhook_dispatcher.c.id == _ROW)
        with read_transaction(self.engine) as conn:
            return int(conn.execute(query).scalar_one_or_none() or 0)

    def read_log(self, after: int, limit: int = 1000) -> LogBatch:
        """Up to `limit` events after `after`: their ids, and the state changes among them."""
        ids_query = (
            select(run_events.c.id).where(run_events.c.id > after).order_by(run_events.c.id)
        ).limit(limit)
        with read_transaction(self.engine) as conn:
            ids = list(conn.execute(ids_query).scalars())
            rows = (
                conn.execute(
                    select(run_events)
                    .where(run_events.c.id.in_(ids), run_events.c.type.in_(("state", "log")))
                    .order_by(run_events.c.id)
                ).all()
                if ids
                else []
            )
        return LogBatch(ids, [c for r in rows if (c := _change(r)) is not None])

    def record(self, holder: str, new: Iterable[NewDelivery], cursor: int) -> bool:
        """Add the deliveries (skipping those made already, and those of webhooks removed
        since) and move the cursor, at once; False, with nothing written, without the lease."""
        new = list(new)
        now = _utcnow()
        with write_transaction(self.engine) as conn:
            moved = conn.execute(
                update(webhook_dispatcher)
                .where(
                    webhook_dispatcher.c.id == _ROW,
                    webhook_dispatcher.c.holder == holder,
                    webhook_dispatcher.c.lease_expires_at > now,
                )
                .values(cursor=cursor)
            )
            if moved.rowcount != 1:
                return False
            if not new:
                return True
            alive = set(
                conn.execute(
                    select(webhooks.c.id).where(webhooks.c.id.in_({d.webhook_id for d in new}))
                ).scalars()
            )
            made = {
                (r.webhook_id, r.event_id)
                for r in conn.execute(
                    select(webhook_deliveries.c.webhook_id, webhook_deliveries.c.event_id).where(
                        webhook_deliveries.c.event_id.in_({d.event_id for d in new})
                    )
                )
            }
            rows = [
                {**vars(d), "state": "pending", "attempts": 0, "next_attempt_at": now}
                | {"created_at": now}
                for d in new
                if d.webhook_id in alive and (d.webhook_id, d.event_id) not in made
            ]
            if rows:
                conn.execute(insert(webhook_deliveries), rows)
        return True

    def claim_due(
        self,
        limit: int,
        claim_seconds: float,
        skip: Iterable[str] = (),
        *,
        quotas: Mapping[int, int] | None = None,
        default_quota: int | None = None,
    ) -> list[Outgoing]:
        """Up to `limit` deliveries whose time has come, oldest first, each claimed for
        `claim_seconds`: if this process dies while sending, the delivery is due again once
        that has passed. Of each webhook at most its quota (`quotas`, else `default_quota`;
        none when unset) are taken: its oldest, so one webhook's backlog leaves the rest to
        the others."""
        if limit <= 0:
            return []
        now, d = _utcnow(), webhook_deliveries.c
        rank = func.row_number().over(partition_by=d.webhook_id, order_by=(d.next_attempt_at, d.id))
        ranked = (
            select(d.id, d.webhook_id, rank.label("rank"))
            .where(d.state == "pending", d.next_attempt_at <= now, d.id.not_in(list(skip)))
            .subquery()
        )
        chosen = select(ranked.c.id)
        if quotas or default_quota is not None:
            default = literal(limit if default_quota is None else default_quota)
            quota = (
                case(dict(quotas), value=ranked.c.webhook_id, else_=default) if quotas else default
            )
            chosen = chosen.where(ranked.c.rank <= quota)
        due = (
            select(d.id)
            .where(d.id.in_(chosen), d.state == "pending", d.next_attempt_at <= now)
            .order_by(d.next_attempt_at, d.id)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        with write_transaction(self.engine) as conn:
            ids = list(conn.execute(due).scalars())
            if not ids:
                return []
            conn.execute(
                update(webhook_deliveries)
                .where(webhook_deliveries.c.id.in_(ids))
                .values(next_attempt_at=now + timedelta(seconds=claim_seconds))
            )
            rows = conn.execute(
                select(webhook_deliveries, webhooks.c.url, webhooks.c.secret)
                .join(webhooks, webhooks.c.id == webhook_deliveries.c.webhook_id)
                .where(webhook_deliveries.c.id.in_(ids))
                .order_by(webhook_deliveries.c.next_attempt_at, webhook_deliveries.c.event_id)
            ).all()
        return [
            Outgoing(r.id, r.url, r.secret, r.event, r.body, r.attempts + 1, r.webhook_id)
            for r in rows
        ]

    def record_attempt(
        self, delivery_id: str, attempt: Attempt, retry: RetryPolicy
    ) -> DeliveryState | None:
        """Log an attempt; the delivery is then done, given up, or due again after a backoff.
        Returns its state; None when the delivery was removed meanwhile (with its webhook)."""
        with write_transaction(self.engine) as conn:
            row = conn.execute(
                select(webhook_deliveries)
                .where(webhook_deliveries.c.id == delivery_id)
                .with_for_update()
            ).one_or_none()
            if row is None:
                return None
            made = row.attempts + 1
            conn.execute(
                insert(webhook_attempts).values(
                    delivery_id=delivery_id, **{**vars(attempt), "attempt": made}
                )
            )
            state: DeliveryState = "pending"
            next_attempt_at = None
            if attempt.ok:
                state = "succeeded"
            elif made >= retry.max_attempts:
                state = "failed"
            else:
                next_attempt_at = _utcnow() + timedelta(seconds=retry.delay(made))
            conn.execute(
                update(webhook_deliveries)
                .where(webhook_deliveries.c.id == delivery_id)
                .values(state=state, attempts=made, next_attempt_at=next_attempt_at)
            )
        return state

    def release(self, delivery_ids: Iterable[str]) -> None:
        """Make claimed deliveries due now: their sending was stopped (a service stopping)."""
        ids = list(delivery_ids)
        if not ids:
            return
        with write_transaction(self.engine) as conn:
            conn.execute(
                update(webhook_deliveries)
                .where(webhook_deliveries.c.id.in_(ids), webhook_deliveries.c.state == "pending")
                .values(next_attempt_at=_utcnow())
            )


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _require(conn: Connection, webhook_id: int) -> Row[Any]:
    row = conn.execute(select(webhooks).where(webhooks.c.id == webhook_id)).one_or_none()
    if row is None:
        raise WebhookNotFound(webhook_id)
    return row


def _change(r: Row[Any]) -> StateChange | None:
    """The change an event of the log notifies, if any."""
    if r.type == "log":  # only a loss-health intervention's line (worker.training.health)
        health = r.data.get("health")
        if not isinstance(health, dict):
            return None
        return StateChange(r.id, r.run_id, "health", None, str(r.data.get("message", "")),
                           r.created_at, health)  # fmt: skip
    # A cancel request is a `state` event too, but the run stays where it was.
    if r.data.get("state") == r.data.get("previous"):
        return None
    return StateChange(r.id, r.run_id, r.data["state"], r.data["previous"],
                       r.data.get("reason", ""), r.created_at)  # fmt: skip


def _webhook(row: Row[Any]) -> Webhook:
    """Read on the columns' own terms, so one bad row never breaks a listing (rows.py)."""
    reader = RowReader(f"webhook {row.id}")
    url, created_by = reader.text("url", row.url) or "", reader.text("created_by", row.created_by)
    events = [e for e in reader.json("events", row.events, list) or [] if e in WEBHOOK_EVENTS]
    return Webhook(row.id, url, events, row.secret, row.after_event_id, created_by,
                   row.created_at)  # fmt: skip


def _error(text: str | None) -> str | None:
    return None if text is None else repair(text)

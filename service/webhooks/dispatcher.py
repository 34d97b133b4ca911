"""The webhook dispatcher: reads run state changes from the event log, makes deliveries and
sends them, in a thread of its own (docs/design/webhooks.md, "Webhooks").

The thread runs an asyncio loop, so that sends wait on the network without holding threads;
the store's calls, which block, go to worker threads. Every `poll_seconds` it:

1. takes (or renews) the dispatcher lease; a service without it does nothing else, so of
   several services on one database only one dispatches;
2. reads the event log after its cursor, makes a delivery per state change and subscribed
   webhook, and moves the cursor, in one transaction (`WebhookStore.record`);
3. claims due deliveries up to its free slots (`Slots`) and sends each as a task with a
   deadline (`sending.send`); the outcome goes to the delivery log.

One receiver never holds up another (`Slots`): each webhook has its own slots
(`webhook_concurrency`), one only while its last attempt failed, and the webhooks whose last
attempt failed share at most half of all the slots, the rest being kept for the others. A
slow or dead receiver costs its slot for at most `webhook_timeout_seconds`; the API never
waits for it. With no webhook registered the dispatcher only looks again now and then, or
when this service registers one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx

from trainctl.service.presenters import public_run
from trainctl.service.schemas import EvalScoresPublic, WebhookPayload
from trainctl.service.settings import Settings
from trainctl.service.webhooks.sending import build_http, send
from trainctl.service.webhooks.targets import HostPolicy
from trainctl.store.db.runs import RunStore
from trainctl.store.db.scores import latest_scores
from trainctl.store.db.webhooks import (
    NewDelivery,
    Outgoing,
    RetryPolicy,
    StateChange,
    Webhook,
    WebhookStore,
)

log = logging.getLogger("trainctl.webhooks")

LEASE_SECONDS = 15.0
"""How long the dispatcher lease lasts unrenewed: another service takes over after that."""
IDLE_SECONDS = 5.0
"""How often a dispatcher with nothing to do (no webhook, or no lease) looks again."""
ERROR_SECONDS = 5.0
"""The pause after a failed round (the database did not answer)."""
BATCH = 1000
"""Events read from the log per round."""
GAP_SECONDS = 60.0
"""How long a missing event id holds the cursor back (see `next_cursor`)."""
CLAIM_MARGIN_SECONDS = 60.0
"""A claimed delivery is due again this long after its attempt's deadline: the service that
claimed it died while sending."""
MAX_IN_FLIGHT = 256
"""Deliveries in flight at once, to all webhooks: open connections, a bound on sockets."""


@dataclass(frozen=True)
class DispatchConfig:
    timeout: float
    concurrency: int
    poll_seconds: float
    retry: RetryPolicy
    policy: HostPolicy
    lease_seconds: float  # the workers': a queued run in a payload says why it waits

    @classmethod
    def from_settings(cls, settings: Settings) -> DispatchConfig:
        retry = RetryPolicy(
            settings.webhook_max_attempts,
            settings.webhook_retry_seconds,
            settings.webhook_retry_max_seconds,
        )
        return cls(
            settings.webhook_timeout_seconds,
            settings.webhook_concurrency,
            settings.webhook_poll_seconds,
            retry,
            settings.webhook_policy,
            settings.lease_seconds,
        )


def next_cursor(
    cursor: int, event_ids: Sequence[int], gaps: dict[int, float], now: float, grace: float
) -> int:
    """How far the cursor may move over `event_ids` (ascending, all after `cursor`).

    On PostgreSQL an event id is taken at INSERT and becomes visible at COMMIT, so events of
    different runs can appear out of order: 11 before 10. A cursor moved past a missing 10
    would skip it for good, so it stops below a missing id until `grace` seconds after the
    gap was first seen (`gaps`: the id after it -> when, by this process's clock); a gap that
    old is an id no commit will fill (a rolled back insert). SQLite serialises its writers
    and never leaves one. Events past a gap are delivered without waiting: the store skips
    deliveries made already.
    """
    for event_id in event_ids:
        if event_id != cursor + 1:
            first_seen = gaps.setdefault(event_id, now)
            if now - first_seen < grace:
                break
        cursor = event_id
    for seen in [i for i in gaps if i <= cursor]:
        del gaps[seen]
    return cursor


@dataclass
class Slots:
    """Who may send now: each webhook at most `per_webhook` deliveries at once, one while its
    last attempt failed; in all at most `total`, of which the failing webhooks together hold
    at most half, so a crowd of dead receivers cannot take the slots of a live one."""

    per_webhook: int
    total: int = MAX_IN_FLIGHT
    flying: dict[str, int] = field(default_factory=dict)
    """Delivery id -> its webhook, for the deliveries being sent."""
    failing: set[int] = field(default_factory=set)
    """Webhooks whose last attempt failed (reset by one that succeeds)."""

    def take(self, outgoing: Outgoing) -> None:
        self.flying[outgoing.id] = outgoing.webhook_id

    def done(self, outgoing: Outgoing, ok: bool | None) -> None:
        """A send ended; `ok` says how (None: not known, as when it was stopped)."""
        self.flying.pop(outgoing.id, None)
        if ok is True:
            self.failing.discard(outgoing.webhook_id)
        elif ok is False:
            self.failing.add(outgoing.webhook_id)

    def claims(self) -> Claims:
        """What may be claimed now."""
        busy: dict[int, int] = {}
        for webhook in self.flying.values():
            busy[webhook] = busy.get(webhook, 0) + 1
        healthy = {w: max(self.per_webhook - n, 0) for w, n in busy.items()}
        failing = {w: max(1 - busy.get(w, 0), 0) for w in self.failing}
        failing_busy = sum(busy.get(w, 0) for w in self.failing)
        return Claims(
            free=self.total - len(self.flying),
            healthy=healthy | dict.fromkeys(self.failing, 0),
            per_webhook=self.per_webhook,
            failing_free=self.total // 2 - failing_busy,
            failing=failing,
        )


@dataclass(frozen=True)
class Claims:
    """How many deliveries a round may claim: `free` in all, of each webhook its quota
    (`healthy`, else `per_webhook`), and of those failing at most `failing_free` together,
    each its quota in `failing`."""

    free: int
    healthy: dict[int, int]
    per_webhook: int
    failing_free: int
    failing: dict[int, int]


@dataclass
class Round:
    """What one round found: deliveries to send, and how long to rest before the next."""

    due: list[Outgoing] = field(default_factory=list)
    pause: float = 0.0


class Dispatcher:
    """Start it once per service (`start`), stop it before the stores close (`stop`)."""

    def __init__(self, store: WebhookStore, runs: RunStore, config: DispatchConfig) -> None:
        self.store, self.runs, self.config = store, runs, config
        # Names the lease holder in the database: which service dispatches.
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._nudge: asyncio.Event | None = None
        self._ready = threading.Event()
        self._stopping = False
        self._gaps: dict[int, float] = {}
        self._leading = False
        self._in_flight: dict[str, asyncio.Task[None]] = {}
        """Deliveries being sent, by id: never claimed twice by this process."""
        self._slots = Slots(config.concurrency)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name="trainctl-webhooks", daemon=True)
        self._thread.start()
        self._ready.wait(timeout=10)

    def wake(self) -> None:
        """Look at the log now (a webhook was registered), not at the next idle check."""
        if self._loop is not None and self._nudge is not None:
            self._loop.call_soon_threadsafe(self._nudge.set)

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel the sends in flight (they are due again at once) and give up the lease."""
        self._stopping = True
        self.wake()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.error("the webhook dispatcher did not stop within %g s", timeout)

    # ---- the thread ---------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except Exception:  # logged where operators look; the thread has nothing to return to
            log.exception("the webhook dispatcher stopped on an error; no webhook is sent")
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._loop, self._nudge = asyncio.get_running_loop(), asyncio.Event()
        self._ready.set()
        async with build_http(self.config.timeout) as http:
            try:
                while not self._stopping:
                    # The slots are read here, in the loop's thread that changes them.
                    round_ = await self._round(set(self._in_flight), self._slots.claims())
                    for outgoing in round_.due:
                        self._slots.take(outgoing)
                        task = asyncio.create_task(self._deliver(http, outgoing))
                        self._in_flight[outgoing.id] = task
                    await self._rest(round_.pause)
            finally:
                await self._wind_down()

    async def _round(self, in_flight: set[str], claims: Claims) -> Round:
        try:
            return await asyncio.to_thread(self._dispatch, in_flight, claims)
        except Exception:
            log.exception("webhook dispatch failed; trying again in %g s", ERROR_SECONDS)
            return Round(pause=ERROR_SECONDS)

    async def _rest(self, seconds: float) -> None:
        assert self._nudge is not None
        if seconds > 0 and not self._nudge.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._nudge.wait(), seconds)
        self._nudge.clear()

    async def _deliver(self, http: httpx.AsyncClient, outgoing: Outgoing) -> None:
        ok: bool | None = None
        try:
            attempt = await send(http, outgoing, self.config.policy, self.config.timeout)
            ok = attempt.ok
            state = await asyncio.to_thread(
                self.store.record_attempt, outgoing.id, attempt, self.config.retry
            )
        except Exception:
            # Not recorded: the claim runs out and the delivery is sent again, same id.
            log.exception("could not record an attempt of webhook delivery %s", outgoing.id)
            return
        finally:
            self._in_flight.pop(outgoing.id, None)
            self._slots.done(outgoing, ok)
            self.wake()  # a slot is free: claim what waits for it now, not at the next poll
        if state == "failed":
            log.warning("webhook delivery %s to %s given up after %d attempts: %s",
                        outgoing.id, outgoing.url, attempt.attempt,
                        attempt.error or f"HTTP {attempt.status_code}")  # fmt: skip

    async def _wind_down(self) -> None:
        stopped = dict(self._in_flight)
        for task in stopped.values():
            task.cancel()
        await asyncio.gather(*stopped.values(), return_exceptions=True)
        try:
            await asyncio.to_thread(self.store.release, list(stopped))
            if self._leading:
                await asyncio.to_thread(self.store.release_lease, self.holder)
        except Exception:
            log.exception("could not hand back the webhook dispatcher's claims on stopping")

    # ---- one round, in a worker thread ----------------------------------------------------------

    def _dispatch(self, in_flight: set[str], claims: Claims) -> Round:
        hooks = self.store.list_webhooks()
        if not hooks:
            if self._leading:
                self.store.release_lease(self.holder)
                self._leading = False
            return Round(pause=IDLE_SECONDS)
        self._leading = self.store.take_lease(self.holder, LEASE_SECONDS)
        if not self._leading:
            return Round(pause=IDLE_SECONDS)
        stored = self.store.cursor()
        # Events no webhook was registered for yet are nobody's business.
        start = max(stored, min(h.after_event_id for h in hooks))
        batch = self.store.read_log(start, BATCH)
        cursor = next_cursor(start, batch.event_ids, self._gaps, time.monotonic(), GAP_SECONDS)
        new = self._deliveries(batch.changes, hooks)
        if (cursor != stored or new) and not self.store.record(self.holder, new, cursor):
            self._leading = False  # the lease ran out meanwhile: another service may have it
            return Round(pause=IDLE_SECONDS)
        due = self._claim(claims, in_flight)
        more = len(batch.event_ids) == BATCH
        return Round(due, pause=0.0 if more else self.config.poll_seconds)

    def _claim(self, claims: Claims, in_flight: set[str]) -> list[Outgoing]:
        """The healthy webhooks' due deliveries first, then the failing ones' (`Slots`)."""
        seconds = self.config.timeout + CLAIM_MARGIN_SECONDS
        due = self.store.claim_due(
            claims.free, seconds, in_flight, quotas=claims.healthy, default_quota=claims.per_webhook
        )
        limit = min(claims.free - len(due), claims.failing_free)
        if claims.failing and limit > 0:
            due += self.store.claim_due(
                limit, seconds, in_flight, quotas=claims.failing, default_quota=0
            )
        return due

    def _deliveries(self, changes: list[StateChange], hooks: list[Webhook]) -> list[NewDelivery]:
        new = []
        for change in changes:
            subscribed = [
                h for h in hooks if change.state in h.events and change.event_id > h.after_event_id
            ]
            if not subscribed:
                continue
            run = public_run(self.runs, self.config.lease_seconds, self.runs.get(change.run_id))
            evals = {
                task: EvalScoresPublic(step=scores.step, metrics=scores.metrics)
                for task, scores in latest_scores(self.runs, change.run_id).items()
            }
            for hook in subscribed:
                delivery_id = uuid.uuid4().hex
                payload = WebhookPayload(
                    delivery_id=delivery_id,
                    event=change.state,
                    previous=change.previous,
                    reason=change.reason,
                    event_id=change.event_id,
                    occurred_at=change.created_at,
                    run=run,
                    evals=evals,
                    health=change.health,
                )
                new.append(NewDelivery(delivery_id, hook.id, change.event_id, change.run_id,
                                       change.state, payload.model_dump_json()))  # fmt: skip
        return new

"""A run's event log as a server-sent-event stream (docs/design/runs.md, "Runs", "SSE").

One `EventFeed` per process polls the store for every open stream and wakes only the streams
whose run has news: a thousand idle streams cost one query a tick, not a thousand (which
slowed `/healthz` to 1.6 s). It also ends the streams of a token revoked since they opened.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass, field
from typing import Any

from starlette.concurrency import run_in_threadpool

from trainctl.service.history import PAGE
from trainctl.service.schemas import EventPublic, StreamEndPublic
from trainctl.store.db.records import Event
from trainctl.store.db.runs import RunStore
from trainctl.store.db.tokens import TokenStore
from trainctl.store.vocabulary import EVENT_TYPES, TERMINAL_STATES

log = logging.getLogger("trainctl.service")

POLL_SECONDS = 0.25
TOKEN_CHECK_SECONDS = 2.0
"""How often the feed asks again who holds each stream's token (the token store answers from
its cache, at most `IDENTITY_SECONDS` old, so a revocation in another process ends a stream
within about 7 s, and one in this process within 2)."""
MAX_EVENT_ID = 2**63 - 1
"""Event ids are the database's 64-bit integers; a larger Last-Event-ID cannot be queried."""
MEDIA_TYPE = "text/event-stream"
HEADERS = {
    "Cache-Control": "no-cache",
    # Tell nginx-style proxies not to buffer the stream, or clients see events in bursts.
    "X-Accel-Buffering": "no",
}
# Before OpenAPI 3.2's `itemSchema`, a text/event-stream `schema` describes one frame: its
# fields are strings, and `data` holds JSON, described by `contentSchema`.
FRAME_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["event", "data"],
    "properties": {
        "id": {"type": "string", "description": "The event's id; the end frame has none."},
        "event": {"type": "string", "enum": [*EVENT_TYPES, "end"]},
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": {
                "anyOf": [EventPublic.model_json_schema(), StreamEndPublic.model_json_schema()]
            },
        },
    },
}


def event_frame(event: Event) -> str:
    data = EventPublic.model_validate(event).model_dump_json()
    return f"id: {event.id}\nevent: {event.type}\ndata: {data}\n\n"


def end_frame(run_id: str, state: str) -> str:
    data = json.dumps({"run_id": run_id, "state": state}, separators=(",", ":"))
    return f"event: end\ndata: {data}\n\n"


@dataclass(eq=False)
class Follower:
    """One open stream, as the feed sees it: its run, the last event id it has sent, and
    the token it was opened with (None on a service without tokens)."""

    run_id: str
    after_id: int
    token: str | None
    news: asyncio.Event = field(default_factory=asyncio.Event)
    revoked: bool = False


class EventFeed:
    """The one poller of a process's event streams (see the module docstring)."""

    def __init__(
        self,
        runs: RunStore,
        tokens: TokenStore,
        poll_seconds: float = POLL_SECONDS,
        token_check_seconds: float = TOKEN_CHECK_SECONDS,
    ) -> None:
        self.runs, self.tokens = runs, tokens
        self.poll_seconds, self.token_check_seconds = poll_seconds, token_check_seconds
        self.followers: set[Follower] = set()
        self._task: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def follow(self, run_id: str, after_id: int, token: str | None) -> Iterator[Follower]:
        follower = Follower(run_id, after_id, token)
        self.followers.add(follower)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._poll())
        try:
            yield follower
        finally:
            self.followers.discard(follower)

    async def _poll(self) -> None:
        checked = time.monotonic()
        while self.followers:
            try:
                await self._wake_those_with_news()
                if time.monotonic() - checked >= self.token_check_seconds:
                    checked = time.monotonic()
                    await self._end_revoked()
            except Exception:  # a database that is down for a moment: the streams wait
                log.exception("the event feed could not poll the run database")
            await asyncio.sleep(self.poll_seconds)

    async def _wake_those_with_news(self) -> None:
        followers = list(self.followers)
        newest = await run_in_threadpool(self.runs.last_event_ids, {f.run_id for f in followers})
        for follower in followers:
            if newest.get(follower.run_id, 0) > follower.after_id:
                follower.news.set()

    async def _end_revoked(self) -> None:
        followers = list(self.followers)
        tokens = {f.token for f in followers if f.token is not None}
        if not tokens:
            return
        held = await run_in_threadpool(lambda: {t: self.tokens.identify(t) for t in tokens})
        for follower in followers:
            if follower.token is not None and held[follower.token] is None:
                follower.revoked = True
                follower.news.set()


async def stream_events(
    feed: EventFeed,
    run_id: str,
    after_id: int = 0,
    token: str | None = None,
    *,
    keepalive_seconds: float,
) -> AsyncGenerator[str, None]:
    """Frames of every event after `after_id`, following the run until it is finished, or
    until the token the stream was opened with is revoked (a comment, then the end)."""
    runs = feed.runs
    with feed.follow(run_id, after_id, token) as follower:
        while not follower.revoked:
            follower.news.clear()
            # Read the state *before* the events: if the run was already finished then, the
            # events read afterwards include its last one, so nothing is lost by ending.
            state = (await run_in_threadpool(runs.get, run_id)).state
            events = await run_in_threadpool(runs.events, run_id, after_id=after_id, limit=PAGE)
            for event in events:
                yield event_frame(event)
                after_id = follower.after_id = event.id
            if events:
                continue  # at once: a page may not hold them all, and the run may have ended
            if state in TERMINAL_STATES:
                yield end_frame(run_id, state)
                return
            try:
                await asyncio.wait_for(follower.news.wait(), keepalive_seconds)
            except TimeoutError:
                # A comment line: keeps proxies and client read timeouts from closing an
                # idle stream (a queued run can wait for hours).
                yield ": keepalive\n\n"
        # Closed without an end frame: a client reconnects, and its token is refused then.
        yield ": the token of this stream was revoked\n\n"

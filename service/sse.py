"""A run's event log as a server-sent-event stream.

Frames are ``id: <event id>`` / ``event: <type>`` / ``data: <EventPublic JSON>``; a client
that reconnects with ``Last-Event-ID`` gets exactly the events after that id. The store is
polled (one indexed query every `POLL_SECONDS`), which works the same on SQLite and
PostgreSQL and across processes. When the run is finished and everything was sent, a final
``event: end`` frame tells a client following to completion that it may stop.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator
from typing import Any

import anyio
from starlette.concurrency import run_in_threadpool

from trainctl.service.history import PAGE
from trainctl.service.schemas import EventPublic, StreamEndPublic
from trainctl.store.db.runs import Event, RunStore
from trainctl.store.vocabulary import EVENT_TYPES, TERMINAL_STATES

POLL_SECONDS = 0.25
MAX_EVENT_ID = 2**63 - 1
"""Event ids are the database's 64-bit integers; a larger Last-Event-ID cannot be queried."""
KEEPALIVE_SECONDS = 15.0
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


async def stream_events(
    runs: RunStore,
    run_id: str,
    after_id: int = 0,
    *,
    poll_seconds: float = POLL_SECONDS,
    keepalive_seconds: float = KEEPALIVE_SECONDS,
) -> AsyncGenerator[str, None]:
    """Frames of every event after `after_id`, following the run until it is finished."""
    last_sent = time.monotonic()
    while True:
        # Read the state *before* the events: if the run was already finished then, the
        # events read afterwards include its last one, so nothing is lost by ending.
        state = (await run_in_threadpool(runs.get, run_id)).state
        events = await run_in_threadpool(runs.events, run_id, after_id=after_id, limit=PAGE)
        for event in events:
            yield event_frame(event)
            after_id = event.id
        if events:
            last_sent = time.monotonic()
        elif state in TERMINAL_STATES:
            yield end_frame(run_id, state)
            return
        elif time.monotonic() - last_sent >= keepalive_seconds:
            # A comment line: keeps proxies and client read timeouts from closing an idle
            # stream (a queued run can wait for hours).
            yield ": keepalive\n\n"
            last_sent = time.monotonic()
        if not events:
            await anyio.sleep(poll_seconds)

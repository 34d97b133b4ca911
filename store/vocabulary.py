"""The words of the run life cycle and of access (docs/design/runs.md, "Runs"), defined once
(the run kinds are records of their own: store.kinds.registry; the name of a sweep's route is
here, since the SDK posts to it without the kinds).

The store checks writes against them, the API publishes them as enums, and the SDK waits for
the terminal states. This module imports nothing, so the light clients can use it too.
"""

from __future__ import annotations

from typing import Literal, get_args

RunState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
AlertEvent = Literal["straggler", "hang", "health"]
"""What a webhook may hear of besides state changes: a run's `log` event with a field of that
name (the hang and straggler watches, docs/design/hangs.md; a loss-health intervention,
docs/design/health.md)."""
WebhookEvent = Literal[RunState, AlertEvent]
EventType = Literal["state", "metrics", "log", "sample", "eval_items"]
# What an API token may do, each scope allowing what those before it do (store/db/tokens.py).
Scope = Literal["read", "submit", "admin"]

RUN_STATES: tuple[RunState, ...] = get_args(RunState)
ALERT_EVENTS: tuple[AlertEvent, ...] = get_args(AlertEvent)
WEBHOOK_EVENTS: tuple[WebhookEvent, ...] = (*RUN_STATES, *ALERT_EVENTS)
EVENT_TYPES: tuple[EventType, ...] = get_args(EventType)
SCOPES: tuple[Scope, ...] = get_args(Scope)
# The `kind` of a metrics event: what the worker's loops write, and what GET /runs/{id}/metrics
# and `trainctl runs metrics` filter by.
METRIC_KINDS = ("train", "val", "warmup", "measure", "prepare", "eval")
METRIC_KINDS_TEXT = ", ".join(METRIC_KINDS) + "."
TERMINAL_STATES: frozenset[RunState] = frozenset({"succeeded", "failed", "cancelled"})
ACTIVE_STATES: frozenset[RunState] = frozenset({"queued", "running"})
SWEEP_NAME = "forks"
"""A sweep's name among the submit routes (`POST /runs/forks`: store.kinds.sweeps), and in its
request's digest (service.submit.request_digest), where a kind's name is."""
# A run's short id: the first this many characters of its id, what tables show; any prefix of
# an id at least this long names its run wherever the id does (store.db.runs.RunStore.resolve_id).
SHORT_ID_LENGTH = 8
SHORT_ID_TEXT = (
    f"The id's first {SHORT_ID_LENGTH} characters: what tables show, accepted wherever the id "
    "is (as is any longer prefix of it)."
)

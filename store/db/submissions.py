"""What enqueueing a run checks besides its row: the queue's limits, and an idempotency key's
replay or conflict (docs/design/runs.md, "Runs"; docs/design/access.md, "Admission and
access")."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Row, and_, func, select
from sqlalchemy.engine import Connection

from trainctl.store.db.fencing import fetch_one
from trainctl.store.db.records import Run, RunToQueue, plan_json, run_from_row
from trainctl.store.db.schema import (
    IDEMPOTENCY_SCOPE,
    runs,
)
from trainctl.store.db.tokens import same_name
from trainctl.store.exceptions import (
    Conflict,
    Forbidden,
    InvalidRequest,
    QueueFull,
)

QUEUE_RETRY_SECONDS = 30
"""What a client refused for a full queue is told to wait (Retry-After)."""


@dataclass(frozen=True)
class QueueLimits:
    """How many runs may wait at once: in all, and per token name (None: no limit)."""

    total: int | None = None
    per_submitter: int | None = None

    def check(self, conn: Connection, submitted_by: str | None) -> None:
        """Inside the enqueueing transaction, so that concurrent submits cannot all pass."""
        queued = runs.c.state == "queued"
        count = select(func.count()).select_from(runs)
        if self.total is not None and conn.execute(count.where(queued)).scalar_one() >= self.total:
            raise QueueFull(
                f"{self.total} runs are queued already, the most this service accepts; "
                f"retry in {QUEUE_RETRY_SECONDS} s or cancel queued runs"
            )
        mine = and_(queued, runs.c.submitted_by == submitted_by)
        limit = self.per_submitter
        if (
            limit is not None
            and submitted_by is not None
            and conn.execute(count.where(mine)).scalar_one() >= limit
        ):
            raise QueueFull(
                f"token {submitted_by!r} has {limit} runs queued, the most one token may; "
                f"retry in {QUEUE_RETRY_SECONDS} s or cancel some of them"
            )


def keyed_by(submitted_by: str | None, key: str) -> ColumnElement[bool]:
    """The run of `submitted_by` with idempotency key `key` (the index `uq_runs_idempotency`
    is on the same expression)."""
    return and_(IDEMPOTENCY_SCOPE == (submitted_by or "").lower(), runs.c.idempotency_key == key)


def check_owner(row: Row[Any], name: str) -> None:
    """A token that is no admin's cancels only the runs it submitted."""
    if row.submitted_by is None:
        raise Forbidden(
            f"run {row.id} was queued without a token (the service had none then); only an "
            f"admin token may cancel it, and token {name!r} is none"
        )
    if not same_name(row.submitted_by, name):
        raise Forbidden(
            f"run {row.id} was submitted by {row.submitted_by!r}; token {name!r} may cancel "
            "only the runs it submitted, and an admin token any run"
        )


def replay_rows(conn: Connection, existing: Row[Any], rows: list[dict[str, Any]]) -> list[Run]:
    """The runs an idempotent retry refers to, if the retry asks for the same thing:
    `existing` holds the key itself, the other runs of its request the keys derived from it."""
    values = rows[0]
    if existing.request_digest and values["request_digest"]:
        body: tuple[str, ...] = ("kind", "request_digest")
    else:
        body = ("kind", "experiment", "spec", "depends_on")
    if any(getattr(existing, name) != values[name] for name in body):
        raise key_reused(values["idempotency_key"], existing.id)
    others = [fetch_one(conn, keyed_by(v["submitted_by"], v["idempotency_key"])) for v in rows[1:]]
    if any(row is None for row in others):  # the same digest names the same number of runs
        raise key_reused(values["idempotency_key"], existing.id)
    return [run_from_row(row) for row in (existing, *others) if row is not None]


def member_keys(key: str | None, count: int) -> list[str | None]:
    """The idempotency keys of the `count` runs of one request: the first run holds the
    client's key, so that a single-run submit with the same key sees it taken; the others a
    key derived from it, with a line break no header value can hold, so no client's own key
    is ever one of them, and the sha256 keeps it within the column's 200 characters."""
    if key is None:
        return [None] * count
    digest = hashlib.sha256(key.encode()).hexdigest()
    return [key, *(f"member {i}\n{digest}" for i in range(1, count))]


def queued_values(
    run: RunToQueue,
    key: str | None,
    request_digest: str | None,
    submitted_by: str | None,
    dialect: str,
) -> dict[str, Any]:
    """The columns of one run to enqueue, refused with `ValueError` or `InvalidRequest` where
    the run cannot be queued at all."""
    if run.max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, got {run.max_attempts}")
    placement, parent = run.placement, run.parent
    if placement.is_gang and dialect == "sqlite":
        raise InvalidRequest(
            f"nnodes {placement.nnodes}: a run across several nodes needs PostgreSQL "
            "(TRAINCTL_DATABASE_URL) as the coordination point; this service keeps its "
            "runs in SQLite, which serves one node. Use nnodes 1 (nproc_per_node for "
            "this node's GPUs)"
        )
    return {
        "kind": run.kind,
        "experiment": run.experiment,
        "spec": plan_json(run.spec),
        "max_attempts": run.max_attempts,
        "idempotency_key": key,
        "depends_on": [[exp, tag] for exp, tag in run.depends_on],
        "request_digest": request_digest,
        "submitted_by": submitted_by,
        "priority": run.priority,
        "nnodes": placement.nnodes,
        "gpus_per_node": placement.gpus_per_node,
        "procs_per_node": placement.procs_per_node,
        "spread": placement.spread,
        "model_plugin": placement.model_plugin,
        "min_nnodes": placement.min_nnodes,
        "shrink_after_seconds": placement.shrink_after_seconds if placement.min_nnodes else None,
        "parent_run_id": parent.run_id if parent else None,
        "parent_experiment": parent.checkpoint.experiment if parent else None,
        "parent_tag": parent.checkpoint.tag if parent else None,
        "parent_step": parent.step if parent else None,
        "launch": run.launch,
    }


def key_reused(key: str, run_id: str) -> Conflict:
    return Conflict(
        f"idempotency key {key!r} was already used for a different request (run {run_id}); "
        "use a new key for a new run"
    )

"""A run and its events as the store hands them out, and how they are read from their rows
(docs/design/runs.md, "Runs"): the records `RunStore` returns and takes."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Row

from trainctl.store.db.placement import ONE_NODE, Placement
from trainctl.store.db.queue import (
    placement_of_row,
)
from trainctl.store.db.rows import RowReader, as_json, is_clean
from trainctl.store.exceptions import (
    InvalidRequest,
)
from trainctl.store.plans import ForkPoint
from trainctl.store.text import unencodable
from trainctl.store.vocabulary import (
    SHORT_ID_LENGTH,
)

Checkpoint = tuple[str, str]
"""A checkpoint a run depends on: (experiment, tag)."""


RUN_ID_PATTERN = re.compile(r"[0-9a-f]{32}")
"""The id `enqueue` gives a run: 32 lowercase hex digits (a uuid4)."""


def is_whole_run_id(text: str) -> bool:
    """Whether `text` has the shape of a whole run id, which no other run's id starts with:
    it names at most that run, with no need to look for others."""
    return RUN_ID_PATTERN.fullmatch(text) is not None


@dataclass(frozen=True)
class GangPlace:
    """A claimed gang run as one member sees it: its node rank and where the gang meets."""

    node_rank: int
    nnodes: int
    rendezvous: str
    """host:port of the torchrun c10d rendezvous, on the leader (node rank 0)."""
    resized_from: int | None = None
    """The leader's alone: the nodes the last attempt ran on, where this one has another
    number (an elastic gang that shrank or grew); its worker reports the resize."""


def leader_place(gang: Row[Any], size: int, rendezvous: str) -> GangPlace:
    """The leader's place in a gang just placed on `size` nodes, with the size the last
    attempt ran on where it differs: an elastic gang that shrank or grew (its worker reports
    the resize)."""
    before = gang.gang_nnodes
    return GangPlace(0, size, rendezvous, before if before not in (None, size) else None)


@dataclass(frozen=True)
class RunParent:
    """Where a fork started (docs/design/forks.md, "Forks"): the run that saved the checkpoint
    (None where its metadata names none), the checkpoint and its step."""

    run_id: str | None
    experiment: str
    tag: str
    step: int


@dataclass(frozen=True)
class Run:
    """One run as stored; `service.schemas.RunPublic` is the shape clients see."""

    id: str
    kind: str
    experiment: str
    state: str
    spec: dict[str, Any]
    progress: dict[str, int | None]
    result: dict[str, Any] | None
    error: str | None
    worker_id: str | None
    attempt: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    # Internals: the queue needs them, clients do not.
    max_attempts: int
    cancel_requested: bool
    lease_expires_at: datetime | None
    idempotency_key: str | None
    depends_on: list[Checkpoint]
    submitted_by: str | None = None
    """The name of the API token the run was submitted with, where tokens have names."""
    priority: int = 0
    placement: Placement = ONE_NODE
    queued_at: datetime | None = None
    gang_nnodes: int | None = None
    """The nodes a gang's current (or last) attempt was placed on; None before its first."""
    gang: GangPlace | None = None
    """Set on a claimed gang run (nnodes > 1): the claiming worker's place in it."""
    unreadable: str | None = None
    """What of the stored row could not be read as it was, and was replaced or repaired
    (store/db/rows.py); None for every row this trainctl wrote."""
    parent: RunParent | None = None
    """A fork's parent; None for a run that is no fork."""
    launch: dict[str, Any] | None = None
    """What the run asked of its launch backend ({"slurm": {...}}); None: nothing."""

    @property
    def short_id(self) -> str:
        """What people read and type: the id's first SHORT_ID_LENGTH characters."""
        return self.id[:SHORT_ID_LENGTH]


@dataclass(frozen=True)
class Event:
    """One entry of a run's event log; `id` increases across the whole log."""

    id: int
    run_id: str
    type: str
    data: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class RunToQueue:
    """One run for `RunStore.enqueue_all` to queue: what `enqueue` takes of each run."""

    kind: str
    experiment: str
    spec: dict[str, Any]
    max_attempts: int = 3
    depends_on: tuple[Checkpoint, ...] = ()
    priority: int = 0
    placement: Placement = ONE_NODE
    parent: ForkPoint | None = None
    """Where a fork starts, its lineage."""
    launch: dict[str, Any] | None = None
    """What the run asks of its launch backend (store/backends)."""


def utcnow() -> datetime:
    return datetime.now(UTC)


def plan_json(plan: dict[str, Any]) -> dict[str, Any]:
    """A plan as stored: refused, not repaired, when it holds text UTF-8 cannot encode,
    which no answer could show again (the request models refuse it first: store/text.py)."""
    problem = unencodable(plan)
    if problem is not None:
        raise InvalidRequest(f"the run's plan: {problem}")
    return as_json(plan)


def run_from_row(row: Row[Any]) -> Run:
    """The run of a row, every column read on its own terms (store/db/rows.py): a row that
    holds what cannot be shown is listed with that part replaced, never an error."""
    reader = RowReader(f"run {row.id}")
    return Run(
        id=row.id,
        kind=row.kind,
        experiment=reader.text("experiment", row.experiment) or "",
        state=row.state,
        # A plan is run as it was asked, or not at all: one that cannot be read is replaced
        # (the worker then fails the run, saying so), never repaired.
        spec=reader.json("spec", row.spec, repair=False),
        progress={"step": row.step, "total_steps": row.total_steps},
        result=None if row.result is None else reader.json("result", row.result),
        error=reader.text("error", row.error),
        worker_id=reader.text("worker_id", row.worker_id),
        attempt=row.attempt,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        max_attempts=row.max_attempts,
        cancel_requested=bool(row.cancel_requested),
        lease_expires_at=row.lease_expires_at,
        idempotency_key=reader.text("idempotency_key", row.idempotency_key),
        depends_on=dependencies(reader, row.depends_on),
        submitted_by=reader.text("submitted_by", row.submitted_by),
        priority=row.priority,
        placement=placement_of_row(row),
        queued_at=row.queued_at,
        gang_nnodes=row.gang_nnodes,
        parent=parent_of_row(reader, row),
        launch=None if row.launch is None else reader.json("launch", row.launch),
        unreadable=reader.note,  # last: every column above is read
    )


def parent_of_row(reader: RowReader, row: Row[Any]) -> RunParent | None:
    if row.parent_experiment is None or row.parent_tag is None or row.parent_step is None:
        return None
    return RunParent(
        run_id=reader.text("parent_run_id", row.parent_run_id),
        experiment=reader.text("parent_experiment", row.parent_experiment) or "",
        tag=reader.text("parent_tag", row.parent_tag) or "",
        step=row.parent_step,
    )


def checkpoint_pairs(value: Any) -> list[Checkpoint]:
    """The (experiment, tag) pairs of a stored `depends_on`; an entry of another shape names
    no checkpoint, so it protects none."""
    if not isinstance(value, list):
        return []
    return [
        (pair[0], pair[1])
        for pair in value
        if isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)
    ]


def dependencies(reader: RowReader, value: Any) -> list[Checkpoint]:
    pairs = checkpoint_pairs(value)
    if not isinstance(value, list) or len(pairs) != len(value):
        reader.problems.append("depends_on: what names no (experiment, tag) was left out")
    return pairs


def event_from_row(row: Row[Any]) -> Event:
    data = row.data
    if type(data) is not dict or not is_clean(data):  # the quick test first: pages are long
        data = RowReader(f"event {row.id}").json("data", data)
    return Event(row.id, row.run_id, row.type, data, row.created_at)

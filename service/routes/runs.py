"""Runs: submit, list, read, cancel, and follow their events, metrics and logs
(docs/design/runs.md, "Runs")."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Response, status
from fastapi.responses import PlainTextResponse, StreamingResponse
from pydantic import AfterValidator

from trainctl.service import history, sse
from trainctl.service.deps import (
    STORE_SLOT,
    CheckpointsDep,
    DatasetsDep,
    EventFeedDep,
    ExportsDep,
    RunId,
    RunsDep,
    SettingsDep,
    StreamToken,
    Submitter,
)
from trainctl.service.errors import error_responses
from trainctl.service.presenters import public_lineage, public_run, public_runs
from trainctl.service.routing import JSON_NUMBER_TEXT, ApiRoute
from trainctl.service.schemas import (
    ForkSweepPublic,
    LineagePublic,
    LogsPublic,
    MetricsPublic,
    RunPublic,
    RunsPublic,
)
from trainctl.service.settings import Settings
from trainctl.service.sinks.wandb import wandb_config
from trainctl.service.submit import submit_run, submit_sweep
from trainctl.store.db.lineage import read_lineage
from trainctl.store.db.records import Run
from trainctl.store.db.runs import RunStore
from trainctl.store.kinds.registry import RUN_KINDS, RunKindName
from trainctl.store.kinds.sweeps import ForkSweepRequest
from trainctl.store.specs import Request
from trainctl.store.vocabulary import METRIC_KINDS_TEXT, SWEEP_NAME, RunState

# Every route takes parameters (422) and reads or writes the run database (503 when it can't).
router = APIRouter(
    route_class=ApiRoute,
    prefix="/runs",
    tags=["runs"],
    responses=error_responses(422, 503),
)

IdempotencyKey = Annotated[
    str | None,
    Header(
        max_length=200,
        description="Retrying with the same key and body returns the first run, not a new one.",
    ),
]
# 409: the idempotency key was used for another request, the experiment already has an active
# train run, the checkpoint to read is damaged, the dataset name to prepare is taken, or the
# checkpoint is exported already.
ACCEPTED: dict[int | str, dict[str, Any]] = {
    202: {"description": "Queued. `Location` is the run's URL."},
    **error_responses(400, 403, 409, 413, 429),
}
# 404: no run has that id or prefix; 409: several runs' ids start with the prefix given.
RUN_NOT_FOUND = error_responses(404, 409)
# A page's next_cursor: unpadded URL-safe base64 of the last run's position. The pattern is
# checked here, in words like the store's rather than pydantic's; the format names the rule
# no pattern states: only what the server wrote is a cursor, any other is a 422 (the store's).
CURSOR_FORMAT = "trainctl-cursor"
CURSOR_PATTERN = r"^[A-Za-z0-9_-]+$"

# A chart is a few thousand pixels wide: a longer history is down-sampled for it, not shipped.
MAX_POINTS = Query(
    ge=2,
    le=1_000_000,
    description="At most this many rows (all of them when left out), for a chart of a long "
    "run: each kind gets an equal share (a kind with fewer rows keeps them all), keeps its "
    "first and last rows and, between them, the rows of the smallest and largest loss "
    "(val_loss for val rows) of evenly sized buckets.",
)


def _cursor_text(cursor: str | None) -> str | None:
    if cursor is not None and not re.fullmatch(CURSOR_PATTERN, cursor):
        raise ValueError(f"invalid cursor {cursor!r}: pass the next_cursor of a previous page")
    return cursor


Cursor = Annotated[
    str | None,
    Query(
        max_length=1000,
        description="The next_cursor of the previous page, unchanged; any other value is a 422.",
        json_schema_extra={"format": CURSOR_FORMAT, "pattern": CURSOR_PATTERN, "minLength": 1},
    ),
    AfterValidator(_cursor_text),
]


def _accepted(run: Run, response: Response, runs: RunStore, settings: Settings) -> RunPublic:
    response.headers["Location"] = f"/runs/{run.id}"
    return public_run(runs, settings.lease_seconds, run, wandb_config(settings))


def _submit_route(kind: str, body: type[Request], summary: str) -> None:
    """POST /runs/<kind>: resolve the request into a plan and queue it (service.submit).
    One definition for every kind; each keeps its own name, body schema and summary."""

    def create(
        request: Any,
        response: Response,
        settings: SettingsDep,
        runs: RunsDep,
        ckpts: CheckpointsDep,
        exports: ExportsDep,
        datasets: DatasetsDep,
        submitter: Submitter,
        idempotency_key: IdempotencyKey = None,
    ) -> RunPublic:
        run = submit_run(kind, request, settings=settings, runs=runs, ckpts=ckpts,
                         exports=exports, datasets=datasets, submitter=submitter,
                         idempotency_key=idempotency_key)  # fmt: skip
        return _accepted(run, response, runs, settings)

    create.__annotations__["request"] = body  # the body schema FastAPI reads and publishes
    create.__name__ = create.__qualname__ = f"create_{kind}_run"  # the operation id's stem
    create.__doc__ = summary
    # A slot of the store's (service/limits.py): submit reads the checkpoint, export and
    # dataset stores, and a frozen bucket must hold up a few submits, never every thread.
    router.post(f"/{kind}", status_code=status.HTTP_202_ACCEPTED, response_model=RunPublic,
                responses=ACCEPTED, dependencies=[STORE_SLOT])(create)  # fmt: skip


for _kind in RUN_KINDS:
    _submit_route(_kind.name, _kind.request, _kind.summary)


@router.post(
    f"/{SWEEP_NAME}",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=ForkSweepPublic,
    responses={**ACCEPTED, 202: {"description": "Queued: a run per variant, in their order."}},
    dependencies=[STORE_SLOT],
)
def create_fork_sweep(
    sweep: ForkSweepRequest,
    settings: SettingsDep,
    runs: RunsDep,
    ckpts: CheckpointsDep,
    exports: ExportsDep,
    datasets: DatasetsDep,
    submitter: Submitter,
    idempotency_key: IdempotencyKey = None,
) -> ForkSweepPublic:
    """Queue several forks of one checkpoint (a sweep): all of them, or none."""
    queued = submit_sweep(sweep, settings=settings, runs=runs, ckpts=ckpts, exports=exports,
                          datasets=datasets,
                          submitter=submitter, idempotency_key=idempotency_key)  # fmt: skip
    return ForkSweepPublic(
        items=public_runs(runs, settings.lease_seconds, queued, wandb_config(settings))
    )


@router.get("", response_model=RunsPublic)
def list_runs(
    runs: RunsDep,
    settings: SettingsDep,
    kind: RunKindName | None = None,
    state: RunState | None = None,
    experiment: Annotated[str | None, Query(max_length=200)] = None,
    submitted_by: Annotated[
        str | None, Query(max_length=128, description="Runs of this API token (its name).")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500), JSON_NUMBER_TEXT] = 50,
    cursor: Cursor = None,
) -> RunsPublic:
    """List runs, newest first, a page at a time."""
    page, next_cursor = runs.list_runs(
        kind=kind,
        state=state,
        experiment=experiment,
        submitted_by=submitted_by,
        limit=limit,
        cursor=cursor,
    )
    return RunsPublic(
        items=public_runs(runs, settings.lease_seconds, page, wandb_config(settings)),
        next_cursor=next_cursor,
    )


# A plain `def`, in the thread pool, as every route that queries the database: on the event
# loop a query that waits (a PostgreSQL across the network, a SQLite lock) holds up all.
@router.get("/{run_id}", response_model=RunPublic, responses=RUN_NOT_FOUND)
def read_run(run_id: RunId, runs: RunsDep, settings: SettingsDep) -> RunPublic:
    """Read one run; a queued one says why it waits, if no live worker could take it."""
    return public_run(runs, settings.lease_seconds, runs.get(run_id), wandb_config(settings))


@router.get("/{run_id}/lineage", response_model=LineagePublic, responses=RUN_NOT_FOUND)
def read_run_lineage(run_id: RunId, runs: RunsDep) -> LineagePublic:
    """Read a run's lineage: the forks it descends from and the forks of its checkpoints."""
    return public_lineage(read_lineage(runs, run_id))


@router.post("/{run_id}/cancel", response_model=RunPublic, responses=error_responses(403, 404, 409))
def cancel_run(
    run_id: RunId, runs: RunsDep, settings: SettingsDep, submitter: Submitter
) -> RunPublic:
    """Cancel a queued run now, or ask a running one to stop at the next step.

    A submit token cancels only the runs it submitted (another's is a 403), an admin token
    any run."""
    only_of = submitter.name if submitter and not submitter.allows("admin") else None
    return public_run(
        runs, settings.lease_seconds, runs.request_cancel(run_id, only_of), wandb_config(settings)
    )


@router.get(
    "/{run_id}/events",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "Server-sent events; each `data` is an EventPublic. A final "
            "`event: end` frame (its `data` a StreamEndPublic) follows the last event of a "
            "finished run. A stream whose token is revoked ends without it.",
            "content": {sse.MEDIA_TYPE: {"schema": sse.FRAME_SCHEMA}},
        },
        **RUN_NOT_FOUND,
        **error_responses(429),
    },
)
def stream_run_events(
    run_id: RunId,
    runs: RunsDep,
    feed: EventFeedDep,
    settings: SettingsDep,
    token: StreamToken,
    last_event_id: Annotated[
        int | None,
        Header(ge=0, le=sse.MAX_EVENT_ID, description="Resume after this event id."),
        JSON_NUMBER_TEXT,
    ] = None,
    after: Annotated[
        int | None,
        Query(ge=0, le=sse.MAX_EVENT_ID, description="Like Last-Event-ID."),
        JSON_NUMBER_TEXT,
    ] = None,
) -> StreamingResponse:
    """Stream a run's events (SSE), resumable with Last-Event-ID, until the run finishes."""
    runs.get(run_id)  # an unknown run is a 404 before the stream starts
    start = last_event_id if last_event_id is not None else after or 0
    return StreamingResponse(
        sse.stream_events(
            feed, run_id, start, token, keepalive_seconds=settings.event_stream_keepalive_seconds
        ),
        media_type=sse.MEDIA_TYPE,
        headers=sse.HEADERS,
    )


@router.get(
    "/{run_id}/metrics",
    response_model=MetricsPublic,
    responses={200: {"content": {"text/csv": {}}}, **RUN_NOT_FOUND},
)
def read_run_metrics(
    run_id: RunId,
    runs: RunsDep,
    kind: Annotated[str | None, Query(description=METRIC_KINDS_TEXT)] = None,
    format: Literal["json", "csv"] = "json",
    max_points: Annotated[int | None, MAX_POINTS, JSON_NUMBER_TEXT] = None,
) -> Any:
    """Read a run's metrics history (JSON, or CSV with ?format=csv)."""
    rows = history.metric_rows(runs, run_id, kind)
    if max_points is not None:
        rows = history.downsample(rows, max_points)
    if format == "csv":
        return PlainTextResponse(history.metrics_csv(rows), media_type="text/csv")
    return {"items": rows}


@router.get(
    "/{run_id}/logs",
    response_model=LogsPublic,
    responses={200: {"content": {"text/plain": {}}}, **RUN_NOT_FOUND},
)
def read_run_logs(run_id: RunId, runs: RunsDep, format: Literal["json", "text"] = "json") -> Any:
    """Read a run's log lines (JSON, or plain text with ?format=text)."""
    entries = history.log_entries(runs, run_id)
    if format == "text":
        return PlainTextResponse(history.logs_text(entries))
    return {"items": entries}

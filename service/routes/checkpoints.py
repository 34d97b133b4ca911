"""Checkpoints: list, find latest/best, read, download (file or tar), delete, prune
(docs/design/checkpoints.md, "Checkpoint store", "Protection")."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Response

from trainctl.service import files
from trainctl.service.deps import STORE_SLOT, CheckpointsDep, ProtectionDep, SettingsDep, requires
from trainctl.service.errors import error_responses
from trainctl.service.routing import ApiRoute, name_in_path
from trainctl.service.schemas import CheckpointPublic, CheckpointsPublic, PruneRequest, PruneResult
from trainctl.store.names import MAX_NAME_LENGTH, NAME_PATTERN, NAME_RULE

# Every route reads the store in a worker thread, never on the event loop (a file that never
# answers, a FIFO, would hold up every request), and holds one of its slots (503 when none
# frees up: a file that never answers holds one thread, never the whole pool).
router = APIRouter(
    route_class=ApiRoute,
    prefix="/checkpoints",
    tags=["checkpoints"],
    dependencies=[STORE_SLOT],
    responses=error_responses(422, 503),  # 422: names that are not safe names
)
NOT_FOUND = error_responses(404)

# Every name in a path or a query is checked against the store's rule (store.names), which the
# schema publishes: a client can check a name before it sends it.
ExperimentFilter = Annotated[
    str | None,
    Query(
        pattern=NAME_PATTERN,
        max_length=MAX_NAME_LENGTH,
        description=f"Only this experiment; default: all. A name of {NAME_RULE}.",
    ),
]


Experiment = Annotated[str, name_in_path("The experiment")]
Tag = Annotated[str, name_in_path("The checkpoint's tag (step_200, best)")]
FileName = Annotated[str, name_in_path("A file of the checkpoint (model.safetensors)")]


@router.get("", response_model=CheckpointsPublic)
def list_checkpoints(
    ckpts: CheckpointsDep, experiment: ExperimentFilter = None
) -> CheckpointsPublic:
    """List complete checkpoints, by experiment and step."""
    items = [CheckpointPublic.model_validate(i) for i in ckpts.list_checkpoints(experiment)]
    return CheckpointsPublic(items=items)


@router.get("/latest", response_model=CheckpointPublic, responses=NOT_FOUND)
def read_latest_checkpoint(
    ckpts: CheckpointsDep, experiment: ExperimentFilter = None
) -> CheckpointPublic:
    """Read the highest step of an experiment, or the newest checkpoint of all."""
    return CheckpointPublic.model_validate(ckpts.latest(experiment))


@router.get("/best", response_model=CheckpointPublic, responses=NOT_FOUND)
def read_best_checkpoint(
    ckpts: CheckpointsDep, experiment: ExperimentFilter = None
) -> CheckpointPublic:
    """Read the 'best' checkpoint of an experiment, or the lowest-loss one of all."""
    return CheckpointPublic.model_validate(ckpts.best(experiment))


@router.post(
    "/prune",
    response_model=PruneResult,
    responses=error_responses(400, 403, 404, 409, 413, 503),
    dependencies=[requires("admin")],
)
def prune_checkpoints(body: PruneRequest, policy: ProtectionDep) -> PruneResult:
    """Delete old step checkpoints; never the latest, best or ones runs need."""
    outcome = policy.prune(
        body.experiment, keep_last=body.keep_last, keep_best=body.keep_best, dry_run=body.dry_run
    )
    return PruneResult.model_validate(outcome)


@router.get("/{experiment}/{tag}", response_model=CheckpointPublic, responses=NOT_FOUND)
def read_checkpoint(experiment: Experiment, tag: Tag, ckpts: CheckpointsDep) -> CheckpointPublic:
    """Read one checkpoint: metadata and its files' sizes and sha256."""
    return CheckpointPublic.model_validate(ckpts.get(experiment, tag))


@router.get(
    "/{experiment}/{tag}/files/{name:path}",
    response_class=Response,
    responses={**files.FILE_RESPONSES, **NOT_FOUND},
)
def download_checkpoint_file(
    experiment: Experiment,
    tag: Tag,
    name: FileName,
    ckpts: CheckpointsDep,
    settings: SettingsDep,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """Download one file of a checkpoint (Range requests; ETag = sha256), or a redirect to it."""
    return files.checkpoint_file_response(
        ckpts, experiment, tag, name, if_none_match, settings.redirect_seconds
    )


@router.get(
    "/{experiment}/{tag}/archive",
    response_class=Response,
    responses={**files.ARCHIVE_RESPONSES, **NOT_FOUND},
)
def download_checkpoint_archive(
    experiment: Experiment, tag: Tag, ckpts: CheckpointsDep
) -> Response:
    """Download a whole checkpoint as a streamed tar."""
    return files.checkpoint_archive_response(ckpts, experiment, tag)


@router.delete(
    "/{experiment}/{tag}",
    response_model=CheckpointPublic,
    responses=error_responses(403, 404, 409, 503),
    dependencies=[requires("admin")],
)
def delete_checkpoint(experiment: Experiment, tag: Tag, policy: ProtectionDep) -> CheckpointPublic:
    """Delete a checkpoint unless a queued or running run needs it."""
    return CheckpointPublic.model_validate(policy.delete(experiment, tag))

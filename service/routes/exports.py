"""Exports: checkpoints written in another framework's format by export runs (POST
/runs/export), listed, read, downloaded and deleted like checkpoints.

An export folder is laid out as a checkpoint is (a manifest of sizes and sha256, written last;
a metadata.json), in a store of its own under the data dir, so the checkpoint store's checks
and the same file, Range and archive responses serve it (docs/design/models.md, "Model output:
samples, sample runs, exports", "Exports").
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Response

from trainctl.service import files
from trainctl.service.deps import STORE_SLOT, ExportsDep, SettingsDep, requires
from trainctl.service.errors import error_responses
from trainctl.service.routes.checkpoints import ExperimentFilter
from trainctl.service.routing import ApiRoute, name_in_path
from trainctl.service.schemas import CheckpointPublic, CheckpointsPublic

# In worker threads, each holding a slot of the stores' (see routes/checkpoints.py).
router = APIRouter(
    route_class=ApiRoute,
    prefix="/exports",
    tags=["exports"],
    dependencies=[STORE_SLOT],
    responses=error_responses(422, 503),  # 422: names that are not safe names
)
NOT_FOUND = error_responses(404)

Experiment = Annotated[str, name_in_path("The experiment of the exported checkpoint")]
Tag = Annotated[str, name_in_path("The exported checkpoint's tag (step_200, best)")]
FileName = Annotated[str, name_in_path("A file of the export (model.safetensors)")]


@router.get("", response_model=CheckpointsPublic)
def list_exports(exports: ExportsDep, experiment: ExperimentFilter = None) -> CheckpointsPublic:
    """List complete exports, by experiment and tag of the checkpoint they were made from."""
    items = [CheckpointPublic.model_validate(i) for i in exports.list_checkpoints(experiment)]
    return CheckpointsPublic(items=items)


@router.get("/{experiment}/{tag}", response_model=CheckpointPublic, responses=NOT_FOUND)
def read_export(experiment: Experiment, tag: Tag, exports: ExportsDep) -> CheckpointPublic:
    """Read one export: the checkpoint's training facts and the files' sizes and sha256."""
    return CheckpointPublic.model_validate(exports.get(experiment, tag))


@router.get(
    "/{experiment}/{tag}/files/{name:path}",
    response_class=Response,
    responses={**files.FILE_RESPONSES, **NOT_FOUND},
)
def download_export_file(
    experiment: Experiment,
    tag: Tag,
    name: FileName,
    exports: ExportsDep,
    settings: SettingsDep,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """Download one file of an export (Range requests; ETag = sha256), or a redirect to it."""
    return files.checkpoint_file_response(
        exports, experiment, tag, name, if_none_match, settings.redirect_seconds
    )


@router.get(
    "/{experiment}/{tag}/archive",
    response_class=Response,
    responses={**files.ARCHIVE_RESPONSES, **NOT_FOUND},
)
def download_export_archive(experiment: Experiment, tag: Tag, exports: ExportsDep) -> Response:
    """Download a whole export as a streamed tar."""
    return files.checkpoint_archive_response(exports, experiment, tag)


@router.delete(
    "/{experiment}/{tag}",
    response_model=CheckpointPublic,
    responses=error_responses(403, 404, 503),
    dependencies=[requires("admin")],
)
def delete_export(experiment: Experiment, tag: Tag, exports: ExportsDep) -> CheckpointPublic:
    """Delete an export (its checkpoint stays); the checkpoint can then be exported again."""
    return CheckpointPublic.model_validate(exports.delete(experiment, tag))

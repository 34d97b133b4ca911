"""Submitting runs: resolve the spec (every default filled in), check it, enqueue it.

Everything a run needs is decided here, at submit time, so that a bad request is a 422 now
rather than a failed run later: the device, the model config, the batch geometry, the data
files, and the concrete checkpoint a resume or a validation reads.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pydantic import BaseModel

from service.devices import cuda_available
from service.settings import Settings
from store.checkpoints import METADATA_FILE, CheckpointInfo, CheckpointStore
from store.exceptions import CheckpointCorrupt, CheckpointNotFound, InvalidRequest
from store.presets import ModelConfig
from store.runs import Run, RunStore
from store.specs import (
    BenchmarkSpec,
    TrainSpec,
    ValidateSpec,
    resolve_benchmark,
    resolve_train,
    resolve_validate,
)

BENCHMARK_EXPERIMENT = "benchmark"
"""Benchmarks write no checkpoints; their runs are filed under this experiment name."""


def request_digest(kind: str, spec: BaseModel) -> str:
    """What the client asked for, before any default is filled in."""
    body = json.dumps([kind, spec.model_dump(mode="json", exclude_unset=True)], sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()


def replayed(runs: RunStore, kind: str, spec: BaseModel, key: str | None) -> Run | None:
    """An idempotent retry gets the run it created, even if resolving now would differ."""
    return runs.replay(key, kind, request_digest(kind, spec)) if key else None


def submit_train(
    spec: TrainSpec,
    *,
    settings: Settings,
    runs: RunStore,
    ckpts: CheckpointStore,
    idempotency_key: str | None = None,
) -> Run:
    if existing := replayed(runs, "train", spec, idempotency_key):
        return existing
    resolved = resolve_train(
        spec,
        cuda_available=cuda_available(runs, settings.lease_seconds),
        data_roots=settings.data_roots,
    )
    if resolved.resume_from is None:
        return _enqueue(runs, settings, "train", spec, resolved, [], idempotency_key)
    start = _resume_point(ckpts, resolved)
    resolved = resolved.model_copy(update={"resume_from": start.tag})
    with _still_there(ckpts, start):
        return _enqueue(runs, settings, "train", spec, resolved, [(start.experiment, start.tag)],
                        idempotency_key)  # fmt: skip


def submit_validate(
    spec: ValidateSpec,
    *,
    settings: Settings,
    runs: RunStore,
    ckpts: CheckpointStore,
    idempotency_key: str | None = None,
) -> Run:
    if existing := replayed(runs, "validate", spec, idempotency_key):
        return existing
    info = _validation_checkpoint(ckpts, spec)
    resolved = resolve_validate(
        spec,
        cuda_available=cuda_available(runs, settings.lease_seconds),
        data_roots=settings.data_roots,
        max_seq_len=_checkpoint_model(info).max_seq_len,
    ).model_copy(
        update={"checkpoint": f"{info.experiment}/{info.tag}", "experiment": info.experiment}
    )
    with _still_there(ckpts, info):
        return _enqueue(runs, settings, "validate", spec, resolved,
                        [(info.experiment, info.tag)], idempotency_key)  # fmt: skip


@contextmanager
def _still_there(ckpts: CheckpointStore, info: CheckpointInfo) -> Iterator[None]:
    """Enqueue a run that depends on `info` inside the experiment's guard, once it is checked
    to be still there: a delete or retention either ran before (the run is refused with a
    404) or runs after and sees the run's dependency, never between the two."""
    with ckpts.guard(info.experiment):
        ckpts.get(info.experiment, info.tag)
        yield


def submit_benchmark(
    spec: BenchmarkSpec,
    *,
    settings: Settings,
    runs: RunStore,
    idempotency_key: str | None = None,
) -> Run:
    if existing := replayed(runs, "benchmark", spec, idempotency_key):
        return existing
    resolved = resolve_benchmark(spec, cuda_available=cuda_available(runs, settings.lease_seconds))
    return _enqueue(runs, settings, "benchmark", spec, resolved, [], idempotency_key)


def _enqueue(
    runs: RunStore,
    settings: Settings,
    kind: str,
    request: BaseModel,
    resolved: BaseModel,
    depends_on: list[tuple[str, str]],
    idempotency_key: str | None,
) -> Run:
    # Train runs are filed under their experiment, validations under the checkpoint's.
    experiment = getattr(resolved, "experiment", None) or BENCHMARK_EXPERIMENT
    return runs.enqueue(
        kind,
        experiment,
        resolved.model_dump(mode="json"),
        idempotency_key=idempotency_key,
        max_attempts=settings.max_attempts,
        depends_on=depends_on,
        request_digest=request_digest(kind, request) if idempotency_key else None,
    )


def _resume_point(ckpts: CheckpointStore, spec: TrainSpec) -> CheckpointInfo:
    """The concrete checkpoint `resume_from` names, checked to fit the model being trained."""
    assert spec.resume_from is not None and spec.model_config_resolved is not None
    try:
        info = ckpts.resolve(spec.experiment, spec.resume_from)
    except CheckpointNotFound:
        raise InvalidRequest(
            f"resume_from: experiment {spec.experiment!r} has no checkpoint "
            f"{spec.resume_from!r} to resume from; train without resume_from, or name one of "
            "its checkpoints (GET /checkpoints?experiment=...)"
        ) from None
    differing = _checkpoint_model(info).differences(
        ModelConfig.from_dict(spec.model_config_resolved)
    )
    if differing:
        details = ", ".join(
            f"{k}: checkpoint {a!r} vs requested {b!r}" for k, (a, b) in differing.items()
        )
        raise InvalidRequest(
            f"resume_from: checkpoint {info.tag!r} of experiment {info.experiment!r} was saved "
            f"by a different model ({details}); request the same model preset and overrides"
        )
    return info


def _validation_checkpoint(ckpts: CheckpointStore, spec: ValidateSpec) -> CheckpointInfo:
    """'latest', 'best' (optionally within `experiment`) or 'exp/tag' → one checkpoint now."""
    try:
        if spec.checkpoint == "latest":
            return ckpts.latest(spec.experiment)
        if spec.checkpoint == "best":
            return ckpts.best(spec.experiment)
        experiment, tag = spec.checkpoint.split("/")
        return ckpts.get(experiment, tag)
    except CheckpointNotFound as exc:
        raise InvalidRequest(f"checkpoint: {exc}; nothing to validate") from None


def _read_metadata(info: CheckpointInfo) -> dict[str, Any]:
    # The store read this file already to list the checkpoint, so it parses; it has no
    # public reader for the rest of it (model_config), hence this one.
    try:
        meta = json.loads((info.path / METADATA_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointCorrupt(
            f"checkpoint {info.experiment}/{info.tag}: cannot read {METADATA_FILE}: {exc}"
        ) from None
    return meta if isinstance(meta, dict) else {}


def _checkpoint_model(info: CheckpointInfo) -> ModelConfig:
    """The model config a checkpoint was saved with (its metadata.json)."""
    config = _read_metadata(info).get("model_config")
    if not isinstance(config, dict):
        raise InvalidRequest(
            f"checkpoint {info.experiment}/{info.tag} records no model_config in its metadata, "
            "so the model it holds is unknown"
        )
    try:
        return ModelConfig.from_dict(config)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(
            f"checkpoint {info.experiment}/{info.tag} has an unreadable model_config: {exc}"
        ) from None

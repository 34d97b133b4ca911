"""Where a train run starts: the checkpoint of its own experiment it resumes (`resume_from`)
or the checkpoint of another it forks from (`fork_from`; docs/design/forks.md, "Forks"),
pinned at submit and checked to be one the run can continue. A train request and a sweep of
forks (`store.kinds.sweeps`) name a fork's checkpoint alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainctl.store.checkpoints.info import TokenizerId, check_fits, check_same_tokenizer
from trainctl.store.exceptions import CheckpointNotFound, InvalidRequest
from trainctl.store.models.hf_config import AnyModelConfig
from trainctl.store.names import (
    EXPERIMENT_RULE,
    MAX_NAME_LENGTH,
    NAME_REGEX,
    NAME_RULE,
    is_valid_experiment,
    is_valid_name,
)
from trainctl.store.plans import CheckpointRef, ForkPoint

if TYPE_CHECKING:
    from trainctl.store.checkpoints.store import CheckpointStore
    from trainctl.store.kinds.train import TrainRequest


# A fork's starting point: another experiment's tag, or its latest step.
FORK_REF_PATTERN = f"^{NAME_REGEX}/{NAME_REGEX}$"


def check_fork_ref(field: str, ref: str) -> str:
    """A fork's starting point, `field`'s value: '<experiment>/<tag>' (ValueError otherwise)."""
    parts = ref.split("/")
    if not (len(parts) == 2 and is_valid_experiment(parts[0]) and is_valid_name(parts[1])):
        raise ValueError(
            f"{field} must be '<experiment>/<tag>': the experiment {EXPERIMENT_RULE}, "
            f"the tag {NAME_RULE} (or 'latest')"
        )
    return ref


def resume_point(
    request: TrainRequest,
    config: AnyModelConfig,
    checkpoints: CheckpointStore | None,
    tokenizer: TokenizerId | None,
) -> CheckpointRef | None:
    """The concrete checkpoint `resume_from` names, checked to fit the model being trained."""
    if request.resume_from is None:
        return None
    if checkpoints is None:
        raise InvalidRequest("resume_from: no checkpoint store to resume from")
    try:
        info = checkpoints.resolve(request.experiment, request.resume_from)
    except CheckpointNotFound:
        raise InvalidRequest(
            f"resume_from: experiment {request.experiment!r} has no checkpoint "
            f"{request.resume_from!r} to resume from; train without resume_from, or name one of "
            "its checkpoints (GET /checkpoints?experiment=...)"
        ) from None
    source = f"resume_from: checkpoint {info.tag!r} of experiment {info.experiment!r}"
    advice = "; request the same model preset and overrides"
    check_fits(info.require_model_config(), config, source, advice)
    check_same_tokenizer(info, tokenizer, "training data")
    return CheckpointRef(experiment=info.experiment, tag=info.tag)


def fork_point(
    request: TrainRequest,
    config: AnyModelConfig,
    checkpoints: CheckpointStore | None,
    tokenizer: TokenizerId | None,
) -> ForkPoint | None:
    """The checkpoint `fork_from` names, pinned, and checked to be one the fork can continue
    (docs/design/forks.md, "Forks"): the model, the tokenizer and the optimizer kind are the
    parent's, and the fork's schedule fits after its step. A fork's own `schedule` is checked
    by `ScheduleSpec.phases` for every train run."""
    phases = request.schedule.phases(request.steps)
    if request.fork_from is None:
        return None
    if checkpoints is None:
        raise InvalidRequest("fork_from: no checkpoint store to fork from")
    experiment, ref = request.fork_from.split("/")
    if experiment == request.experiment:
        raise InvalidRequest(
            f"experiment: a fork of {request.fork_from!r} goes into an experiment of its own, "
            f"not its parent's {experiment!r} (their step checkpoints would collide); name "
            "another experiment, e.g. "
            f"{(experiment + '.fork')[:MAX_NAME_LENGTH]!r}"
        )
    try:
        info = checkpoints.resolve(experiment, ref)
    except CheckpointNotFound:
        raise InvalidRequest(
            f"fork_from: experiment {experiment!r} has no checkpoint {ref!r} to fork from; "
            "name one of its checkpoints (GET /checkpoints?experiment=...)"
        ) from None
    source = f"fork_from: checkpoint {info.experiment}/{info.tag}"
    if info.step is None:
        raise InvalidRequest(f"{source} records no step, so there is no point to fork at")
    check_fits(
        info.require_model_config(), config, source, "; a fork keeps its parent's model: "
        "request the same model preset and overrides",
    )  # fmt: skip
    check_same_tokenizer(info, tokenizer, "fork's training data")
    if info.optimizer_kind is not None and info.optimizer_kind != request.optimizer.kind:
        raise InvalidRequest(
            f"optimizer.kind: {source} holds the state of optimizer kind "
            f"{info.optimizer_kind!r}, not {request.optimizer.kind!r}; a fork keeps its "
            "parent's optimizers"
        )
    if request.steps <= info.step:
        raise InvalidRequest(
            f"steps: {source} is at step {info.step}; a fork trains on to a later step, so "
            f"steps must be above {info.step}"
        )
    if "schedule" in request.model_fields_set and phases.decay_start < info.step:
        raise InvalidRequest(
            f"schedule.decay_start: the fork's decay would start at step {phases.decay_start}, "
            f"before the fork's first step {info.step}; start it at {info.step} or later"
        )
    return ForkPoint(
        checkpoint=CheckpointRef(experiment=info.experiment, tag=info.tag),
        step=info.step,
        run_id=info.run_id,
    )

"""Deleting and pruning checkpoints without pulling one from under a run.

Protected: every checkpoint a queued or running run depends on (a resume point, a checkpoint
being validated), and the latest step of an experiment with an active train run: if its
worker dies, the requeued run resumes from there.
"""

from __future__ import annotations

from typing import Any

from store.checkpoints import CheckpointInfo, CheckpointStore
from store.exceptions import CheckpointProtected
from store.runs import RunStore


def protected_checkpoints(
    runs: RunStore, ckpts: CheckpointStore, experiment: str
) -> set[tuple[str, str]]:
    protected = runs.protected_checkpoints()
    if runs.active_train_run(experiment) is not None:
        latest = ckpts.latest_or_none(experiment)
        if latest is not None:
            protected.add((experiment, latest.tag))
    return protected


def delete_checkpoint(
    runs: RunStore, ckpts: CheckpointStore, experiment: str, tag: str
) -> CheckpointInfo:
    ckpts.get(experiment, tag)  # a missing checkpoint is a 404 before anything else
    with ckpts.guard(experiment):  # no train run is queued between this check and the delete
        active = runs.active_train_run(experiment)
        latest = ckpts.latest_or_none(experiment) if active is not None else None
        if active is not None and latest is not None and latest.tag == tag:
            raise CheckpointProtected(
                f"checkpoint {tag!r} is the latest of experiment {experiment!r}, whose train "
                f"run {active.id} is {active.state}: it resumes from here if its worker "
                "stops; cancel the run or wait for it to finish, then delete it"
            )
        return ckpts.delete(experiment, tag, protected=runs.protected_checkpoints)


def prune_checkpoints(
    runs: RunStore,
    ckpts: CheckpointStore,
    experiment: str,
    *,
    keep_last: int,
    keep_best: bool,
    dry_run: bool,
) -> dict[str, Any]:
    outcome = ckpts.prune(
        experiment,
        keep_last=keep_last,
        keep_best=keep_best,
        dry_run=dry_run,
        protected=lambda: protected_checkpoints(runs, ckpts, experiment),
    )
    return {
        "deleted": [i.to_public() for i in outcome["deleted"]],
        "kept": [i.to_public() for i in outcome["kept"]],
        "dry_run": dry_run,
    }

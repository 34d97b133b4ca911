"""Which checkpoints must not be deleted now (docs/design/checkpoints.md, "Protection").

One policy, asked by everything that deletes a checkpoint (a user's delete, prune, the
retention after a save, the worker's own retention) and by everything that starts to depend on
one (enqueueing a resume or a validation). Protected, with the reason a refused delete gives:

- every checkpoint a queued or running run depends on (its pinned resume point, the
  checkpoint it validates);
- while an experiment has an active train run: the experiment's latest step, and the run's
  own latest step (where its requeued attempt resumes if its worker dies; not the same when
  the run resumed from an older tag).

The experiment's guard (`CheckpointStore.guard`, an flock shared by every process and node on
the store) makes "a run starts to depend on a checkpoint" and "a checkpoint is deleted" take
turns, and the deleting side asks the policy under the guard: a run queued a moment earlier is
seen, one queued a moment later finds the checkpoint gone and is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from trainctl.store.checkpoints.info import CheckpointInfo, PruneOutcome
from trainctl.store.checkpoints.store import IN_USE, CheckpointStore
from trainctl.store.db.records import Checkpoint
from trainctl.store.db.runs import RunStore


class ProtectionPolicy:
    """`runs` None: no run can depend on anything (a script training without a service)."""

    def __init__(self, runs: RunStore | None, checkpoints: CheckpointStore) -> None:
        self.runs, self.checkpoints = runs, checkpoints

    def protected(self, experiment: str) -> dict[Checkpoint, str]:
        """What must stay now, and why; ask it under the experiment's guard."""
        if self.runs is None:
            return {}
        found = dict.fromkeys(self.runs.protected_checkpoints(), IN_USE)
        active = self.runs.active_train_run(experiment)
        if active is None:
            return found
        resumes = "it resumes from here if its worker stops"
        latest = self.checkpoints.latest_or_none(experiment)
        if latest is not None:
            found.setdefault(
                (experiment, latest.tag),
                f"the latest of experiment {experiment!r}, whose train run {active.id} is "
                f"{active.state}: {resumes}",
            )
        own = self.checkpoints.latest_of_run(experiment, active.id)
        if own is not None:
            found.setdefault(
                (experiment, own.tag),
                f"the latest that train run {active.id} ({active.state}) saved: {resumes}",
            )
        return found

    def asker(self, experiment: str) -> Callable[[], dict[Checkpoint, str]]:
        """`protected` for one experiment, to be asked later (under the guard)."""
        return lambda: self.protected(experiment)

    def delete(self, experiment: str, tag: str) -> CheckpointInfo:
        return self.checkpoints.delete(experiment, tag, protected=self.asker(experiment))

    def prune(
        self, experiment: str, *, keep_last: int, keep_best: bool, dry_run: bool
    ) -> PruneOutcome:
        return self.checkpoints.prune(
            experiment,
            keep_last=keep_last,
            keep_best=keep_best,
            dry_run=dry_run,
            protected=self.asker(experiment),
        )

    def retain(self, experiment: str, max_keep: int) -> list[CheckpointInfo]:
        return self.checkpoints.retain(experiment, max_keep, protected=self.asker(experiment))

    @contextmanager
    def pinned(self, experiment: str, tag: str) -> Iterator[CheckpointInfo]:
        """Hold the guard while a run that depends on this checkpoint is enqueued, once it is
        checked to be still there: a delete either ran before (CheckpointNotFound) or runs
        after and sees the run's dependency, never between the two."""
        with self.checkpoints.guard(experiment):
            yield self.checkpoints.get(experiment, tag)

"""A train run's evaluations: an evaluate run queued for each checkpoint its plan's `evals`
asks for, as the checkpoint commits (docs/evals.md, "Evaluations during training";
docs/design/evals.md, "Evaluations during training").

`CheckpointEvals` is the trainer's `after_commit`: the checkpoint writer calls it once the
checkpoint is committed and before its retention, in the thread that wrote it (the training
thread, or the background writer of an asynchronous save). So the evaluate run depends on the
checkpoint before the retention of this save or of any later one can consider deleting it, and
in between the checkpoint is the latest of an experiment whose train run is active, which
nothing deletes. Training waits for one resolution (the checkpoint's metadata and tokenizer,
read as a POST /runs/evaluate reads them) and one transaction, never for the evaluation.
"""

from __future__ import annotations

from trainctl.store.checkpoints.factory import Stores
from trainctl.store.db.records import Run
from trainctl.store.db.submissions import QueueLimits
from trainctl.store.evals.side_runs import queue_checkpoint_eval
from trainctl.store.exceptions import QueueFull, TrainctlError
from trainctl.store.kinds.train import TrainPlan
from trainctl.store.names import parse_step
from trainctl.store.worker_settings import WorkerSettings
from trainctl.worker.context import RunContext


def side_run_limits(settings: WorkerSettings) -> QueueLimits:
    """The queue's limits as the service keeps them (its settings, which every node shares)."""
    return QueueLimits(settings.max_queued_runs, settings.max_queued_runs_per_token)


class CheckpointEvals:
    """Queues the evaluate runs of a train run's checkpoints; `queued` has their ids.

    Within the queue's limits (docs/design/evals.md, "Evaluations during training"): the
    train run keeps at most `limits.per_submitter` of its evaluate runs waiting, and a side
    run its token's cap or the service's would refuse takes the place of the train run's
    oldest one still waiting (cancelled, "superseded"), or is skipped where it has none: an
    evaluation of a newer checkpoint is worth more than one of an older, and no side run
    may take a place another token's submit needs.
    """

    def __init__(
        self, plan: TrainPlan, ctx: RunContext, stores: Stores, limits: QueueLimits | None = None
    ) -> None:
        self.plan, self.ctx, self.stores = plan, ctx, stores
        self.limits = limits or QueueLimits()
        self.queued: list[str] = []
        self.waiting: list[str] = []
        """Of `queued`, those still waiting when last looked, oldest first."""

    def __call__(self, tag: str, step: int) -> None:
        evals = self.plan.evals
        if evals is None or parse_step(tag) is None or not evals.due(step, self.plan.steps):
            return  # `best` is a copy of a step checkpoint, which is evaluated as that step
        if self.ctx.lease_lost.is_set():
            return  # the run is another attempt's now; it queues its own
        self.waiting = [i for i in self.waiting if self.ctx.runs.get(i).state == "queued"]
        most = self.limits.per_submitter
        while most is not None and len(self.waiting) >= most and self.supersede(tag):
            pass
        try:
            run = self.queue(tag)
        except QueueFull as exc:
            maybe_run = self.queue_instead(tag, exc)
            if maybe_run is None:
                return
            run = maybe_run
        except TrainctlError as exc:
            # What a POST /runs/evaluate would be refused for: training goes on without it.
            self.ctx.log(f"no evaluate run queued for {tag}: {exc}", level="warning")
            return
        self.queued.append(run.id)
        self.waiting.append(run.id)
        checkpoint = {"experiment": self.plan.experiment, "tag": tag, "step": step}
        self.ctx.log(
            f"queued evaluate run {run.short_id} for {tag}",
            evaluate_run=run.id,
            checkpoint=checkpoint,
        )

    def queue(self, tag: str) -> Run:
        assert self.plan.evals is not None
        return queue_checkpoint_eval(
            self.plan.evals,
            self.ctx.run,
            tag,
            self.plan.device,
            runs=self.ctx.runs,
            stores=self.stores,
            limits=self.limits,
        )

    def queue_instead(self, tag: str, refused: TrainctlError) -> Run | None:
        """After a limit refused the evaluate run of `tag`: queue it in the place of this
        run's oldest one still waiting; None, with a warning, where none waits (or another
        submit took the place meanwhile)."""
        try:
            if self.supersede(tag):
                return self.queue(tag)
        except TrainctlError as exc:
            refused = exc
        self.ctx.log(f"no evaluate run queued for {tag}: {refused}", level="warning")
        return None

    def supersede(self, tag: str) -> bool:
        """Cancel the oldest of this run's evaluate runs still waiting, for the one of `tag`;
        False where none waits (a worker may have claimed them meanwhile)."""
        while self.waiting:
            old = self.waiting.pop(0)
            why = f"superseded by the evaluation of {tag}: the queue's limit was reached"
            if self.ctx.runs.cancel_if_queued(old, why):
                self.ctx.log(
                    f"evaluate run {old} cancelled before it started, superseded by the one "
                    f"of {tag} (at most {self.limits.per_submitter} of this token's runs, "
                    f"{self.limits.total} in all, may wait)",
                    superseded_evaluate_run=old,
                )
                return True
        return False

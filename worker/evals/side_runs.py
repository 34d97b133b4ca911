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
from trainctl.store.evals.side_runs import queue_checkpoint_eval
from trainctl.store.exceptions import TrainctlError
from trainctl.store.kinds.train import TrainPlan
from trainctl.store.names import parse_step
from trainctl.worker.context import RunContext


class CheckpointEvals:
    """Queues the evaluate runs of a train run's checkpoints; `queued` has their ids."""

    def __init__(self, plan: TrainPlan, ctx: RunContext, stores: Stores) -> None:
        self.plan, self.ctx, self.stores = plan, ctx, stores
        self.queued: list[str] = []

    def __call__(self, tag: str, step: int) -> None:
        evals = self.plan.evals
        if evals is None or parse_step(tag) is None or not evals.due(step, self.plan.steps):
            return  # `best` is a copy of a step checkpoint, which is evaluated as that step
        if self.ctx.lease_lost.is_set():
            return  # the run is another attempt's now; it queues its own
        try:
            run = queue_checkpoint_eval(
                evals,
                self.ctx.run,
                tag,
                self.plan.device,
                runs=self.ctx.runs,
                stores=self.stores,
            )
        except TrainctlError as exc:
            # What a POST /runs/evaluate would be refused for: training goes on without it.
            self.ctx.log(f"no evaluate run queued for {tag}: {exc}", level="warning")
            return
        self.queued.append(run.id)
        checkpoint = {"experiment": self.plan.experiment, "tag": tag, "step": step}
        self.ctx.log(
            f"queued evaluate run {run.short_id} for {tag}",
            evaluate_run=run.id,
            checkpoint=checkpoint,
        )

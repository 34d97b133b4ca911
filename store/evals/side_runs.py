"""The evaluate runs a train run queues for its own checkpoints (docs/evals.md, "Evaluations
during training"; docs/design/evals.md, "Evaluations during training").

A train plan's `evals` (`store.specs.TrainEvals`) holds what POST /runs/evaluate takes but
the checkpoint; its worker calls `queue_checkpoint_eval` as each checkpoint `evals.every`
asks for commits. The request is resolved by the evaluate kind's own record and enqueued
under the checkpoint's pin (`store.queueing`), as a client's POST would be, so the side run's
plan is built in one place. What differs from a client's submit:

- its priority is one below the train run's, so it never goes before the training that
  made it (nor before runs of the train run's priority);
- its attempts and its submitter are the train run's (its owner may cancel it);
- no admission at queueing: the worker that claims it admits its model (worker.training.memory),
  and a refusal fails the evaluate run, not the training;
- the queue's limits are the worker's (`max_queued_runs`, `max_queued_runs_per_token`, the
  service's settings given to every node): a side run counts against its train run's token,
  and where it would pass a limit the worker coalesces (worker/evals/side_runs.py) instead of
  locking anyone out.
"""

from __future__ import annotations

from trainctl.store.checkpoints.factory import Stores
from trainctl.store.db.records import Run
from trainctl.store.db.runs import RunStore
from trainctl.store.db.submissions import QueueLimits
from trainctl.store.kinds.evaluate import EvaluateRequest
from trainctl.store.plans import Device
from trainctl.store.queueing import enqueue_pinned, resolve_run
from trainctl.store.resolve import SubmitContext
from trainctl.store.specs import MAX_PRIORITY, EvaluateOptions, TrainEvals

EVALUATE = "evaluate"


def side_priority(train_priority: int) -> int:
    """A side run's priority: one below its train run's (no lower than the lowest)."""
    return max(train_priority - 1, -MAX_PRIORITY)


def queue_checkpoint_eval(
    evals: TrainEvals,
    train: Run,
    tag: str,
    device: Device,
    *,
    runs: RunStore,
    stores: Stores,
    limits: QueueLimits | None = None,
) -> Run:
    """Queue the evaluate run of checkpoint `tag` of `train`'s experiment, just committed,
    on the train run's device, within `limits`; raises what a POST /runs/evaluate of it
    would (`QueueFull` beyond a limit)."""
    request = EvaluateRequest(
        **{name: getattr(evals, name) for name in EvaluateOptions.model_fields},
        checkpoint=f"{train.experiment}/{tag}",
        device=device,
        priority=side_priority(train.priority),
        max_attempts=train.max_attempts,
    )
    # An evaluate request reads no data roots: a worker's context has none to give.
    context = SubmitContext(
        data_roots=[],
        datasets=stores.datasets,
        checkpoints=stores.checkpoints,
        exports=stores.exports,
        runs=runs,
        cuda=lambda: device == "cuda",
    )
    queued = resolve_run(EVALUATE, request, context, max_attempts=train.max_attempts)
    [run] = enqueue_pinned(
        [queued], runs, stores.checkpoints, submitted_by=train.submitted_by, queue_limits=limits
    )
    return run

"""Executors by name: how a worker runs each kind of run (docs/design/kinds.md, "Run kinds").

Each built-in kind's executor is in its module of this shelf, beside the store's record of
the kind (store/kinds/ of the same name), and is listed here; a plug-in kind's executor is
declared under the `trainctl.executors` entry-point group. `execute` runs a claimed run with
the executor its kind's record names.
"""

from __future__ import annotations

from typing import cast

from trainctl.store.kinds.registry import RUN_KINDS
from trainctl.store.plans import Plan
from trainctl.store.registry import Registry
from trainctl.worker.context import RunContext
from trainctl.worker.exceptions import RunStopped
from trainctl.worker.executor import Executor, Outcome, WorkerEnv, read_plan, stopped_outcome
from trainctl.worker.kinds.benchmark import execute_benchmark
from trainctl.worker.kinds.evaluate import execute_evaluate
from trainctl.worker.kinds.export import execute_export
from trainctl.worker.kinds.prepare import execute_prepare
from trainctl.worker.kinds.sample import execute_sample
from trainctl.worker.kinds.train import execute_train
from trainctl.worker.kinds.validate import execute_validate
from trainctl.worker.stops import maybe_stop, stoppable
from trainctl.worker.training.memory import admit_at_claim

EXECUTORS: Registry[Executor] = Registry("executor", group="trainctl.executors")
"""How a worker runs each kind of run, by the executor name its kind's record gives
(store.kinds.registry); a plug-in kind's executor is declared under the same entry-point group."""


for _name, _executor in {
    "train": execute_train,
    "benchmark": execute_benchmark,
    "validate": execute_validate,
    "prepare": execute_prepare,
    "sample": execute_sample,
    "export": execute_export,
    "evaluate": execute_evaluate,
}.items():
    EXECUTORS.register(_name, _executor)


def maybe_log_params(ctx: RunContext, params: int | None) -> None:
    if params is not None:
        ctx.log(f"the model has {params:,} parameters (counted at claim); it fits this worker")


def execute(ctx: RunContext, env: WorkerEnv) -> Outcome:
    """Run `ctx.run` with the executor its kind names, once it is admitted: a kind whose
    memory is estimated is counted again on the model it builds (worker.training.memory), before
    any of its work, whatever the kind. Every kind stops where its inner loops call
    `worker.stops.maybe_stop` (a batch, a token, a step), a plug-in's too: what was asked to
    stop there ends with the stopped outcome and no result beyond what the kind returns."""
    kind = RUN_KINDS.get(ctx.run.kind)
    try:
        with stoppable(ctx.should_stop):
            maybe_stop()  # asked to stop before it began: none of its work is done
            if kind.memory is not None:
                plan = cast(
                    Plan, read_plan(ctx, kind.plan)
                )  # a kind's plan is a Plan (store.kinds.registry)
                maybe_log_params(ctx, admit_at_claim(plan, env.memory_bytes))
            return EXECUTORS.get(kind.executor)(ctx, env)
    except RunStopped:
        return stopped_outcome(ctx, {"stopped": True})

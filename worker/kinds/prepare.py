"""Prepare runs, torch half (docs/design/kinds.md, "Run kinds"): the dataset written by
`worker.data.prepare`; the request, plan and resolver are store/kinds/prepare.py.
"""

from __future__ import annotations

from trainctl.store.data.prepare import PrepareStopped
from trainctl.store.kinds.prepare import PreparePlan
from trainctl.worker.context import RunContext
from trainctl.worker.data.prepare import prepare
from trainctl.worker.executor import Outcome, WorkerEnv, read_plan, stopped_outcome


def execute_prepare(ctx: RunContext, env: WorkerEnv) -> Outcome:
    plan = read_plan(ctx, PreparePlan)
    ctx.log(f"preparing dataset {plan.name} from {len(plan.inputs)} input files")
    try:
        result = prepare(plan, ctx, env.stores)
    except PrepareStopped:
        return stopped_outcome(ctx, {"dataset": plan.name})  # nothing of it is left
    return Outcome("succeeded", result)

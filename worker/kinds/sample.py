"""Sample runs, torch half (docs/design/models.md, "Model output: samples, sample runs,
exports"): the prompts continued by `worker.models.sampling`; the request, plan and resolver
are store/kinds/sample.py.
"""

from __future__ import annotations

from trainctl.store.kinds.sample import SamplePlan
from trainctl.worker.context import RunContext
from trainctl.worker.executor import Outcome, WorkerEnv, check_device, read_plan
from trainctl.worker.models.sampling import run_sample


def execute_sample(ctx: RunContext, env: WorkerEnv) -> Outcome:
    plan = read_plan(ctx, SamplePlan)
    store = env.stores.checkpoints
    return Outcome("succeeded", run_sample(plan, ctx, store, check_device(plan.device)))

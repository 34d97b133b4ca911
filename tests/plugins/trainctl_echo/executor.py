"""How a worker runs an `echo` run: one log line and one progress step per step, each held
`hold_seconds` by a sleep that checks for no stop (the unit of work of a kind that outlasts a
drain's deadline: tests/reliability/test_drain.py)."""

from __future__ import annotations

import time

from trainctl.worker.context import RunContext
from trainctl.worker.executor import Outcome, WorkerEnv, read_plan, stopped_outcome
from trainctl_echo.kind import EchoPlan


def execute_echo(ctx: RunContext, env: WorkerEnv) -> Outcome:
    plan = read_plan(ctx, EchoPlan)
    for step in range(1, plan.steps + 1):
        if ctx.should_stop():
            return stopped_outcome(ctx, {"said": step - 1})
        ctx.log(f"echo {step}/{plan.steps}: {plan.message}")
        ctx.progress(step, plan.steps, force=True)
        time.sleep(plan.hold_seconds)
    return Outcome("succeeded", {"said": plan.steps, "message": plan.message})

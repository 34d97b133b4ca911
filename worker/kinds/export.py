"""Export runs, torch half (docs/design/models.md, "Model output: samples, sample runs,
exports"): a checkpoint written as a transformers folder into the exports store
(`worker.checkpoints.exports`); the request, plan and resolver are store/kinds/export.py.
"""

from __future__ import annotations

from trainctl.store.checkpoints.info import check_fits
from trainctl.store.db.scores import checkpoint_results
from trainctl.store.kinds.export import ExportPlan
from trainctl.worker.checkpoints.exports import export_hf
from trainctl.worker.context import RunContext
from trainctl.worker.executor import Outcome, WorkerEnv, read_plan


def execute_export(ctx: RunContext, env: WorkerEnv) -> Outcome:
    plan = read_plan(ctx, ExportPlan)
    checkpoints, exports = env.stores.checkpoints, env.stores.exports
    ref = plan.checkpoint
    info = checkpoints.get(ref.experiment, ref.tag)
    # A tag ('best') may have been saved again since submit: export what was asked for.
    check_fits(info.require_model_config(), plan.model, f"checkpoint {ref}")
    # What an export killed mid-write left in the exports store (the service sweeps it too).
    for _, leftover in exports.cleanup(ref.experiment):
        ctx.log(f"cleaned up {leftover} (left by an interrupted export)")
    ctx.log(f"exporting checkpoint {ref} (step {info.step}) as {plan.format}, {plan.dtype}")
    # The export is filed under the checkpoint's name in the exports store: plan.output names
    # that place as submit saw it.
    exported = export_hf(
        checkpoints.entry(ref.experiment, ref.tag),
        exports,
        ref.experiment,
        ref.tag,
        dtype=plan.dtype,
        facts={"export run": ctx.run.id},
        evals=checkpoint_results(ctx.runs, ref.experiment, ref.tag, info.step, info.run_id),
    )
    for difference in exported.differences:
        ctx.log(f"differs from trainctl: {difference}", level="warning")
    return Outcome(
        "succeeded",
        {
            **exported.to_dict(),
            "checkpoint": {"experiment": ref.experiment, "tag": ref.tag, "step": info.step},
            "export": {"experiment": ref.experiment, "tag": ref.tag},
        },
    )

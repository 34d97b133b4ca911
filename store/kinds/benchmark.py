"""The benchmark run kind (docs/design/kinds.md, "Run kinds"): the training step timed on
synthetic tokens, with a device profile's defaults; its request, plan, resolver, memory
need and record. The worker half, and `python -m trainctl.worker.kinds.benchmark`, are
worker/kinds/benchmark.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, StrictBool, StrictInt

from trainctl.store.kinds.base import RunKind, one_device
from trainctl.store.plans import CheckpointRef, StepPlan
from trainctl.store.registry import Ref
from trainctl.store.specs import BatchSpec, DeviceChoice, ModelSpec, Request, StepOptions
from trainctl.store.training.memory import MemoryNeed, step_estimate

if TYPE_CHECKING:
    from trainctl.store.resolve import SubmitContext


TARGET_TOKENS = 8_310_000_000  # the seed's pre-training budget: 8.31 B tokens
BENCHMARK_EXPERIMENT = "benchmark"
"""Benchmarks write no checkpoints; their runs are filed under this experiment name."""


class BenchmarkOptions(StepOptions):
    steps: StrictInt = Field(100, ge=1, le=100_000, description="Measured steps.")
    warmup_steps: StrictInt = Field(10, ge=0, le=10_000, description="Unmeasured steps first.")
    target_tokens: StrictInt = Field(
        TARGET_TOKENS, ge=1, le=10**15, description="Tokens the time estimate is for."
    )


class BenchmarkRequest(BenchmarkOptions, Request):
    model: ModelSpec = Field(default_factory=ModelSpec, description="Model preset and changes.")
    batch: BatchSpec = Field(default_factory=BatchSpec, description="Batch geometry.")
    use_compile: StrictBool | None = Field(None, description="torch.compile; default on CUDA only.")
    compile_mode: Literal["default", "reduce-overhead", "max-autotune"] | None = Field(
        None, description="torch.compile mode; default reduce-overhead."
    )
    use_checkpoint_per_layer: StrictBool | None = Field(
        None, description="Per-layer activation checkpointing; default on CUDA only."
    )
    device: DeviceChoice = Field("auto", description="Where to run.")


class BenchmarkPlan(BenchmarkOptions, StepPlan):
    warnings: list[str] = Field(description="What makes the figures less comparable.")

    @property
    def filed_under(self) -> str:
        return BENCHMARK_EXPERIMENT

    @property
    def depends_on(self) -> CheckpointRef | None:
        return None


def resolve_benchmark(request: BenchmarkRequest, *, cuda_available: bool) -> BenchmarkPlan:
    # Imported when it runs, not above: see the module's docstring.
    from trainctl.store.resolve import (
        BENCHMARK_PROFILES,
        CPU_BENCHMARK_WARNING,
        batch_geometry,
        model_plan,
        pick_device,
        shared_options,
    )

    device = pick_device(request.device, cuda_available)
    request.schedule.phases(request.warmup_steps + request.steps)  # fits the steps it times
    profile = BENCHMARK_PROFILES[device]
    use_compile = profile.use_compile if request.use_compile is None else request.use_compile
    ckpt = (
        profile.use_checkpoint_per_layer
        if request.use_checkpoint_per_layer is None
        else request.use_checkpoint_per_layer
    )
    # MTP stays off in the benchmark (as in the seed) unless the overrides ask for it.
    model = model_plan(
        request.model,
        profile,
        use_compile=use_compile,
        compile_mode=request.compile_mode or "reduce-overhead",
        use_checkpoint_per_layer=ckpt,
    )
    warnings = [CPU_BENCHMARK_WARNING] if device == "cpu" and request.device == "auto" else []
    return BenchmarkPlan(
        **shared_options(request, BenchmarkOptions),
        device=device,
        model=model,
        batch=batch_geometry(request.batch, profile, model.config),
        warnings=warnings,
    )


def plan_benchmark(request: BenchmarkRequest, ctx: SubmitContext) -> BenchmarkPlan:
    return resolve_benchmark(request, cuda_available=ctx.cuda_available)


def benchmark_need(plan: BenchmarkPlan, params: int | None = None) -> MemoryNeed:
    estimate = step_estimate(plan, False, params)
    return MemoryNeed(estimate, 1, plan.device, "this benchmark", plan.model.config)


BENCHMARK = RunKind(
    name="benchmark",
    request=BenchmarkRequest,
    plan=BenchmarkPlan,
    summary="Queue a throughput benchmark.",
    resolve=Ref(f"{__name__}:plan_benchmark"),
    placement=one_device,
    memory=benchmark_need,
    has_steps=True,
    executor="benchmark",
)

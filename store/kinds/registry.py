"""Run kinds: one record each, the one place a kind of run is defined (docs/design/kinds.md,
"Run kinds").

A record says everything the rest of trainctl asks of a kind: its request and plan models,
how a request is resolved into a plan at submit (`resolve`, a reference loaded on first use,
since resolution reads files and the light client never needs it), what workers the plan
needs (`placement`), how much memory it needs at its peak (`memory`, None for the kinds whose
memory is bounded by construction), whether it counts steps, and the name of the executor a
worker runs it with (`worker.executor.EXECUTORS`). Submit, admission, the routes
(`POST /runs/<kind>`), the store's checks, the CLI and the worker all read the records, so a
new kind is one record here, or one a plug-in declares under the `trainctl.run_kinds` entry
point group, with its executor under `trainctl.executors`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Annotated, Any, Generic, TypeVar

from trainctl.store.db.placement import Placement
from trainctl.store.evals.tasks import EvaluatePlan, EvaluateRequest, evaluate_need
from trainctl.store.models.plugin import PluginModelConfig
from trainctl.store.plans import (
    BenchmarkPlan,
    ExportPlan,
    ForkPoint,
    Plan,
    PreparePlan,
    SamplePlan,
    TrainPlan,
    ValidatePlan,
)
from trainctl.store.registry import RegisteredName, Registry
from trainctl.store.specs import (
    BenchmarkRequest,
    ExportRequest,
    PrepareRequest,
    Request,
    SampleRequest,
    Spec,
    TrainRequest,
    ValidateRequest,
)
from trainctl.store.training import memory

if TYPE_CHECKING:
    from trainctl.store.resolve import SubmitContext

F = TypeVar("F")


class Ref(Generic[F]):
    """`module:attribute`, imported when first asked for: a record can name a function of a
    module its readers need not load (resolution, for the CLI)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._loaded: F | None = None

    def load(self) -> F:
        if self._loaded is None:
            module, _, name = self.target.partition(":")
            self._loaded = getattr(import_module(module), name)
        return self._loaded

    def __repr__(self) -> str:
        return f"Ref({self.target!r})"


@dataclass(frozen=True)
class RunKind:
    """Everything trainctl needs to know of one kind of run."""

    name: str
    """The kind's name: `POST /runs/<name>`, the run row's `kind`."""
    request: type[Request]
    """What a client sends."""
    plan: type[Spec]
    """What a worker runs: a frozen model with `filed_under` (the experiment the run is
    listed under) and `depends_on` (the checkpoint it pins, or None)."""
    summary: str
    """The submit route's one line in the API docs."""
    resolve: Ref[Callable[[Any, SubmitContext], Plan]]
    """Request and submit context -> plan; raises InvalidRequest (422) or Conflict (409)."""
    placement: Callable[[Any], Placement]
    """Plan -> the workers it needs."""
    memory: Callable[[Any, int | None], memory.MemoryNeed] | None
    """(Plan, real parameter count or None) -> its peak memory per process; None where
    nothing can be too large. Submit estimates the count from the config; a worker that
    built the model on the meta device passes the real one (worker/training/memory.py)."""
    has_steps: bool
    """Whether its progress counts steps to a total (a progress bar can show it)."""
    executor: str
    """The worker's executor for it, by name (worker.executor.EXECUTORS)."""
    parent: Callable[[Any], ForkPoint | None] | None = None
    """Plan -> where the run was forked from, its lineage; None: runs of this kind are
    never forks."""


RUN_KINDS: Registry[RunKind] = Registry("run kind", group="trainctl.run_kinds")

RunKindName = Annotated[str, RegisteredName(RUN_KINDS)]
"""A run kind's name: the registered ones, published in the schema as an enum."""
ServedKindName = Annotated[str, RegisteredName(RUN_KINDS, check=False)]
"""A run kind's name as the server answers it: the same schema, any name read (a client need
not know the server's plug-ins)."""


def kind_of_plan(plan: Plan) -> RunKind:
    """The kind whose plan `plan` is."""
    for kind in RUN_KINDS:
        if type(plan) is kind.plan:
            return kind
    raise TypeError(f"no run kind has plans of type {type(plan).__name__}")


def placement_of(plan: Plan) -> Placement:
    """The kind's placement, and the plug-in model the plan's model is, if it is one: only
    workers that have it installed can build it."""
    placement = kind_of_plan(plan).placement(plan)
    model = getattr(plan, "model", None)
    config = getattr(model, "config", model)  # a ModelPlan's, or the config itself
    if isinstance(config, PluginModelConfig):
        placement = dataclasses.replace(placement, model_plugin=config.plugin)
    return placement


# --- placements -----------------------------------------------------------------------------


def train_placement(plan: TrainPlan) -> Placement:
    """nnodes nodes of nproc_per_node GPUs (or CPU processes)."""
    return Placement(
        nnodes=plan.nnodes,
        gpus_per_node=plan.nproc_per_node if plan.device == "cuda" else 0,
        procs_per_node=plan.nproc_per_node,
        spread=plan.spread,
    )


def train_parent(plan: TrainPlan) -> ForkPoint | None:
    return plan.fork_from


def one_device(plan: BenchmarkPlan | ValidatePlan | SamplePlan | EvaluatePlan) -> Placement:
    """One GPU, or one CPU process, on one node."""
    return Placement(gpus_per_node=1 if plan.device == "cuda" else 0)


def one_cpu(plan: Spec) -> Placement:
    """One CPU process on one node."""
    return Placement()


# --- the built-in kinds ---------------------------------------------------------------------

RESOLVE = "trainctl.store.resolve"

for _kind in (
    RunKind(
        name="train",
        request=TrainRequest,
        plan=TrainPlan,
        summary="Queue a train run; the stored spec is its plan, every default resolved.",
        resolve=Ref(f"{RESOLVE}:plan_train"),
        placement=train_placement,
        memory=memory.train_need,
        has_steps=True,
        executor="train",
        parent=train_parent,
    ),
    RunKind(
        name="validate",
        request=ValidateRequest,
        plan=ValidatePlan,
        summary="Queue a validation of a checkpoint, pinned now to a concrete experiment/tag.",
        resolve=Ref(f"{RESOLVE}:plan_validate"),
        placement=one_device,
        memory=memory.validate_need,
        has_steps=False,
        executor="validate",
    ),
    RunKind(
        name="benchmark",
        request=BenchmarkRequest,
        plan=BenchmarkPlan,
        summary="Queue a throughput benchmark.",
        resolve=Ref(f"{RESOLVE}:plan_benchmark"),
        placement=one_device,
        memory=memory.benchmark_need,
        has_steps=True,
        executor="benchmark",
    ),
    RunKind(
        name="prepare",
        request=PrepareRequest,
        plan=PreparePlan,
        summary="Queue a prepare: corpus files under the data roots into a dataset of the "
        "data dir.",
        resolve=Ref(f"{RESOLVE}:plan_prepare"),
        placement=one_cpu,
        memory=None,  # bounded by its batches
        has_steps=True,
        executor="prepare",
    ),
    RunKind(
        name="sample",
        request=SampleRequest,
        plan=SamplePlan,
        summary="Queue a sample run: continue prompts with a checkpoint; the completions "
        "stream as `sample` events and are the run's result.",
        resolve=Ref(f"{RESOLVE}:plan_sample"),
        placement=one_device,
        memory=memory.sample_need,
        has_steps=False,
        executor="sample",
    ),
    RunKind(
        name="export",
        request=ExportRequest,
        plan=ExportPlan,
        summary="Queue an export of a checkpoint to a Hugging Face transformers folder, "
        "served under /exports/{experiment}/{tag}.",
        resolve=Ref(f"{RESOLVE}:plan_export"),
        placement=one_cpu,
        memory=None,  # reads one checkpoint on a CPU
        has_steps=False,
        executor="export",
    ),
    RunKind(
        name="evaluate",
        request=EvaluateRequest,
        plan=EvaluatePlan,
        summary="Queue an evaluation of a checkpoint on downstream tasks (GET /evals/tasks); "
        "the scores are `eval/<task>/<metric>` metrics events and the run's result.",
        resolve=Ref("trainctl.store.kinds.evaluate:plan_evaluate"),
        placement=one_device,
        memory=evaluate_need,
        has_steps=False,
        executor="evaluate",
    ),
):
    RUN_KINDS.register(_kind.name, _kind)

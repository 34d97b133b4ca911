"""The train run kind (docs/design/kinds.md, "Run kinds"): a model trained from scratch, or
on from a checkpoint (a resume, a fork: `store.kinds.forks`), on one node or several; its
request, plan, resolver, memory need, placement and record.

Resolution reads the data files, the datasets and the checkpoints; the modules that read them
are imported where a resolver runs, not at the top, because the CLI imports this module for
the request alone and never resolves one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    Discriminator,
    Field,
    StrictBool,
    StrictInt,
    Tag,
    field_validator,
    model_validator,
)

from trainctl.store.checkpoints.manifests import FULL_LAYOUT
from trainctl.store.db.placement import Placement, Spread
from trainctl.store.evals.tasks import check_train_evals
from trainctl.store.exceptions import InvalidRequest
from trainctl.store.kinds.base import RunKind
from trainctl.store.kinds.forks import FORK_REF_PATTERN, check_fork_ref, fork_point, resume_point
from trainctl.store.models.generation import GenerationSettings, check_context
from trainctl.store.models.hf_config import AnyModelConfig
from trainctl.store.names import EXPERIMENT_RULE, MAX_NAME_LENGTH, ExperimentName, Name
from trainctl.store.plans import (
    BatchPlan,
    CheckpointRef,
    DatasetPin,
    ForkPoint,
    StepPlan,
    data_tokenizer,
)
from trainctl.store.registry import Ref
from trainctl.store.specs import (
    MAX_DATASET_REF_LENGTH,
    MAX_STEPS,
    MLFLOW_SETTING,
    TRACKERS,
    WANDB_SETTING,
    BatchSpec,
    DataSpec,
    DeviceChoice,
    ModelSpec,
    Prompt,
    Request,
    Spec,
    StepOptions,
    Tracker,
    TrainEvals,
)
from trainctl.store.training.hangs import HangOptions, StragglerOptions
from trainctl.store.training.health import HealthSpec
from trainctl.store.training.memory import MemoryEstimate, MemoryNeed, Sharding, step_estimate
from trainctl.store.training.parallelism import PARALLEL_STRATEGIES, ParallelismSpec

if TYPE_CHECKING:
    from trainctl.store.checkpoints.store import CheckpointStore
    from trainctl.store.data.bucket import DatasetStore
    from trainctl.store.resolve import SubmitContext


# The most GPUs one node has today (and CPU ranks beyond this only contend for cores).
MAX_NPROC_PER_NODE = 16
# Nodes one gang run may span (store.db.placement): each is one worker, claimed together.
MAX_NNODES = 64
# Prompts of a train run's samples (each one is decoded every time).
MAX_TRAIN_PROMPTS = 8
# A folder named in a spec: no NUL, line break or other control character.
FOLDER_PATTERN = r"^[^\x00-\x1f]+$"
# A W&B project name: what its URLs and the client accept (no slashes, no URL syntax).
WANDB_PROJECT_PATTERN = r"^[A-Za-z0-9_.-]+$"


# --- request and plan -------------------------------------------------------------------------


# How long an elastic gang waits for all its nodes before it runs on fewer.
SHRINK_AFTER_SECONDS = 300.0
NNODES_TEXT = (
    "Workers (nodes) the run spans, claimed together, each running nproc_per_node "
    "processes. nnodes > 1 needs the PostgreSQL run queue."
)


class NodeRange(Spec):
    """An elastic gang's nodes (docs/design/placement.md, "Elastic gangs"): placed on as
    many as `max` as are idle, on as few as `min` once it has waited `shrink_after_seconds`
    since it was queued (a lost member requeues it), with the same global batch."""

    min: StrictInt = Field(ge=1, le=MAX_NNODES, description="The fewest nodes it runs on.")
    max: StrictInt = Field(ge=1, le=MAX_NNODES, description="The nodes it asks for.")
    shrink_after_seconds: float = Field(
        SHRINK_AFTER_SECONDS,
        ge=0,
        le=7 * 24 * 3600,
        description="How long it waits for max nodes, from when it was queued, before it "
        "takes fewer.",
    )

    @model_validator(mode="after")
    def _min_below_max(self) -> NodeRange:
        if self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}")
        return self


class TrainOptions(StepOptions):
    experiment: ExperimentName = Field(
        "default",
        description=f"Checkpoints go to checkpoints/<experiment>: a name of {EXPERIMENT_RULE}.",
    )
    steps: StrictInt = Field(
        ..., ge=1, le=MAX_STEPS, description="Optimizer steps to train in total."
    )
    log_every: StrictInt = Field(
        10,
        ge=1,
        le=MAX_STEPS,
        description="Write a train metrics event every this many steps (and at the last "
        "step); the loss, grad norm and lrs are the reporting step's, the timings the mean "
        "since the previous report.",
    )
    max_keep: StrictInt = Field(3, ge=1, le=10_000, description="step_* checkpoints kept.")
    evals: TrainEvals | None = Field(
        None,
        description="Downstream evaluations of the run's checkpoints: as each step_<N> "
        "checkpoint `every` asks for commits, an evaluate run is queued for it at a priority "
        "one below the train run's, and it pins the checkpoint until it has run "
        '(docs/evals.md, "Evaluations during training"). Needs data whose tokenizer is known '
        "(a dataset, stdlib or text). Null: none.",
    )
    save_dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Weights' dtype on disk; bfloat16 is a lossy export."
    )
    async_checkpoint: StrictBool = Field(
        False,
        description="Save checkpoints in the background: the loop stalls only to copy the "
        "state to CPU memory (a copy of the weights and optimizer state, kept between saves), "
        "and a thread writes and commits it exactly as a synchronous save does; at most one "
        "save is in flight and a run waits for it before it ends. Off by default: on a "
        "CPU-only node the writer competes with training for the same cores.",
    )
    val_batches: StrictInt = Field(8, ge=1, le=10_000, description="Batches per validation.")
    sample_every: StrictInt | None = Field(
        None,
        ge=1,
        le=MAX_STEPS,
        description="Every this many steps (and at the last), continue each of "
        "`sample_prompts` with `sample_settings` and write a `sample` event (step, prompt, "
        "completion, seed). Null: no samples. Needs data whose tokenizer is known (a "
        "dataset, stdlib or text).",
    )
    sample_prompts: list[Prompt] = Field(
        default_factory=list,
        max_length=MAX_TRAIN_PROMPTS,
        description=f"What the samples continue, at most {MAX_TRAIN_PROMPTS}.",
    )
    sample_settings: GenerationSettings = Field(
        default_factory=lambda: GenerationSettings(max_new_tokens=64),
        description="How the samples are generated; their seed is the same at every step, so "
        "samples differ only because the model does.",
    )
    trackers: list[Tracker] | None = Field(
        None,
        max_length=len(TRACKERS),
        description="Where the service mirrors the run's metrics while it trains: "
        "'tensorboard' (event files in <folder>/<experiment>/<run id>/, the folder being "
        "`tensorboard_dir` or the data dir's tensorboard/) and 'mlflow' (the tracking server "
        "the service's TRAINCTL_MLFLOW_URI names) and 'wandb' (Weights & Biases: the project "
        "TRAINCTL_WANDB_PROJECT names, one W&B run across every attempt). Null: the service's "
        "TRAINCTL_TRACKERS; []: none. The run's event log stays the record: a tracker that is "
        "down never slows or fails the run, and gets what it missed when it is back.",
    )
    tensorboard_dir: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_DATASET_REF_LENGTH,
        pattern=FOLDER_PATTERN,
        description="With the 'tensorboard' tracker: an existing folder inside the data roots "
        "(absolute, or relative to the first root) to write the event files under; default: "
        "the data dir's tensorboard/.",
    )
    wandb_project: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        pattern=WANDB_PROJECT_PATTERN,
        description="With the 'wandb' tracker: the Weights & Biases project to mirror the run "
        "to instead of the service's TRAINCTL_WANDB_PROJECT (which must be set). The plan pins "
        "it: every attempt logs to the one W&B run there. A fork is drawn as a branch of its "
        "parent where both are in one project.",
    )
    nproc_per_node: StrictInt = Field(
        1,
        ge=1,
        le=MAX_NPROC_PER_NODE,
        description="Processes (GPUs) per node the run trains on, data-parallel (DDP "
        "through torchrun); with device 'cuda' a worker with this many GPUs takes it. The "
        "global batch stays micro_batch_size x grad_accum_steps sequences: each of the "
        "nnodes x nproc_per_node processes runs its share of the micro-batches, so "
        "grad_accum_steps must be a multiple of their number (by default it is rounded up "
        "to one).",
    )
    parallelism: ParallelismSpec = Field(
        default_factory=ParallelismSpec,
        description="How the nnodes x nproc_per_node processes share the model: replicated "
        "(ddp, the default) or sharded (fsdp).",
    )
    hang: HangOptions = Field(
        default_factory=HangOptions,
        description="Hang detection of a multi-process run: when a rank without progress "
        'counts as hung (docs/design/hangs.md, "Hangs").',
    )
    stragglers: StragglerOptions = Field(
        default_factory=StragglerOptions,
        description="Straggler reports of a multi-process run: when a rank counts as "
        'persistently slow (docs/design/hangs.md, "Stragglers").',
    )
    health: HealthSpec = Field(
        default_factory=HealthSpec,
        description="What the loop does about a non-finite loss or gradient norm and about a "
        'loss spike (docs/design/health.md, "Loss health"); every check is on by default.',
    )
    spread: Spread = Field(
        "any",
        description="Where the nnodes workers may be: 'any' (on any nodes, other nodes "
        "preferred), 'same_node' (all on one node name), 'distinct_nodes' (each on a node "
        "name of its own).",
    )

    @field_validator("trackers")
    @classmethod
    def _each_tracker_once(cls, v: list[Tracker] | None) -> list[Tracker] | None:
        if v is not None and len(set(v)) != len(v):
            raise ValueError(f"name each tracker once, got {v}")
        return v

    @model_validator(mode="after")
    def _samples_have_prompts(self) -> TrainOptions:
        if self.sample_every is not None and not self.sample_prompts:
            raise ValueError("sample_every needs sample_prompts: the texts the samples continue")
        strategy = PARALLEL_STRATEGIES.get(self.parallelism.strategy)
        if self.sample_every is not None and not strategy.runs_alone_on_rank_0:
            raise ValueError(
                f"sample_every with parallelism strategy {strategy.name!r}: its ranks run every "
                "forward together, so rank 0 cannot sample alone; sample the run's checkpoints "
                "instead (POST /samples)"
            )
        if self.save_dtype != "float32" and strategy.checkpoint_layout != FULL_LAYOUT:
            raise ValueError(
                f"save_dtype {self.save_dtype!r} with parallelism strategy {strategy.name!r}: "
                "its ranks save their shards of the training state itself, in the dtype they "
                "train in, so that a resume is exact; leave save_dtype out, and export a "
                "checkpoint (POST /runs/export with dtype bfloat16) for a smaller copy"
            )
        return self


def _node_form(value: Any) -> str:
    # One form per input, so a refusal names only what was wrong with the form given.
    return "range" if isinstance(value, dict | NodeRange) else "count"


NodeCount = Annotated[
    Annotated[Annotated[StrictInt, Field(ge=1, le=MAX_NNODES)], Tag("count")]
    | Annotated[NodeRange, Tag("range")],
    Discriminator(_node_form),
]


class TrainRequest(TrainOptions, Request):
    nnodes: NodeCount = Field(
        1,
        description=f"{NNODES_TEXT} An elastic gang gives {{min, max}} instead "
        '(docs/design/placement.md, "Elastic gangs"); every world size it may take '
        "must divide batch.grad_accum_steps.",
    )
    model: ModelSpec = Field(default_factory=ModelSpec, description="Model preset and changes.")
    batch: BatchSpec = Field(default_factory=BatchSpec, description="Batch geometry.")
    data: DataSpec = Field(default_factory=DataSpec, description="Training data.")
    checkpoint_every: StrictInt | None = Field(
        None,
        ge=1,
        le=MAX_STEPS,
        description="Save step_<N> every this many steps (and at the end); default: steps / 10.",
    )
    val_every: StrictInt | None = Field(
        None,
        ge=1,
        le=MAX_STEPS,
        description="Validate every this many steps; a better loss "
        "saves the 'best' checkpoint. Default: checkpoint_every.",
    )
    # 'latest' is itself a valid name: the name rule is the whole rule.
    resume_from: Name | None = Field(
        None, description="'latest' or a tag of this experiment to continue from."
    )
    fork_from: str | None = Field(
        None,
        pattern=FORK_REF_PATTERN,
        max_length=2 * MAX_NAME_LENGTH + 1,
        description="Start a new run from another experiment's checkpoint, "
        "'<experiment>/<tag>' ('step_N', 'best', or 'latest' for its newest step): its "
        "weights, both optimizers' state, its data position and RNG, continued from its "
        "step with this request's own schedule, data, steps and batch. `experiment` must be "
        "another one (the fork's own); the model, the tokenizer and the optimizer kind must "
        'be the checkpoint\'s (docs/architecture.md, "Forks").',
    )
    device: DeviceChoice = Field("auto", description="Where to run.")

    @field_validator("fork_from")
    @classmethod
    def _fork_ref(cls, v: str | None) -> str | None:
        return v if v is None else check_fork_ref("fork_from", v)

    @model_validator(mode="after")
    def _fork_or_resume(self) -> TrainRequest:
        if self.fork_from is not None and self.resume_from is not None:
            raise ValueError(
                "fork_from and resume_from: give one; a fork starts a new experiment from "
                "another's checkpoint, a resume continues this experiment"
            )
        return self


class TrainPlan(TrainOptions, StepPlan):
    nnodes: StrictInt = Field(1, ge=1, le=MAX_NNODES, description=NNODES_TEXT)
    # Plans from before elastic gangs run on exactly nnodes.
    min_nnodes: StrictInt | None = Field(
        None,
        ge=1,
        description="An elastic gang's fewest nodes (nnodes is its most); null: exactly nnodes.",
    )
    shrink_after_seconds: float | None = Field(
        None, description="How long an elastic gang waits for nnodes workers before fewer."
    )
    # A plan from before trackers existed is mirrored nowhere, as it was then.
    trackers: list[Tracker] = Field(
        default_factory=list, description="The trackers the service mirrors the run to."
    )
    data: DataSpec = Field(description="Training data, paths expanded.")
    dataset: DatasetPin | None = Field(description="The dataset data.dataset names, pinned.")
    # Plans from before mixtures existed name none.
    datasets: list[DatasetPin] = Field(
        default_factory=list,
        description="The datasets data.mixture names, pinned, in its order; [] for a run "
        "of one source.",
    )
    checkpoint_every: StrictInt = Field(ge=1, description="Save step_<N> every this many steps.")
    val_every: StrictInt = Field(ge=1, description="Validate every this many steps.")
    resume_from: CheckpointRef | None = Field(description="The checkpoint the run continues.")
    # Plans from before forks existed start from scratch or resume.
    fork_from: ForkPoint | None = Field(
        None,
        description="A fork's starting point: the run starts from this checkpoint of another "
        "experiment with the plan's own schedule, data, steps and batch.",
    )

    @property
    def filed_under(self) -> str:
        return self.experiment

    @property
    def depends_on(self) -> CheckpointRef | None:
        return self.fork_from.checkpoint if self.fork_from else self.resume_from

    @property
    def tokenizer_dataset(self) -> DatasetPin | None:
        """The dataset whose tokenizer the run's tokens are of: its one, or its mixture's
        first (they share one, checked at submit)."""
        return self.dataset or next(iter(self.datasets), None)


# --- resolution -------------------------------------------------------------------------------


def resolve_train(
    request: TrainRequest,
    *,
    cuda_available: bool,
    data_roots: list[Path],
    checkpoints: CheckpointStore | None = None,
    datasets: DatasetStore | None = None,
    default_trackers: Sequence[Tracker] = (),
    mlflow_configured: bool = False,
    wandb_project: str | None = None,
) -> TrainPlan:
    """The plan of a train request. A resume needs `checkpoints`, to pin the checkpoint;
    data that names a dataset needs `datasets`, the deployment's (`open_stores`).
    `default_trackers` are the service's (TRAINCTL_TRACKERS), for a request that names none."""
    # Imported when it runs, not above: see the module's docstring.
    from trainctl.store.data.contents import check_enough_tokens
    from trainctl.store.data.pins import check_vocabulary, data_plan
    from trainctl.store.resolve import (
        TRAIN_PROFILES,
        batch_geometry,
        model_plan,
        pick_device,
        shared_options,
    )

    device = pick_device(request.device, cuda_available)
    profile = TRAIN_PROFILES[device]
    model = model_plan(request.model, profile)
    if request.data.source in ("stdlib", "text") and model.config.vocab_size < 256:
        raise InvalidRequest("byte-level text needs a vocab_size of at least 256")
    resolved = data_plan(request.data, data_roots, datasets)
    data, dataset = resolved.data, resolved.dataset
    for field, pin in resolved.pins:
        check_vocabulary(
            field,
            pin,
            model.config.vocab_size,
            f"the model's vocab_size of {model.config.vocab_size:,}; raise "
            f"model.overrides.vocab_size to at least {pin.vocab_size:,}",
        )
    geometry = batch_geometry(request.batch, profile, model.config)
    for field, arrays in resolved.arrays:
        check_enough_tokens(arrays, data.val_fraction, geometry.seq_len, field)
    if request.sample_every is not None:
        _check_samples(request, data, resolved.tokenizer_pin, model.config, datasets)
    checkpoint_every = request.checkpoint_every or max(request.steps // 10, 1)
    tokenizer = data_tokenizer(data, resolved.tokenizer_pin)
    if request.evals is not None:
        source = f"source {data.source!r}"
        check_train_evals(request.evals, tokenizer, source, checkpoint_every, request.steps)
    fork = fork_point(request, model.config, checkpoints, tokenizer)
    return TrainPlan(
        **shared_options(request, TrainOptions)
        | _trackers(request, default_trackers, mlflow_configured, wandb_project, data_roots),
        device=device,
        model=model,
        **_node_range(request.nnodes),
        batch=_split_across_ranks(geometry, request.batch, request),
        data=data,
        dataset=dataset,
        datasets=resolved.mixture,
        checkpoint_every=checkpoint_every,
        val_every=request.val_every or checkpoint_every,
        resume_from=resume_point(request, model.config, checkpoints, tokenizer),
        fork_from=fork,
    )


def _check_samples(
    request: TrainRequest,
    data: DataSpec,
    dataset: DatasetPin | None,
    config: AnyModelConfig,
    datasets: DatasetStore | None,
) -> None:
    """Samples need text in and out, and each prompt with its completion must fit the model."""
    # Imported when it runs, not above: see the module's docstring.
    from trainctl.store.data.pins import data_codec

    codec = data_codec(data, dataset, datasets)
    if codec is None:
        raise InvalidRequest(
            f"sample_every: the tokens of data source {data.source!r} come from no known "
            "tokenizer, so prompts cannot be encoded nor samples decoded; train on a dataset, "
            "stdlib or text, or leave sample_every out"
        )
    for i, prompt in enumerate(request.sample_prompts):
        try:
            check_context(
                len(codec.encode(prompt)), request.sample_settings.max_new_tokens,
                config.max_seq_len,
            )  # fmt: skip
        except InvalidRequest as exc:
            raise InvalidRequest(f"sample_prompts[{i}]: {exc}") from None


def _trackers(
    request: TrainRequest,
    default: Sequence[Tracker],
    mlflow_configured: bool,
    wandb_project: str | None,
    roots: list[Path],
) -> dict[str, Any]:
    """The trackers the run is mirrored to, the real folder of its TensorBoard files and its
    W&B project (pinned: every attempt logs to the same W&B run)."""
    # Imported when it runs, not above: see the module's docstring.
    from trainctl.store.data.paths import confine_path

    trackers = list(default) if request.trackers is None else request.trackers
    if "mlflow" in trackers and not mlflow_configured:
        raise InvalidRequest(
            f"trackers: 'mlflow' needs a tracking server, and this service has none: set "
            f"{MLFLOW_SETTING} (or leave 'mlflow' out)"
        )
    if "wandb" in trackers and wandb_project is None:
        raise InvalidRequest(
            f"trackers: 'wandb' needs a Weights & Biases project, and this service has none: "
            f"set {WANDB_SETTING} (or leave 'wandb' out)"
        )
    folder = request.tensorboard_dir
    if folder is not None:
        if "tensorboard" not in trackers:
            raise InvalidRequest("tensorboard_dir: the run has no 'tensorboard' tracker")
        real = confine_path(folder, roots, "tensorboard_dir")
        if not real.is_dir():
            raise InvalidRequest(f"tensorboard_dir: {folder!r} is not a folder")
        folder = str(real)
    if request.wandb_project is not None and "wandb" not in trackers:
        raise InvalidRequest("wandb_project: the run has no 'wandb' tracker")
    project = (request.wandb_project or wandb_project) if "wandb" in trackers else None
    return {"trackers": trackers, "tensorboard_dir": folder, "wandb_project": project}


def _node_range(nnodes: int | NodeRange) -> dict[str, Any]:
    """The plan's nnodes (the most), and an elastic gang's fewest and grace period."""
    if isinstance(nnodes, int) or nnodes.min == nnodes.max:
        return {"nnodes": nnodes if isinstance(nnodes, int) else nnodes.max}
    return {
        "nnodes": nnodes.max,
        "min_nnodes": nnodes.min,
        "shrink_after_seconds": nnodes.shrink_after_seconds,
    }


def world_sizes(nnodes: int | NodeRange, nproc_per_node: int) -> list[int]:
    """Every number of ranks the run may train on: one per number of nodes it may take."""
    low, high = (nnodes, nnodes) if isinstance(nnodes, int) else (nnodes.min, nnodes.max)
    return [n * nproc_per_node for n in range(low, high + 1)]


def _split_across_ranks(
    resolved: BatchPlan, requested: BatchSpec, ranks: TrainRequest
) -> BatchPlan:
    """Each of the nnodes x nproc_per_node ranks runs an equal share of a step's
    micro-batches, at every world size an elastic gang may take: the global batch stays the
    same when it shrinks or grows."""
    accum, worlds = resolved.grad_accum_steps, world_sizes(ranks.nnodes, ranks.nproc_per_node)
    uneven = [world for world in worlds if accum % world]
    if not uneven:
        return resolved
    every = math.lcm(*worlds)
    if requested.grad_accum_steps is not None:
        nodes = ranks.nnodes if isinstance(ranks.nnodes, int) else uneven[0] // ranks.nproc_per_node
        raise InvalidRequest(
            f"batch.grad_accum_steps {accum} does not split evenly across nnodes "
            f"{nodes} x nproc_per_node {ranks.nproc_per_node} = {uneven[0]} processes; "
            f"use a multiple of {every}"
        )
    return resolved.model_copy(update={"grad_accum_steps": -(-accum // every) * every})


def plan_train(request: TrainRequest, ctx: SubmitContext) -> TrainPlan:
    return resolve_train(
        request,
        cuda_available=ctx.cuda_available,
        data_roots=ctx.data_roots,
        checkpoints=ctx.checkpoints,
        datasets=ctx.datasets,
        default_trackers=ctx.default_trackers,
        mlflow_configured=ctx.mlflow_configured,
        wandb_project=ctx.wandb_project,
    )


# --- what it needs ----------------------------------------------------------------------------


def train_need(plan: TrainPlan, params: int | None = None) -> MemoryNeed:
    """A train run's need under its strategy; a replicated run of several ranks also gets its
    need under the first sharding strategy, which a refusal suggests. An elastic gang is
    measured at its fewest nodes, where each rank holds the largest shard."""
    world = (plan.min_nnodes or plan.nnodes) * plan.nproc_per_node
    chosen = PARALLEL_STRATEGIES.get(plan.parallelism.strategy)

    def under(shards_state: bool, reshard: bool) -> MemoryEstimate:
        shards = None
        if shards_state:
            accumulates = plan.batch.grad_accum_steps > world
            shards = Sharding(world, reshard, accumulates)
        return step_estimate(plan, plan.async_checkpoint, params, shards)

    estimate = under(chosen.shards_state, plan.parallelism.reshard_after_forward)
    sharding = next((s for s in PARALLEL_STRATEGIES if s.shards_state), None)
    sharded = None
    if not chosen.shards_state and world > 1 and sharding is not None:
        sharded = (sharding.name, under(True, True))
    what = "this train run"
    return MemoryNeed(estimate, plan.nproc_per_node, plan.device, what, plan.model.config, sharded)


def train_placement(plan: TrainPlan) -> Placement:
    """nnodes nodes of nproc_per_node GPUs (or CPU processes); as few as min_nnodes for an
    elastic gang."""
    return Placement(
        nnodes=plan.nnodes,
        gpus_per_node=plan.nproc_per_node if plan.device == "cuda" else 0,
        procs_per_node=plan.nproc_per_node,
        spread=plan.spread,
        min_nnodes=plan.min_nnodes,
        shrink_after_seconds=plan.shrink_after_seconds or 0.0,
    )


def train_parent(plan: TrainPlan) -> ForkPoint | None:
    return plan.fork_from


TRAIN = RunKind(
    name="train",
    request=TrainRequest,
    plan=TrainPlan,
    summary="Queue a train run; the stored spec is its plan, every default resolved.",
    resolve=Ref(f"{__name__}:plan_train"),
    placement=train_placement,
    memory=train_need,
    has_steps=True,
    executor="train",
    parent=train_parent,
)

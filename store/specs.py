"""Run requests: what a client may send, with bounds (docs/design/kinds.md, "Requests and plans").

A request holds only what a client may ask for; a field left out (or null) means "the
default", which `store.plans` decides when it turns the request into a plan. The API validates
request bodies with these models and publishes them in its OpenAPI schema. The pieces that a
request and its plan share (`OptimizerSpec`, `ScheduleSpec`, `DataSpec` and the `*Options`
bases) are defined here once and used by both.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import (
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    field_validator,
    model_validator,
)

from trainctl.store.checkpoints.manifests import FULL_LAYOUT
from trainctl.store.db.placement import Spread
from trainctl.store.exceptions import InvalidRequest
from trainctl.store.models.generation import GenerationSettings
from trainctl.store.models.hf import check_hf_fields
from trainctl.store.models.presets import BOUNDS, PRESETS, ModelConfig, get_preset
from trainctl.store.names import (
    BEST_TAG,
    EXPERIMENT_RULE,
    LATEST_REF,
    MAX_NAME_LENGTH,
    NAME_REGEX,
    NAME_RULE,
    ExperimentName,
    Name,
    is_valid_experiment,
    is_valid_name,
)
from trainctl.store.text import TextChecked
from trainctl.store.training.optim import (
    BUILT_IN_KINDS,
    DEFAULT_OPTIMIZER_KIND,
    OptimizerKindName,
)
from trainctl.store.training.optim import fields_read as optimizer_fields
from trainctl.store.training.parallelism import (
    BUILT_IN_STRATEGIES,
    DEFAULT_STRATEGY,
    PARALLEL_STRATEGIES,
    StrategyName,
)
from trainctl.store.training.parallelism import fields_read as strategy_fields
from trainctl.store.training.schedule import SchedulePhases

MAX_STEPS = 10_000_000
TARGET_TOKENS = 8_310_000_000  # the seed's pre-training budget: 8.31 B tokens
# Larger models than this are not something one node of this service trains: a request
# for one is a typo (or an attack), not a plan.
MAX_MODEL_PARAMS = 20_000_000_000
# The most GPUs one node has today (and CPU ranks beyond this only contend for cores).
MAX_NPROC_PER_NODE = 16
# Nodes one gang run may span (store.db.placement): each is one worker, claimed together.
MAX_NNODES = 64
# A run's priority: claims take the highest first, then the oldest (store.db.runs).
MAX_PRIORITY = 1000
MAX_RUN_ATTEMPTS = 100

DeviceChoice = Literal["auto", "cpu", "cuda"]
# The dtypes an export writes its weights in (store.checkpoints.exports,
# worker.checkpoints.exports).
ExportDtype = Literal["float32", "bfloat16"]
EXPORT_DTYPES: tuple[ExportDtype, ...] = get_args(ExportDtype)
# What a validation reads; the pattern cannot bound each name's length, so a validator does.
CHECKPOINT_REF_PATTERN = f"^(?:{LATEST_REF}|{BEST_TAG}|{NAME_REGEX}/{NAME_REGEX})$"
# A fork's starting point: another experiment's tag, or its latest step.
FORK_REF_PATTERN = f"^{NAME_REGEX}/{NAME_REGEX}$"
# Filled in by the server when it resolves a request; older clients echoed them back.
# `dataset`: a plan pins the dataset that data.dataset names (store.plans.DatasetPin).
# `datasets`: a plan pins the datasets of data.mixture (store.plans.TrainPlan.datasets).
SERVER_FILLED = ("model_config_resolved", "warnings", "dataset", "datasets")
# data.dataset: a name or a folder; never a pattern (the wildcards of store.data.paths), a NUL
# or a line break.
DATASET_REF_PATTERN = r"^[^*?\[\x00-\x1f]+$"
MAX_DATASET_REF_LENGTH = 4096
BYTES_TOKENIZER = "bytes"
# A data mixture (DataSpec.mixture): at least two datasets, at most this many. Weights are
# relative (normalised by their sum); the bound only keeps one from dwarfing float precision.
MAX_MIXTURE_SOURCES = 16
MAX_MIXTURE_WEIGHT = 1e6
MAX_FIELD_NAME_LENGTH = 256
# More tokenizing processes than this contend for memory bandwidth on any node there is.
MAX_PREPARE_WORKERS = 256
# Prompts of one sample run, and of a train run's samples (each one is decoded every time).
MAX_PROMPTS = 64
MAX_TRAIN_PROMPTS = 8
# A prompt is checked against the model's context at submit; this bounds the request itself.
MAX_PROMPT_CHARS = 1 << 20
MAX_PROMPT_TOKENS = 131_072  # the longest context (store.models.presets.BOUNDS)
TokenId = Annotated[StrictInt, Field(ge=0, lt=int(BOUNDS["vocab_size"][1]))]
"""A token id: below the largest vocabulary (the model's own is checked at submit)."""
# Where the service can mirror a train run's metrics (docs/design/sinks.md, "Metrics sinks").
Tracker = Literal["tensorboard", "mlflow"]
TRACKERS: tuple[Tracker, ...] = ("tensorboard", "mlflow")
MLFLOW_SETTING = "TRAINCTL_MLFLOW_URI"
# A folder named in a spec: no NUL, line break or other control character.
FOLDER_PATTERN = r"^[^\x00-\x1f]+$"


# Numbers and booleans are Strict*: a value must have the JSON type the schema publishes.
# Pydantic's lax mode reads `{"seed": false}` as a seed of 0, "5" as 5 and 1 as true; a user
# who sent the wrong type gets a 422 naming the field instead of a run they did not mean. An
# integer is still a valid float ("muon_lr": 1). Not `strict=True` on the models: that would
# also make the pydantic mypy plugin refuse dicts for nested models (`TrainRequest(data={...})`).
# Frozen: a request or a plan is a value; resolving makes a new one.
# TextChecked: every string in it can be written as UTF-8 (store.text).
class Spec(TextChecked):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def refuse_unread(self, reads: frozenset[str], what: str, name: str) -> None:
        """ValueError naming the fields sent that `reads` leaves out, a setting that would be
        silently ignored; those equal to their default pass (what a plan sent back as a
        request carries). `what` and `name` say what reads them: "optimizer kind", "adamw"."""
        defaults = {n: f.default for n, f in type(self).model_fields.items()}
        unread = sorted(
            n for n in self.model_fields_set if n not in reads and getattr(self, n) != defaults[n]
        )
        if unread:
            raise ValueError(
                f"{what} {name!r} does not read {', '.join(unread)}; remove "
                f"{'it' if len(unread) == 1 else 'them'}, or pick a {what.split()[-1]} that does"
            )


class Request(Spec):
    """A request body: refuses, by name, the fields only the server fills in.

    `priority` and `max_attempts` are about queueing the run, not running it: the run row
    keeps them (store.db.runs), the plan does not."""

    priority: StrictInt = Field(
        0,
        ge=-MAX_PRIORITY,
        le=MAX_PRIORITY,
        description="Claims take the highest priority first, then the oldest run.",
    )
    max_attempts: StrictInt | None = Field(
        None,
        ge=1,
        le=MAX_RUN_ATTEMPTS,
        description="Attempts before the run fails (a worker that dies or loses its lease "
        "ends an attempt); default: the service's TRAINCTL_MAX_ATTEMPTS.",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_server_fields(cls, data: Any) -> Any:
        sent = [name for name in SERVER_FILLED if isinstance(data, dict) and name in data]
        if sent:
            raise ValueError(
                f"{', '.join(sent)}: filled in by the server, not sent by clients; remove it "
                "from the request (the spec of the run, its plan, shows the value)"
            )
        return data


class ModelSpec(Spec):
    preset: str | None = Field(
        None,
        description=f"Named model preset ({', '.join(PRESETS.names())}); "
        "default: the device profile's preset.",
    )
    overrides: dict[str, Any] = Field(
        default_factory=dict,
        description='ModelConfig fields to change from the preset, e.g. {"n_layers": 4}.',
    )

    hf: dict[str, Any] | None = Field(
        None,
        description="A transformers causal-LM architecture built from scratch instead of a "
        "preset: its model_type and the config fields to change from its defaults, e.g. "
        '{"model_type": "qwen3", "hidden_size": 512, "num_hidden_layers": 8}. Values are JSON '
        "scalars or lists; nothing is downloaded, imported or executed (docs/models.md).",
    )

    plugin: dict[str, Any] | None = Field(
        None,
        description="A plug-in model an operator installed on the workers (docs/models.md): "
        '{"name": <registered name>, "config": {...}}; the config is handed to its builder '
        "and must give vocab_size and max_seq_len. Only registered names are built; the run "
        "waits until a live worker has the plug-in (GET /models lists them).",
    )

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, v: str | None) -> str | None:
        if v is not None:
            get_preset(v)  # raises UnknownPreset listing the valid names
        return v

    @field_validator("hf")
    @classmethod
    def _shipped_architecture(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if v is None else check_hf_fields(v)

    @field_validator("plugin")
    @classmethod
    def _plugin_by_name(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        # Imported here: store.models.plugin's config is a Spec of this module.
        from trainctl.store.models.plugin import check_plugin_request

        return None if v is None else check_plugin_request(v)

    @model_validator(mode="after")
    def _one_way_to_name_a_model(self) -> ModelSpec:
        named = [
            way
            for way, given in (
                ("preset (with overrides)", self.preset is not None or bool(self.overrides)),
                ("hf", self.hf is not None),
                ("plugin", self.plugin is not None),
            )
            if given
        ]
        if len(named) > 1:
            raise ValueError(
                f"{' and '.join(named)}: each names the whole model; give one of preset "
                "(with overrides), hf or plugin"
            )
        return self

    def config(self, default_preset: str) -> ModelConfig:
        cfg = get_preset(self.preset or default_preset).replace(**self.overrides)
        params = cfg.param_counts()["total"]
        if params > MAX_MODEL_PARAMS:
            raise InvalidRequest(
                f"model has {params:,} parameters, above the limit of {MAX_MODEL_PARAMS:,}"
            )
        return cfg


class BatchSpec(Spec):
    micro_batch_size: StrictInt | None = Field(
        None, ge=1, le=4096, description="Sequences per forward/backward pass."
    )
    grad_accum_steps: StrictInt | None = Field(
        None, ge=1, le=4096, description="Micro-batches accumulated per optimizer step."
    )
    seq_len: StrictInt | None = Field(
        None, ge=8, le=131_072, description="Tokens per sequence; at most the model's max."
    )


# The one definition of a run's optimizer settings: the worker builds its optimizers from
# these (worker.training.optim), the store estimates their memory (store.training.memory,
# store.training.optim).
class OptimizerSpec(Spec):
    """The optimizer kind, and the settings of its optimizers."""

    kind: OptimizerKindName = Field(
        DEFAULT_OPTIMIZER_KIND,
        description="The optimizer configuration: "
        + "; ".join(f"{k.name}: {k.description}" for k in BUILT_IN_KINDS)
        + ". A setting the kind does not read is refused, unless it has its default value.",
    )
    muon_lr: StrictFloat = Field(
        0.02,
        gt=0,
        le=10,
        description="Muon learning rate (before Muon's own shape adjustment, muon_adjust_lr_fn).",
    )
    muon_momentum: StrictFloat = Field(0.95, ge=0, lt=1, description="Muon (Nesterov) momentum.")
    muon_weight_decay: StrictFloat = Field(
        0.1, ge=0, le=1, description="Muon's decoupled weight decay of the hidden matrices."
    )
    muon_adjust_lr_fn: Literal["original", "match_rms_adamw"] = Field(
        "original",
        description="How Muon scales its lr by matrix shape (torch.optim.Muon): 'original' "
        "(Keller Jordan's max(1, A/B)^0.5, the one muon_lr 0.02 was tuned for) or "
        "'match_rms_adamw' (Moonshot's 0.2 sqrt(max(A, B))).",
    )
    adamw_lr: StrictFloat = Field(3e-4, gt=0, le=10, description="AdamW learning rate.")
    adamw_beta1: StrictFloat = Field(0.9, ge=0, lt=1, description="AdamW beta1.")
    adamw_beta2: StrictFloat = Field(0.95, ge=0, lt=1, description="AdamW beta2.")
    adamw_eps: StrictFloat = Field(1e-8, gt=0, le=1, description="AdamW epsilon.")
    adamw_weight_decay: StrictFloat = Field(
        0.1,
        ge=0,
        le=1,
        description="AdamW weight decay, of the matrices it trains only: vectors (norms, gains) "
        "are never decayed.",
    )
    grad_clip: StrictFloat = Field(
        1.0, ge=0, le=1e6, description="Global gradient-norm clip; 0 disables."
    )

    @model_validator(mode="after")
    def _kind_reads_every_setting(self) -> OptimizerSpec:
        self.refuse_unread(optimizer_fields(self.kind), "optimizer kind", self.kind)
        return self


class ParallelismSpec(Spec):
    # The docstring is the API schema's description, kept as it was published: the records it
    # names live in store/training/parallelism.py.
    """How the ranks of a multi-process run share the model (store.parallelism)."""

    strategy: StrategyName = Field(
        DEFAULT_STRATEGY,
        description="The data-parallel strategy: "
        + "; ".join(f"{s.name}: {s.description}" for s in BUILT_IN_STRATEGIES)
        + ". A setting the strategy does not read is refused, unless it has its default value.",
    )
    reshard_after_forward: StrictBool = Field(
        True,
        description="fsdp: free each block's gathered parameters after its forward and gather "
        "them again for its backward (less memory, one more all-gather per block); false "
        "keeps them from forward to backward.",
    )

    @model_validator(mode="after")
    def _strategy_reads_every_setting(self) -> ParallelismSpec:
        self.refuse_unread(strategy_fields(self.strategy), "parallelism strategy", self.strategy)
        return self


class ScheduleSpec(Spec):
    warmup_frac: StrictFloat = Field(0.01, ge=0, le=1, description="Fraction of steps warming up.")
    stable_frac: StrictFloat = Field(0.84, ge=0, le=1, description="Fraction of steps at full lr.")
    decay: Literal["linear", "cosine", "sqrt"] = Field(
        "linear", description="Shape of the final decay (sqrt: the 1-sqrt cooldown)."
    )
    min_lr_ratio: StrictFloat = Field(
        0.1, ge=0, le=1, description="lr factor at and after the end."
    )
    warmup_steps: StrictInt | None = Field(
        None,
        ge=0,
        le=MAX_STEPS,
        description="Warmup in absolute steps, instead of warmup_frac.",
    )
    decay_start: StrictInt | None = Field(
        None,
        ge=0,
        le=MAX_STEPS,
        description="The global step the decay starts at, instead of the end of "
        "warmup_frac + stable_frac; a fork's must be at or after its fork step.",
    )
    decay_steps: StrictInt | None = Field(
        None,
        ge=1,
        le=MAX_STEPS,
        description="Steps the decay lasts: from decay_start (it reaches min_lr_ratio at "
        "decay_start + decay_steps and holds there), or without decay_start the run's last "
        "decay_steps steps; default: from decay_start to the run's last step.",
    )

    @model_validator(mode="after")
    def _fractions_fit(self) -> ScheduleSpec:
        if self.warmup_frac + self.stable_frac > 1.0 + 1e-9:
            raise ValueError(
                f"warmup_frac + stable_frac must be <= 1, got "
                f"{self.warmup_frac} + {self.stable_frac}"
            )
        return self

    def phases(self, total_steps: int) -> SchedulePhases:
        """The schedule over a run of `total_steps`, in steps: the absolute fields where
        given, else the fractions. Raises InvalidRequest naming the field that does not fit."""
        fractions = SchedulePhases.of_fractions(total_steps, self.warmup_frac, self.stable_frac)
        warmup = fractions.warmup if self.warmup_steps is None else self.warmup_steps
        start, length = self.decay_start, self.decay_steps
        if start is None:
            start = fractions.decay_start if length is None else total_steps - length
        end = total_steps if length is None else start + length
        if start < 0:
            raise InvalidRequest(
                f"schedule.decay_steps {length} is beyond the run's steps ({total_steps})"
            )
        for name, value in (("warmup_steps", warmup), ("decay_start", start)):
            if value > total_steps:
                raise InvalidRequest(
                    f"schedule.{name} {value} is beyond the run's steps ({total_steps})"
                )
        if end > total_steps:
            raise InvalidRequest(
                f"schedule.decay_steps: decay_start {start} + decay_steps {end - start} = "
                f"{end} is beyond the run's steps ({total_steps})"
            )
        if warmup > start:
            raise InvalidRequest(
                f"schedule.decay_start {start} is before the end of warmup ({warmup} steps)"
            )
        return SchedulePhases(warmup, start, end)


DatasetRef = Annotated[
    str,
    Field(min_length=1, max_length=MAX_DATASET_REF_LENGTH, pattern=DATASET_REF_PATTERN),
]
"""A prepared dataset as a request names it: a name under the data dir's datasets/, or a
folder path with a '/' inside the data roots (store.data.paths.dataset_folder)."""


class MixtureSource(Spec):
    """One dataset of a data mixture and its share of the sequences."""

    dataset: DatasetRef = Field(
        description="A prepared dataset, named as data.dataset names one (a name under the "
        "data dir's datasets/, or a folder path with a '/' inside the data roots)."
    )
    weight: StrictFloat = Field(
        gt=0,
        le=MAX_MIXTURE_WEIGHT,
        description="Its share of the training sequences: its weight over the sum of the "
        "mixture's weights (0.7 and 0.3, or 7 and 3, alike).",
    )


class DataSpec(Spec):
    # A mixture is one more `source`, with its datasets in `mixture`, rather than a field
    # beside `source`: every reader of a run's data dispatches on `source` (submit's
    # resolution, data_tokenizer, bytes_per_token, the worker's build_data), so a mixture is
    # one more case of that one switch, and the fields each source takes are checked in one
    # place (_paths_match_source). {"mixture": [...]} without a source reads as source
    # "mixture", the short form a client writes.
    source: Literal["synthetic", "stdlib", "text", "shards", "dataset", "mixture"] = Field(
        "stdlib",
        description="synthetic: random tokens; stdlib: the Python standard library's source "
        "as byte-level text; text: files under the data roots as bytes; shards: .bin token "
        "shards (llm.c format) under the data roots; dataset: a prepared dataset (its "
        "dataset.json, train and val shards and tokenizer), named by `dataset`; mixture: "
        "prepared datasets of one tokenizer mixed by weight, named by `mixture` (the source "
        "to leave out when `mixture` is given).",
    )
    dataset: DatasetRef | None = Field(
        None,
        description="With source 'dataset': the name of a dataset under the data dir's "
        f"datasets/ folder (what POST /runs/prepare writes; {NAME_RULE}), or a path with a "
        "'/' to a dataset folder inside the data roots (absolute, or relative to the first "
        "root: './corpus'). No wildcards: a dataset is one folder.",
    )
    mixture: list[MixtureSource] | None = Field(
        None,
        min_length=2,
        max_length=MAX_MIXTURE_SOURCES,
        description=f"Source 'mixture': 2 to {MAX_MIXTURE_SOURCES} prepared datasets, each "
        'named once, with the same tokenizer, e.g. [{"dataset": "web", "weight": 0.7}, '
        '{"dataset": "code", "weight": 0.3}]. Each training sequence comes from one of '
        "them, chosen by a pure function of (seed, the sequence's global position) with "
        "probability weight / sum of weights; each dataset is read on from its own position. "
        "Validation reads the same mixture of their val splits; a fork continues the datasets "
        'it shares with its parent (docs/architecture.md, "Data mixtures").',
    )
    paths: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Files, folders or globs (text and shards); relative to the first data root.",
    )
    val_paths: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Held-out shards or files; default: the tail of the training data.",
    )
    val_fraction: StrictFloat = Field(
        0.05, gt=0, lt=0.5, description="Tail fraction held out when val_paths is empty."
    )
    max_bytes: StrictInt = Field(
        16_000_000, ge=1024, le=2**34, description="Cap on text bytes read (text, stdlib)."
    )
    seed: StrictInt = Field(
        0, ge=0, le=2**31 - 1, description="Seed of the batch order (and of a mixture's choices)."
    )

    @model_validator(mode="before")
    @classmethod
    def _mixture_is_its_source(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("mixture") is not None and "source" not in data:
            return {**data, "source": "mixture"}
        return data

    @field_validator("mixture")
    @classmethod
    def _each_dataset_once(cls, v: list[MixtureSource] | None) -> list[MixtureSource] | None:
        names = [s.dataset for s in v or []]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(
                f"name each dataset of a mixture once; {', '.join(map(repr, twice))} is named "
                "more than once (give it one entry with the weights added up)"
            )
        return v

    @model_validator(mode="after")
    def _paths_match_source(self) -> DataSpec:
        if self.source in ("text", "shards") and not self.paths:
            raise ValueError(f"data source {self.source!r} needs at least one entry in paths")
        if self.source in ("synthetic", "stdlib", "dataset", "mixture") and (
            self.paths or self.val_paths
        ):
            raise ValueError(f"data source {self.source!r} takes no paths")
        if self.source == "dataset" and self.dataset is None:
            raise ValueError("data source 'dataset' needs `dataset`: a dataset's name or folder")
        if self.source != "dataset" and self.dataset is not None:
            raise ValueError(f"data source {self.source!r} takes no dataset; source 'dataset' does")
        if self.source == "mixture" and self.mixture is None:
            raise ValueError(
                "data source 'mixture' needs `mixture`: its datasets and their weights"
            )
        if self.source != "mixture" and self.mixture is not None:
            raise ValueError(
                f"data source {self.source!r} takes no mixture; leave source out (or give "
                "'mixture') to train on a mixture"
            )
        return self

    def mixture_weights(self) -> list[float]:
        """The mixture's weights normalised by their sum: each dataset's share of sequences."""
        weights = [s.weight for s in self.mixture or []]
        return [w / sum(weights) for w in weights]


Prompt = Annotated[
    str,
    Field(min_length=1, max_length=MAX_PROMPT_CHARS, description="Text to continue."),
]


class CheckpointChoice(Spec):
    """The checkpoint a validate, sample, export or evaluate run reads, named as the client
    knows it; the plan pins it (store.plans.CheckpointRef)."""

    checkpoint: str = Field(
        LATEST_REF,
        pattern=CHECKPOINT_REF_PATTERN,
        max_length=2 * MAX_NAME_LENGTH + 1,
        description="'latest', 'best', or '<experiment>/<tag>'; with 'latest' or "
        f"'best', `experiment` narrows the search. The experiment is {EXPERIMENT_RULE}; "
        f"the tag {NAME_RULE}.",
    )
    experiment: ExperimentName | None = Field(
        None, description=f"Experiment for latest/best: a name of {EXPERIMENT_RULE}."
    )

    @field_validator("checkpoint")
    @classmethod
    def _checkpoint_ref(cls, v: str) -> str:
        parts = v.split("/")
        named = len(parts) == 2 and is_valid_experiment(parts[0]) and is_valid_name(parts[1])
        if v not in (LATEST_REF, BEST_TAG) and not named:
            raise ValueError(
                "checkpoint must be 'latest', 'best' or '<experiment>/<tag>': the experiment "
                f"{EXPERIMENT_RULE}, the tag {NAME_RULE}"
            )
        return v


# --- downstream evaluations: what an evaluate run and a train run's `evals` ask alike --------
# The task catalog that the names are checked against at submit is store.evals.tasks
# (docs/evals.md).

MAX_FEWSHOT = 25
"""The most few-shot examples a request may ask for (the harness's largest, ARC's 25)."""
MAX_LIMIT = 100_000
"""The most items per task a request may ask for: more than any task has (a limit above a
task's size takes all of it)."""
FEWSHOT_SEED = 1234
"""The harness's default fewshot_random_seed."""
MAX_TASK_NAME = 64
MAX_EVAL_TASKS = 64
"""The most tasks one evaluation names, each once: more than the catalog has (store.evals.tasks)."""
MAX_EVAL_BATCH_SIZE = 1024
EveryCheckpoint = Literal["checkpoint"]
EVERY_CHECKPOINT: EveryCheckpoint = "checkpoint"

TaskName = Annotated[
    str,
    Field(min_length=1, max_length=MAX_TASK_NAME, description="A task of GET /evals/tasks."),
]


class EvaluateOptions(Spec):
    """What an evaluation scores, as the request asks and the plan keeps it."""

    tasks: list[TaskName] = Field(
        min_length=1,
        max_length=MAX_EVAL_TASKS,
        description="The tasks to score the checkpoint on, by name (GET /evals/tasks), each once.",
    )
    limit: StrictInt | None = Field(
        None,
        ge=1,
        le=MAX_LIMIT,
        description="Score each task's first this many items (all of a task with fewer); "
        "default: every item.",
    )
    num_fewshot: StrictInt = Field(
        0,
        ge=0,
        le=MAX_FEWSHOT,
        description="Answered examples before each item, drawn as lm-evaluation-harness draws "
        "them (MMLU has 5 per subject).",
    )
    seed: StrictInt = Field(
        FEWSHOT_SEED,
        ge=0,
        le=2**31 - 1,
        description="Seed of the few-shot draw (the harness's fewshot_random_seed).",
    )
    batch_size: StrictInt = Field(
        32, ge=1, le=MAX_EVAL_BATCH_SIZE, description="Sequences per forward pass."
    )


class TrainEvals(EvaluateOptions):
    """Evaluate runs a train run queues as its checkpoints commit (docs/evals.md,
    "Evaluations during training"): each scores one checkpoint as POST /runs/evaluate would,
    with these fields."""

    every: EveryCheckpoint | Annotated[StrictInt, Field(ge=1, le=MAX_STEPS)] = Field(
        EVERY_CHECKPOINT,
        description="'checkpoint': evaluate every step_<N> checkpoint the run saves. A number "
        "of steps K, a multiple of checkpoint_every and at most `steps`: evaluate the "
        "checkpoints whose step is a multiple of K, and the last one (at `steps`).",
    )

    def due(self, step: int, steps: int) -> bool:
        """Whether the step checkpoint saved at `step` of a run of `steps` is evaluated."""
        if isinstance(self.every, int):
            return step % self.every == 0 or step == steps
        return True


# --- what a request and its plan share ------------------------------------------------------


class StepOptions(Spec):
    """How a training step updates the model: a train run's and a benchmark's alike."""

    optimizer: OptimizerSpec = Field(
        default_factory=OptimizerSpec,
        description="The optimizers and their settings: Muon + AdamW unless `kind` says otherwise.",
    )
    schedule: ScheduleSpec = Field(default_factory=ScheduleSpec, description="WSD schedule.")
    seed: StrictInt = Field(0, ge=0, le=2**31 - 1, description="Seed of the model initialisation.")


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
        "the service's TRAINCTL_MLFLOW_URI names). Null: the service's TRAINCTL_TRACKERS; "
        "[]: none. The run's event log stays the record: a tracker that is down never slows "
        "or fails the run, and gets what it missed when it is back.",
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
    nnodes: StrictInt = Field(
        1,
        ge=1,
        le=MAX_NNODES,
        description="Workers (nodes) the run spans, claimed together, each running "
        "nproc_per_node processes. nnodes > 1 needs the PostgreSQL run queue.",
    )
    parallelism: ParallelismSpec = Field(
        default_factory=ParallelismSpec,
        description="How the nnodes x nproc_per_node processes share the model: replicated "
        "(ddp, the default) or sharded (fsdp).",
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


class BenchmarkOptions(StepOptions):
    steps: StrictInt = Field(100, ge=1, le=100_000, description="Measured steps.")
    warmup_steps: StrictInt = Field(10, ge=0, le=10_000, description="Unmeasured steps first.")
    target_tokens: StrictInt = Field(
        TARGET_TOKENS, ge=1, le=10**15, description="Tokens the time estimate is for."
    )


class PrepareOptions(Spec):
    """How a prepare reads its inputs and writes its shards (store.data.prepare.prepare_dataset)."""

    text_field: str = Field(
        "text",
        min_length=1,
        max_length=MAX_FIELD_NAME_LENGTH,
        description="JSONL inputs: the field that holds each document's text.",
    )
    text_column: str = Field(
        "text",
        min_length=1,
        max_length=MAX_FIELD_NAME_LENGTH,
        description="Parquet inputs: the column that holds each document's text.",
    )
    val_fraction: StrictFloat = Field(
        0.05,
        ge=0,
        le=0.5,
        description="Fraction of the documents held out for validation, spread evenly "
        "(every 20th at 0.05); 0 holds none out.",
    )
    shard_tokens: StrictInt = Field(
        100_000_000,
        ge=1024,
        le=2**31 - 1,
        description="Tokens per shard file; the last shard of a split holds the rest.",
    )
    workers: StrictInt | None = Field(
        None,
        ge=1,
        le=MAX_PREPARE_WORKERS,
        description="Tokenizing processes; default: every core the worker may use. The "
        "shards are the same bytes whatever the number.",
    )
    strict: StrictBool = Field(
        False,
        description="Stop at the first malformed line, missing field, non-UTF-8 or oversized "
        "document (the run fails, naming its file and line) instead of skipping and counting "
        "it.",
    )
    max_document_bytes: StrictInt = Field(
        16 << 20,
        ge=1024,
        le=1 << 30,
        description="JSONL lines and Parquet values longer than this many bytes are skipped "
        "and counted (dataset.json's skipped.oversized), or stop the run with strict: a "
        "document is held whole to be parsed and tokenized, at about 30 times its size. Text "
        "files have no limit: they are read in pieces.",
    )


class ValidateOptions(Spec):
    data: DataSpec = Field(default_factory=DataSpec, description="Validation data.")
    batch_size: StrictInt = Field(4, ge=1, le=4096, description="Sequences per batch.")
    num_batches: StrictInt = Field(8, ge=1, le=100_000, description="Batches to average over.")

    @field_validator("data")
    @classmethod
    def _one_dataset(cls, v: DataSpec) -> DataSpec:
        if v.source == "mixture":
            raise ValueError(
                "a validate run reads one source, not a mixture: validate the checkpoint on "
                "each of the mixture's datasets (source 'dataset'), for a loss per dataset"
            )
        return v


# --- the requests ---------------------------------------------------------------------------


def check_fork_ref(field: str, ref: str) -> str:
    """A fork's starting point, `field`'s value: '<experiment>/<tag>' (ValueError otherwise)."""
    parts = ref.split("/")
    if not (len(parts) == 2 and is_valid_experiment(parts[0]) and is_valid_name(parts[1])):
        raise ValueError(
            f"{field} must be '<experiment>/<tag>': the experiment {EXPERIMENT_RULE}, "
            f"the tag {NAME_RULE} (or 'latest')"
        )
    return ref


class TrainRequest(TrainOptions, Request):
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


class PrepareRequest(PrepareOptions, Request):
    name: Name = Field(
        description="The dataset's name: it is written to the data dir's datasets/<name>, and "
        "train and validate runs name it so (data.dataset). A name in use, or being prepared, "
        "is a 409."
    )
    inputs: list[str] = Field(
        min_length=1,
        max_length=256,
        description="Files, folders or globs inside the data roots (relative to the first): "
        "text files, JSONL (.jsonl, .jsonl.gz, .jsonl.zst) and Parquet (.parquet). Folders "
        "are read in name order, their hidden files skipped.",
    )
    tokenizer: str = Field(
        BYTES_TOKENIZER,
        min_length=1,
        max_length=MAX_DATASET_REF_LENGTH,
        pattern=DATASET_REF_PATTERN,
        description="'bytes' (a token is a byte), or a tokenizer.json inside the data roots "
        "(or a folder holding one; relative to the first root), as `trainctl data tokenizer "
        "train` writes it. It is copied into the dataset.",
    )


class ValidateRequest(ValidateOptions, CheckpointChoice, Request):
    seq_len: StrictInt | None = Field(None, ge=8, le=131_072, description="Default: profile's.")
    device: DeviceChoice = Field("auto", description="Where to run.")


class SampleRequest(CheckpointChoice, Request):
    prompts: list[Prompt] | None = Field(
        None,
        min_length=1,
        max_length=MAX_PROMPTS,
        description="Texts to continue, encoded with the checkpoint's tokenizer (a byte-level "
        "checkpoint's: UTF-8 bytes). A checkpoint that records no tokenizer takes "
        "`prompt_tokens` instead.",
    )
    prompt_tokens: list[list[TokenId]] | None = Field(
        None,
        min_length=1,
        max_length=MAX_PROMPTS,
        description="Token ids to continue, one list per prompt, each id below the model's "
        "vocab_size; the completions are token ids then (and text too where the checkpoint's "
        "tokenizer is known).",
    )
    generation: GenerationSettings = Field(
        default_factory=GenerationSettings, description="How to sample, where to stop."
    )
    device: DeviceChoice = Field("auto", description="Where to run.")

    @model_validator(mode="after")
    def _one_kind_of_prompt(self) -> SampleRequest:
        if (self.prompts is None) == (self.prompt_tokens is None):
            raise ValueError("give either prompts (text) or prompt_tokens (token ids), not both")
        for ids in self.prompt_tokens or []:
            if not 1 <= len(ids) <= MAX_PROMPT_TOKENS or min(ids) < 0:
                raise ValueError(
                    f"each of prompt_tokens must hold 1 to {MAX_PROMPT_TOKENS:,} token ids, "
                    "none negative"
                )
        return self


class ExportRequest(CheckpointChoice, Request):
    format: Literal["hf"] = Field(
        "hf",
        description="hf: a Hugging Face transformers folder (config.json, model.safetensors, "
        "generation_config.json, tokenizer files, a model card) that "
        "AutoModelForCausalLM.from_pretrained loads without trust_remote_code.",
    )
    dtype: ExportDtype = Field(
        "float32",
        description=f"The weights' dtype in model.safetensors: {' or '.join(EXPORT_DTYPES)}.",
    )

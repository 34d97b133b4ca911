"""Run requests: what a client may send, with bounds (docs/design/kinds.md, "Requests and plans");
the parts the kinds' requests share.

A request holds only what a client may ask for; a field left out (or null) means "the
default", which the kind's resolver decides when it turns the request into a plan. The API
validates request bodies with these models and publishes them in its OpenAPI schema. Each
kind's request is in its module of store/kinds/; the pieces that several requests, or a request
and its plan, share (`Spec`, `Request`, `ModelSpec`, `ScheduleSpec`, `DataSpec`,
`CheckpointChoice` and the shared `*Options` bases) are defined here once and used by all;
`OptimizerSpec` and `ParallelismSpec` live next to the records of the kinds they choose among
(store.training.optim, store.training.parallelism).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import (
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    field_validator,
    model_validator,
)

from trainctl.store.backends.slurm import SlurmOptions
from trainctl.store.exceptions import InvalidRequest
from trainctl.store.models.hf import check_hf_fields
from trainctl.store.models.presets import PRESETS, ModelConfig, get_preset
from trainctl.store.names import (
    BEST_TAG,
    EXPERIMENT_RULE,
    LATEST_REF,
    MAX_NAME_LENGTH,
    NAME_REGEX,
    NAME_RULE,
    ExperimentName,
    is_valid_experiment,
    is_valid_name,
)
from trainctl.store.text import TextChecked
from trainctl.store.training.optim import OptimizerSpec
from trainctl.store.training.schedule import SchedulePhases

MAX_STEPS = 10_000_000
# Larger models than this are not something one node of this service trains: a request
# for one is a typo (or an attack), not a plan.
MAX_MODEL_PARAMS = 20_000_000_000
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
# Filled in by the server when it resolves a request; older clients echoed them back.
# `dataset`: a plan pins the dataset that data.dataset names (store.plans.DatasetPin).
# `datasets`: a plan pins the datasets of data.mixture (store.kinds.train.TrainPlan.datasets).
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
# A prompt is checked against the model's context at submit; this bounds the request itself.
MAX_PROMPT_CHARS = 1 << 20
# Where the service can mirror a train run's metrics (docs/design/sinks.md, "Metrics sinks").
Tracker = Literal["tensorboard", "mlflow", "wandb"]
TRACKERS: tuple[Tracker, ...] = ("tensorboard", "mlflow", "wandb")
MLFLOW_SETTING = "TRAINCTL_MLFLOW_URI"
WANDB_SETTING = "TRAINCTL_WANDB_PROJECT"


# Numbers and booleans are Strict*: a value must have the JSON type the schema publishes.
# Pydantic's lax mode reads `{"seed": false}` as a seed of 0, "5" as 5 and 1 as true; a user
# who sent the wrong type gets a 422 naming the field instead of a run they did not mean. An
# integer is still a valid float ("muon_lr": 1). Not `strict=True` on the models: that would
# also make the pydantic mypy plugin refuse dicts for nested models (`TrainRequest(data={...})`).
# Frozen: a request or a plan is a value; resolving makes a new one.
# TextChecked: every string in it can be written as UTF-8 (store.text).
class Spec(TextChecked):
    model_config = ConfigDict(extra="forbid", frozen=True)


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
    slurm: SlurmOptions | None = Field(
        None,
        description="Where Slurm may run it (partition, account, time limit, ...), on a "
        "service that launches runs as Slurm jobs (TRAINCTL_BACKEND=slurm); refused "
        "elsewhere. Unset fields: the service's TRAINCTL_SLURM_* defaults.",
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

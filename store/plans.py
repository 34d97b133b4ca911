"""Plans: what a worker runs, every default decided (docs/design/kinds.md, "Requests and
plans").

A plan is frozen and has no optional field the worker must default; the run row stores it and
`GET /runs/{id}` shows it. `store.resolve` makes plans from requests at submit time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol

from pydantic import Discriminator, Field, StrictInt, Tag

from trainctl.store.checkpoints.info import (
    TokenizerId,
)
from trainctl.store.models.generation import GenerationSettings
from trainctl.store.models.hf_config import HfModelConfig, model_tag
from trainctl.store.models.plugin import PluginModelConfig
from trainctl.store.models.presets import ModelConfig
from trainctl.store.names import Name
from trainctl.store.specs import (
    BenchmarkOptions,
    DataSpec,
    ExportDtype,
    PrepareOptions,
    Spec,
    StepOptions,
    Tracker,
    TrainOptions,
    ValidateOptions,
)

if TYPE_CHECKING:  # datasets read shards with numpy, which the light client has not
    from trainctl.store.data.datasets import Dataset

Device = Literal["cpu", "cuda"]
BENCHMARK_EXPERIMENT = "benchmark"
"""Benchmarks write no checkpoints; their runs are filed under this experiment name."""


# Tagged by the shape of the value: a transformers config names its model_type, a
# plug-in's its plugin.
ConfigOfModel = Annotated[
    Annotated[ModelConfig, Tag("gpt")]
    | Annotated[HfModelConfig, Tag("hf")]
    | Annotated[PluginModelConfig, Tag("plugin")],
    Discriminator(model_tag),
]


# --- the plans ------------------------------------------------------------------------------


class ModelPlan(Spec):
    preset: str | None = Field(
        description="The preset the model started from; null for hf and plugin."
    )
    overrides: dict[str, Any] = Field(description="The request's changes to the preset.")
    hf: dict[str, Any] | None = Field(
        None, description="The request's transformers architecture, as it was sent."
    )
    plugin: dict[str, Any] | None = Field(
        None, description="The request's plug-in model (name and config), as it was sent."
    )
    config: ConfigOfModel = Field(description="The full model config that runs.")


class BatchPlan(Spec):
    micro_batch_size: StrictInt = Field(ge=1, description="Sequences per forward pass.")
    grad_accum_steps: StrictInt = Field(ge=1, description="Micro-batches per optimizer step.")
    seq_len: StrictInt = Field(ge=1, description="Tokens per sequence.")

    @property
    def tokens_per_step(self) -> int:
        return self.micro_batch_size * self.grad_accum_steps * self.seq_len


class CheckpointRef(Spec):
    """A checkpoint pinned at submit time; queued and running runs protect it."""

    experiment: Name
    tag: Name

    def __str__(self) -> str:
        return f"{self.experiment}/{self.tag}"


class ForkPoint(Spec):
    """Where a fork starts (docs/design/forks.md, "Forks"): its parent's checkpoint, pinned at
    submit, the step it holds, and the run that saved it (its lineage)."""

    checkpoint: CheckpointRef = Field(description="The parent checkpoint, pinned.")
    step: StrictInt = Field(ge=0, description="The step the checkpoint holds: the fork's first.")
    run_id: str | None = Field(
        description="The run that saved it; null where its metadata names none."
    )


class TokenizerPin(Spec):
    kind: Literal["bytes", "bpe"] = Field(
        description="bytes: a token is a byte; bpe: the dataset's tokenizer.json."
    )
    sha256: str | None = Field(description="Of its tokenizer.json; null for bytes.")
    eot_id: int | None = Field(description="The end-of-text token between documents.")

    @property
    def id(self) -> TokenizerId:
        return TokenizerId(self.kind, self.sha256)


class DatasetPin(Spec):
    """A dataset as submit read its dataset.json (`store.data.datasets.Dataset.identity`); a worker
    that finds the folder saying otherwise fails the run rather than train on other data."""

    folder: str = Field(description="The dataset's folder (its real path).")
    tokenizer: TokenizerPin = Field(description="The tokenizer its shards were encoded with.")
    vocab_size: StrictInt = Field(ge=1, description="Token ids are below this.")
    bytes_per_token: float = Field(
        gt=0, description="UTF-8 bytes of text per token: what turns a loss into bits per byte."
    )

    @classmethod
    def of(cls, dataset: Dataset) -> DatasetPin:
        return cls.model_validate(dataset.identity())


BYTE_TOKENS = TokenizerId("bytes", None)


def data_tokenizer(data: DataSpec, dataset: DatasetPin | None) -> TokenizerId | None:
    """The tokenizer of a run's data; None where nobody knows (synthetic tokens, bare shards).
    A mixture's is that of its datasets (one, checked at submit): pass its first's pin."""
    if dataset is not None:
        return dataset.tokenizer.id
    return BYTE_TOKENS if data.source in ("stdlib", "text") else None


def bytes_per_token(
    data: DataSpec, dataset: DatasetPin | None, mixture: Sequence[DatasetPin] = ()
) -> float | None:
    """Text bytes per token of a run's data (1 for byte-level text), where it is known. A
    mixture's is its datasets' weighted by their shares of the sequences (which all hold
    seq_len tokens): the expected bytes of a token of the mixture."""
    if mixture:
        shares = data.mixture_weights()
        return sum(w * d.bytes_per_token for w, d in zip(shares, mixture, strict=True))
    if dataset is not None:
        return dataset.bytes_per_token
    return 1.0 if data.source in ("stdlib", "text") else None


class StepPlan(StepOptions):
    """What one training step needs: train runs and benchmarks build it alike."""

    device: Device
    model: ModelPlan
    batch: BatchPlan


class TrainPlan(TrainOptions, StepPlan):
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


class BenchmarkPlan(BenchmarkOptions, StepPlan):
    warnings: list[str] = Field(description="What makes the figures less comparable.")

    @property
    def filed_under(self) -> str:
        return BENCHMARK_EXPERIMENT

    @property
    def depends_on(self) -> CheckpointRef | None:
        return None


class ReadsCheckpoint(Spec):
    """A run that reads one checkpoint (validate, sample, export, evaluate): filed under its
    experiment, and protected from deletion while the run is queued or running."""

    checkpoint: CheckpointRef = Field(description="The checkpoint the run reads, pinned.")
    model: ConfigOfModel = Field(description="Its model config, from its metadata.")

    @property
    def filed_under(self) -> str:
        return self.checkpoint.experiment

    @property
    def depends_on(self) -> CheckpointRef | None:
        return self.checkpoint


class ValidatePlan(ValidateOptions, ReadsCheckpoint):
    dataset: DatasetPin | None = Field(description="The dataset data.dataset names, pinned.")
    seq_len: StrictInt = Field(ge=1, description="Tokens per sequence.")
    device: Device


class PreparePlan(PrepareOptions):
    name: Name = Field(description="The dataset's name.")
    inputs: list[str] = Field(description="The input files, expanded and confined.")
    tokenizer: str = Field(description="'bytes', or the real path of the tokenizer.json.")
    output: str = Field(description="The dataset's folder: <data dir>/datasets/<name>.")

    @property
    def filed_under(self) -> str:
        return self.name

    @property
    def depends_on(self) -> CheckpointRef | None:
        return None


class SamplePlan(ReadsCheckpoint):
    tokenizer: TokenizerPin | None = Field(
        description="The checkpoint's tokenizer; null where it records none (token ids only)."
    )
    prompts: list[str] | None = Field(description="The prompts as sent, if text.")
    prompt_tokens: list[list[StrictInt]] = Field(description="Each prompt's token ids.")
    generation: GenerationSettings = Field(description="How to sample, where to stop.")
    device: Device


class ExportPlan(ReadsCheckpoint):
    format: Literal["hf"] = Field(description="hf: a Hugging Face transformers folder.")
    dtype: ExportDtype = Field(description="The exported weights' dtype.")
    output: str = Field(
        description="Where the export goes, in the exports store's words: its folder "
        "(<data dir>/exports/<experiment>/<tag>) or its place in the bucket (s3://...)."
    )


class Plan(Protocol):
    """What every kind's plan has (store.kinds.registry): where its run is listed, the checkpoint it
    pins, and its stored form."""

    @property
    def filed_under(self) -> str: ...

    @property
    def depends_on(self) -> CheckpointRef | None: ...

    def model_dump(self, *, mode: str = "python") -> dict[str, Any]: ...

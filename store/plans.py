"""Plans: what a worker runs, every default decided (docs/design/kinds.md, "Requests and
plans").

A plan is frozen and has no optional field the worker must default; the run row stores it and
`GET /runs/{id}` shows it. Each kind's resolver makes its plans from its requests at submit
time; each kind's plan is in its module of store/kinds/, and the parts several plans share
are here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol

from pydantic import Discriminator, Field, StrictInt, Tag

from trainctl.store.checkpoints.info import TokenizerId
from trainctl.store.models.hf_config import HfModelConfig, model_tag
from trainctl.store.models.plugin import PluginModelConfig
from trainctl.store.models.presets import ModelConfig
from trainctl.store.names import Name
from trainctl.store.specs import DataSpec, Spec, StepOptions

if TYPE_CHECKING:  # datasets read shards with numpy, which the light client has not
    from trainctl.store.data.datasets import Dataset

Device = Literal["cpu", "cuda"]


# Tagged by the shape of the value: a transformers config names its model_type, a
# plug-in's its plugin.
ConfigOfModel = Annotated[
    Annotated[ModelConfig, Tag("gpt")]
    | Annotated[HfModelConfig, Tag("hf")]
    | Annotated[PluginModelConfig, Tag("plugin")],
    Discriminator(model_tag),
]


# --- the parts of plans ----------------------------------------------------------------------


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


class Plan(Protocol):
    """What every kind's plan has (store.kinds.registry): where its run is listed, the checkpoint it
    pins, and its stored form."""

    @property
    def filed_under(self) -> str: ...

    @property
    def depends_on(self) -> CheckpointRef | None: ...

    def model_dump(self, *, mode: str = "python") -> dict[str, Any]: ...

"""Optimizer kinds: one record each, what the store knows of an optimizer configuration, and
`OptimizerSpec`, a request's choice of one with its settings (docs/design/training.md,
"Optimizers").

A request picks a kind with `optimizer.kind`. The record says, without torch, what the rest of
the store asks of it: the settings its builder reads, as a model of their own next to the
record (`settings`: a request that sets another one is refused, rather than that setting
silently ignored), and how many tensors of state it keeps per parameter, from which
`store.training.memory` estimates a run's memory. The worker builds the optimizers of a kind
from the builder registered under the same name (`worker.training.optim.OPTIMIZER_BUILDERS`):
named optimizers, each over the parameters its kind's rule gives it, from the kind's settings.
A new kind is a record here and a builder there, or a plug-in's, declared under the entry-point
groups `trainctl.optimizer_kinds` and `trainctl.optimizers`; a plug-in's settings model brings
its own fields (store.training.choice).

Metrics name each optimizer's learning rate `lr/<optimizer name>` (`lr/muon`, `lr/adamw`).
Event logs from before optimizers had names hold `lr_muon` and `lr_adamw`: readers see those
under the new names (`current_metric_names`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, StrictFloat

from trainctl.store.registry import RegisteredName, Registry
from trainctl.store.training.choice import KindChoice, KindSettings

FLOAT32_BYTES = 4
DEFAULT_OPTIMIZER_KIND = "muon_adamw"


# --- the built-in kinds' settings ------------------------------------------------------------


class MuonSettings(KindSettings):
    """Muon's settings (torch.optim.Muon, worker.training.sharded_muon.ShardedMuon)."""

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


class AdamWSettings(KindSettings):
    """AdamW's settings: kind `adamw` reads these."""

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


# The bases' order is the fields' (pydantic collects them from the last base to the first):
# Muon's, then AdamW's, as the API schema has always listed them.
class MuonAdamWSettings(AdamWSettings, MuonSettings):
    """Kind `muon_adamw` reads Muon's settings and AdamW's."""


# --- the records -----------------------------------------------------------------------------


@dataclass(frozen=True)
class OptimizerKind:
    """Everything the store needs to know of one optimizer configuration."""

    name: str
    """The kind's name: a request's `optimizer.kind`."""
    description: str
    """What it trains with, in words (the API docs list it)."""
    settings: type[KindSettings]
    """The settings its builder reads, with their bounds and descriptions: the model its
    builder receives. A field of a built-in kind's model is an `OptimizerSpec` field; any
    other (a plug-in's own) is sent beside them (store.training.choice)."""
    state_per_param: int
    """fp32 tensors of optimizer state kept per parameter, at most (AdamW: 2 moments)."""

    @property
    def reads(self) -> frozenset[str]:
        """The `OptimizerSpec` fields its builder reads, besides the common ones (`kind`,
        `grad_clip`)."""
        return frozenset(self.settings.model_fields)

    @property
    def bytes_per_param(self) -> int:
        """Bytes a trained parameter costs: fp32 master weight, gradient and state."""
        return FLOAT32_BYTES * (1 + 1 + self.state_per_param)

    @property
    def staged_bytes_per_param(self) -> int:
        """Bytes a parameter costs in a checkpoint's host copy: weight and state."""
        return FLOAT32_BYTES * (1 + self.state_per_param)


OPTIMIZER_KINDS: Registry[OptimizerKind] = Registry(
    "optimizer kind", group="trainctl.optimizer_kinds"
)

OptimizerKindName = Annotated[str, RegisteredName(OPTIMIZER_KINDS)]
"""An optimizer kind's name: the registered ones, published in the schema as an enum."""

BUILT_IN_KINDS = (
    OptimizerKind(
        name="muon_adamw",
        description="Muon for the hidden 2-D matrices, AdamW for the embedding (and so the "
        "tied head), norms and gains",
        settings=MuonAdamWSettings,
        # AdamW keeps two moments, Muon one momentum buffer: two bound both.
        state_per_param=2,
    ),
    OptimizerKind(
        name="adamw",
        description="AdamW for every parameter (matrices decayed, vectors not): the baseline "
        "Muon is compared against",
        settings=AdamWSettings,
        state_per_param=2,
    ),
)
for _kind in BUILT_IN_KINDS:
    OPTIMIZER_KINDS.register(_kind.name, _kind)


# --- the request's choice --------------------------------------------------------------------


class OptimizerChoice(KindChoice):
    """The choice of kind: a base of `OptimizerSpec` so that `kind` is its first field."""

    choice: ClassVar[str] = "kind"
    kinds: ClassVar[Registry[OptimizerKind]] = OPTIMIZER_KINDS
    what: ClassVar[str] = "optimizer kind"

    kind: OptimizerKindName = Field(
        DEFAULT_OPTIMIZER_KIND,
        description="The optimizer configuration: "
        + "; ".join(f"{k.name}: {k.description}" for k in BUILT_IN_KINDS)
        + ". A setting the kind does not read is refused, unless it has its default value.",
    )


# The one definition of a run's optimizer settings: the worker builds its optimizers from
# these (worker.training.optim, through `settings()`), the store estimates their memory
# (store.training.memory). Its bases are every built-in kind's settings (a test checks), whose
# fields are its own.
class OptimizerSpec(MuonAdamWSettings, AdamWSettings, OptimizerChoice):
    """The optimizer kind, and the settings of its optimizers."""

    model_config = ConfigDict(extra="allow", frozen=True)

    grad_clip: StrictFloat = Field(
        1.0, ge=0, le=1e6, description="Global gradient-norm clip; 0 disables."
    )


# --- metric names ---------------------------------------------------------------------------

LR_PREFIX = "lr/"
LEGACY_METRIC_NAMES = {"lr_muon": "lr/muon", "lr_adamw": "lr/adamw"}
"""Train metrics written before optimizers were named, and their names now."""


def lr_metric(optimizer: str) -> str:
    """The metric of one named optimizer's learning rate: `lr/muon`."""
    return f"{LR_PREFIX}{optimizer}"


def current_metric_names(data: dict[str, Any]) -> dict[str, Any]:
    """A metrics event's data with the names of old event logs replaced by today's."""
    if not LEGACY_METRIC_NAMES.keys() & data.keys():
        return data
    return {LEGACY_METRIC_NAMES.get(k, k): v for k, v in data.items()}

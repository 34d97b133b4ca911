"""Optimizer kinds: one record each, what the store knows of an optimizer configuration
(docs/design/training.md, "Optimizers").

A request picks one with `optimizer.kind`. The record says, without torch, what the rest of
the store asks of it: which `OptimizerSpec` fields the kind reads (a request that sets
another one is refused, rather than that setting silently ignored) and how many tensors of
state it keeps per parameter, from which `store.training.memory` estimates a run's memory. The
worker builds the optimizers of a kind from the builder registered under the same name
(`worker.training.optim.OPTIMIZER_BUILDERS`): named optimizers, each over the parameters its kind's
rule gives it. A new kind is a record here and a builder there, or a plug-in's, declared under
the entry-point groups `trainctl.optimizer_kinds` and `trainctl.optimizers`.

Metrics name each optimizer's learning rate `lr/<optimizer name>` (`lr/muon`, `lr/adamw`).
Event logs from before optimizers had names hold `lr_muon` and `lr_adamw`: readers see those
under the new names (`current_metric_names`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from trainctl.store.registry import RegisteredName, Registry

FLOAT32_BYTES = 4
COMMON_FIELDS = frozenset({"kind", "grad_clip"})
"""The `OptimizerSpec` fields every kind reads: the clip is the training step's, not an
optimizer's."""
DEFAULT_OPTIMIZER_KIND = "muon_adamw"


@dataclass(frozen=True)
class OptimizerKind:
    """Everything the store needs to know of one optimizer configuration."""

    name: str
    """The kind's name: a request's `optimizer.kind`."""
    description: str
    """What it trains with, in words (the API docs list it)."""
    reads: frozenset[str]
    """The `OptimizerSpec` fields its builder reads, besides `COMMON_FIELDS`."""
    state_per_param: int
    """fp32 tensors of optimizer state kept per parameter, at most (AdamW: 2 moments)."""

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

MUON_FIELDS = frozenset({"muon_lr", "muon_momentum", "muon_weight_decay", "muon_adjust_lr_fn"})
ADAMW_FIELDS = frozenset(
    {"adamw_lr", "adamw_beta1", "adamw_beta2", "adamw_eps", "adamw_weight_decay"}
)

BUILT_IN_KINDS = (
    OptimizerKind(
        name="muon_adamw",
        description="Muon for the hidden 2-D matrices, AdamW for the embedding (and so the "
        "tied head), norms and gains",
        reads=MUON_FIELDS | ADAMW_FIELDS,
        # AdamW keeps two moments, Muon one momentum buffer: two bound both.
        state_per_param=2,
    ),
    OptimizerKind(
        name="adamw",
        description="AdamW for every parameter (matrices decayed, vectors not): the baseline "
        "Muon is compared against",
        reads=ADAMW_FIELDS,
        state_per_param=2,
    ),
)
for _kind in BUILT_IN_KINDS:
    OPTIMIZER_KINDS.register(_kind.name, _kind)


def fields_read(kind: str) -> frozenset[str]:
    """Every `OptimizerSpec` field optimizer kind `kind` reads."""
    return OPTIMIZER_KINDS.get(kind).reads | COMMON_FIELDS


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

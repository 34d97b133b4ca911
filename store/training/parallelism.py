"""Data-parallel strategies: one record each, what the store knows of how a multi-process
train run shares its model, and `ParallelismSpec`, a request's choice of one with its settings
(docs/design/training.md, "Multi-GPU and multi-node").

A request picks one with `parallelism.strategy`. The record says, without torch, what the
rest of the store asks of it: the settings it reads, as a model of their own next to the
record (`settings`: a request that sets another one is refused, rather than the setting
silently ignored; store.training.choice) and how it divides a rank's memory
(`store.training.memory`). The worker runs a strategy with the builder registered under the
same name (`worker.training.parallelism.STRATEGY_BUILDERS`), from the strategy's settings.

- `ddp`: every rank holds the whole model, its gradients and its optimizer state; the
  gradients are averaged (all-reduced) once per step.
- `fsdp`: FSDP2 (`fully_shard`) per transformer block and the root: each of the W ranks holds
  1/W of the parameters, gradients and optimizer state, and gathers a block's full parameters
  only while it computes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

from pydantic import ConfigDict, Field, StrictBool

from trainctl.store.checkpoints.manifests import DCP_LAYOUT, FULL_LAYOUT
from trainctl.store.registry import RegisteredName, Registry
from trainctl.store.training.choice import KindChoice, KindSettings

DEFAULT_STRATEGY = "ddp"


class DDPSettings(KindSettings):
    """ddp reads no setting of its own."""


class FSDPSettings(KindSettings):
    """fsdp's settings (worker.training.fsdp)."""

    reshard_after_forward: StrictBool = Field(
        True,
        description="fsdp: free each block's gathered parameters after its forward and gather "
        "them again for its backward (less memory, one more all-gather per block); false "
        "keeps them from forward to backward.",
    )


@dataclass(frozen=True)
class ParallelStrategy:
    """Everything the store needs to know of one data-parallel strategy."""

    name: str
    """The strategy's name: a request's `parallelism.strategy`."""
    description: str
    """What it does, in words (the API docs list it)."""
    settings: type[KindSettings]
    """The settings it reads, with their bounds and descriptions: the model its builder
    receives (store.training.choice)."""
    shards_state: bool
    """True: parameters, gradients and optimizer state are split across the ranks, and each
    block's parameters are gathered while it runs (`store.training.memory.estimate_peak`)."""
    runs_alone_on_rank_0: bool = True
    """Whether rank 0 may run the model by itself (a training sample): not when every
    forward is a collective of all ranks."""
    checkpoint_layout: str = FULL_LAYOUT
    """How its checkpoints hold the state (the manifest's `layout`): `full`, written by rank
    0 from whole tensors, or `dcp`, every rank writing its own shards (docs/design/checkpoints.md,
    "Sharded checkpoints")."""

    @property
    def reads(self) -> frozenset[str]:
        """The `ParallelismSpec` fields it reads, besides `strategy`."""
        return frozenset(self.settings.model_fields)

    def shard_count(self, world: int) -> int:
        """Into how many parts a rank's weights, gradients and optimizer state are split."""
        return world if self.shards_state else 1


PARALLEL_STRATEGIES: Registry[ParallelStrategy] = Registry(
    "parallel strategy", group="trainctl.parallel_strategies"
)

StrategyName = Annotated[str, RegisteredName(PARALLEL_STRATEGIES)]
"""A strategy's name: the registered ones, published in the schema as an enum."""

BUILT_IN_STRATEGIES = (
    ParallelStrategy(
        name="ddp",
        description="DistributedDataParallel: every rank holds the whole model and optimizer "
        "state, gradients are all-reduced once per step",
        settings=DDPSettings,
        shards_state=False,
    ),
    ParallelStrategy(
        name="fsdp",
        description="FSDP2 (fully_shard per transformer block and the root): parameters, "
        "gradients and optimizer state are split across the nnodes x nproc_per_node ranks, "
        "a block's full parameters gathered only while it runs",
        settings=FSDPSettings,
        shards_state=True,
        runs_alone_on_rank_0=False,
        checkpoint_layout=DCP_LAYOUT,
    ),
)
for _strategy in BUILT_IN_STRATEGIES:
    PARALLEL_STRATEGIES.register(_strategy.name, _strategy)


class StrategyChoice(KindChoice):
    """The choice of strategy: a base of `ParallelismSpec` so that `strategy` is its first
    field."""

    choice: ClassVar[str] = "strategy"
    kinds: ClassVar[Registry[ParallelStrategy]] = PARALLEL_STRATEGIES
    what: ClassVar[str] = "parallelism strategy"

    strategy: StrategyName = Field(
        DEFAULT_STRATEGY,
        description="The data-parallel strategy: "
        + "; ".join(f"{s.name}: {s.description}" for s in BUILT_IN_STRATEGIES)
        + ". A setting the strategy does not read is refused, unless it has its default value.",
    )


# Its bases are every built-in strategy's settings (a test checks), whose fields are its own.
class ParallelismSpec(FSDPSettings, DDPSettings, StrategyChoice):
    # The docstring is the API schema's description, kept as it was published: the records it
    # names live in store/training/parallelism.py.
    """How the ranks of a multi-process run share the model (store.parallelism)."""

    model_config = ConfigDict(extra="allow", frozen=True)

"""Data-parallel strategies: one record each, what the store knows of how a multi-process
train run shares its model (docs/design/training.md, "Multi-GPU and multi-node").

A request picks one with `parallelism.strategy`. The record says, without torch, what the
rest of the store asks of it: which `ParallelismSpec` fields it reads (a request that sets
another one is refused, rather than the setting silently ignored) and how it divides a rank's
memory (`store.training.memory`). The worker runs a strategy with the builder registered under the
same name (`worker.training.parallelism.STRATEGY_BUILDERS`).

- `ddp`: every rank holds the whole model, its gradients and its optimizer state; the
  gradients are averaged (all-reduced) once per step.
- `fsdp`: FSDP2 (`fully_shard`) per transformer block and the root: each of the W ranks holds
  1/W of the parameters, gradients and optimizer state, and gathers a block's full parameters
  only while it computes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from trainctl.store.checkpoints.manifests import DCP_LAYOUT, FULL_LAYOUT
from trainctl.store.registry import RegisteredName, Registry

COMMON_FIELDS = frozenset({"strategy"})
DEFAULT_STRATEGY = "ddp"


@dataclass(frozen=True)
class ParallelStrategy:
    """Everything the store needs to know of one data-parallel strategy."""

    name: str
    """The strategy's name: a request's `parallelism.strategy`."""
    description: str
    """What it does, in words (the API docs list it)."""
    reads: frozenset[str]
    """The `ParallelismSpec` fields it reads, besides `COMMON_FIELDS`."""
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

    def shard_count(self, world: int) -> int:
        """Into how many parts a rank's weights, gradients and optimizer state are split."""
        return world if self.shards_state else 1


PARALLEL_STRATEGIES: Registry[ParallelStrategy] = Registry("parallel strategy")

StrategyName = Annotated[str, RegisteredName(PARALLEL_STRATEGIES)]
"""A strategy's name: the registered ones, published in the schema as an enum."""

BUILT_IN_STRATEGIES = (
    ParallelStrategy(
        name="ddp",
        description="DistributedDataParallel: every rank holds the whole model and optimizer "
        "state, gradients are all-reduced once per step",
        reads=frozenset(),
        shards_state=False,
    ),
    ParallelStrategy(
        name="fsdp",
        description="FSDP2 (fully_shard per transformer block and the root): parameters, "
        "gradients and optimizer state are split across the nnodes x nproc_per_node ranks, "
        "a block's full parameters gathered only while it runs",
        reads=frozenset({"reshard_after_forward"}),
        shards_state=True,
        runs_alone_on_rank_0=False,
        checkpoint_layout=DCP_LAYOUT,
    ),
)
for _strategy in BUILT_IN_STRATEGIES:
    PARALLEL_STRATEGIES.register(_strategy.name, _strategy)


def fields_read(strategy: str) -> frozenset[str]:
    """Every `ParallelismSpec` field `strategy` reads."""
    return PARALLEL_STRATEGIES.get(strategy).reads | COMMON_FIELDS

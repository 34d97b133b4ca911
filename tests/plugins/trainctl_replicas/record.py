"""The `replicas` strategy's record (the store's side: no torch)."""

from __future__ import annotations

from trainctl.store.checkpoints.manifests import DCP_LAYOUT
from trainctl.store.training.parallelism import DDPSettings, ParallelStrategy

REPLICAS = ParallelStrategy(
    name="replicas",
    description="ddp's replicas, with sharded checkpoints: every rank writes its part",
    settings=DDPSettings,
    shards_state=False,
    checkpoint_layout=DCP_LAYOUT,
)

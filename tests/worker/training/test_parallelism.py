"""The worker's strategies (worker/training/parallelism.py): a builder per registered record,
and the checkpoint layout a builder writes is the one its record names (the store refuses a
request by the record's). A strategy of a plug-in: tests/e2e/test_strategy_plugin.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from tests.support.plans import train_plan
from tests.support.registries import registered
from tests.support.stores import posix_store
from trainctl.store.checkpoints.manifests import FULL_LAYOUT
from trainctl.store.training.parallelism import (
    PARALLEL_STRATEGIES,
    DDPSettings,
    ParallelismSpec,
    ParallelStrategy,
)
from trainctl.worker.checkpoints.saves import ShardedSaves
from trainctl.worker.checkpoints.state import LOCAL_STATE
from trainctl.worker.training.hooks import TrainerHooks
from trainctl.worker.training.parallelism import STRATEGY_BUILDERS, Ranks, StrategyBuilder

MISLABELED = "mislabeled_for_the_test"


def test_every_strategy_has_a_builder_whose_saves_write_the_layout_its_record_names() -> None:
    assert set(PARALLEL_STRATEGIES.names()) == set(STRATEGY_BUILDERS.names())
    for record in PARALLEL_STRATEGIES:
        saves = cast(Any, STRATEGY_BUILDERS.get(record.name).saves)  # a RunSaves class
        assert saves.layout == record.checkpoint_layout


@pytest.fixture
def mislabeled() -> Iterator[str]:
    """A strategy whose record says its checkpoints are full but whose builder shards them."""
    record = ParallelStrategy(
        name=MISLABELED, description="says full, writes shards", settings=DDPSettings,
        shards_state=False, checkpoint_layout=FULL_LAYOUT,
    )  # fmt: skip
    builder = StrategyBuilder(STRATEGY_BUILDERS.get("ddp").wrap, saves=ShardedSaves)
    with registered(
        (PARALLEL_STRATEGIES, MISLABELED, record), (STRATEGY_BUILDERS, MISLABELED, builder)
    ):
        yield MISLABELED


def test_a_builder_that_writes_another_layout_than_its_record_names_is_refused(
    mislabeled: str, tmp_path: Path
) -> None:
    ranks = Ranks(2, ParallelismSpec(strategy=mislabeled))
    plan = train_plan(steps=1)
    with pytest.raises(ValueError, match=f"{mislabeled!r} writes 'dcp' checkpoints .* 'full'"):
        ranks.saves(plan, posix_store(tmp_path), TrainerHooks(), LOCAL_STATE)

"""What submit counts of a run's data (store/data/contents.py) is what the worker builds: a
run accepted at submit has data for a sequence, and one refused would have failed there."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trainctl.store.data.contents import TokenArrays, check_enough_tokens, shard_lengths
from trainctl.store.data.shards import DataError, write_shard
from trainctl.store.exceptions import InvalidRequest
from trainctl.store.specs import DataSpec
from trainctl.worker.data.loader import TokenSampler
from trainctl.worker.training.loop import build_token_arrays

SEQ_LEN = 64


def worker_builds(data: DataSpec) -> bool:
    train, val = build_token_arrays(data)
    try:
        TokenSampler(train, 1, SEQ_LEN)
        TokenSampler(val, 1, SEQ_LEN)
    except DataError:
        return False
    return True


def submit_admits(data: DataSpec) -> bool:
    lengths = TokenArrays(
        shard_lengths([Path(p) for p in data.paths], "data.paths"),
        shard_lengths([Path(p) for p in data.val_paths], "data.val_paths"),
    )
    try:
        check_enough_tokens(lengths, data.val_fraction, SEQ_LEN, "data")
    except InvalidRequest:
        return False
    return True


@pytest.mark.parametrize("tokens", [60, 66, 67, 68, 69, 70, 71, 1_300, 1_380, 1_400, 1_420])
@pytest.mark.parametrize("val_fraction", [0.05, 0.3])
@pytest.mark.parametrize("with_val", [False, True])
def test_submit_admits_exactly_the_shards_the_worker_can_sample(
    tmp_path: Path, tokens: int, val_fraction: float, with_val: bool
) -> None:
    write_shard(tmp_path / "train.bin", np.zeros(tokens, dtype=np.int64))
    write_shard(tmp_path / "val.bin", np.zeros(tokens // 10 + 60, dtype=np.int64))
    data = DataSpec(
        source="shards",
        paths=[str(tmp_path / "train.bin")],
        val_paths=[str(tmp_path / "val.bin")] if with_val else [],
        val_fraction=val_fraction,
    )

    assert submit_admits(data) == worker_builds(data)

"""Parallelism strategies at submit: the spec, the plan, and the memory a sharded rank needs
(store/training/parallelism.py, store/training/memory.py)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.support.plans import train_plan
from trainctl.store.exceptions import InvalidRequest
from trainctl.store.kinds.train import TrainRequest, train_need
from trainctl.store.training.memory import GIB, MemoryLimit, admit
from trainctl.store.training.parallelism import PARALLEL_STRATEGIES, ParallelismSpec

H100 = MemoryLimit(80 * GIB, "an H100 has")
EIGHT_GPUS_8B: dict[str, Any] = {
    "steps": 10,
    "device": "cuda",
    "model": {"preset": "8b"},
    "data": {"source": "synthetic"},
    "batch": {"micro_batch_size": 1, "seq_len": 4096, "grad_accum_steps": 8},
    "nproc_per_node": 8,
}


def test_a_plan_is_ddp_unless_the_request_says_otherwise() -> None:
    assert train_plan(steps=1).parallelism == ParallelismSpec(strategy="ddp")
    plan = train_plan(steps=1, parallelism={"strategy": "fsdp", "reshard_after_forward": False})
    assert plan.parallelism.strategy == "fsdp" and not plan.parallelism.reshard_after_forward


def test_a_strategy_not_registered_is_refused_listing_those_that_are() -> None:
    with pytest.raises(ValueError, match=r"parallelism\.strategy\n.*'ddp' or 'fsdp'"):
        TrainRequest(steps=1, parallelism={"strategy": "zero3"})
    assert PARALLEL_STRATEGIES.names() == ("ddp", "fsdp")


def test_a_setting_the_strategy_does_not_read_is_refused_unless_it_is_the_default() -> None:
    with pytest.raises(ValueError, match="'ddp' does not read reshard_after_forward"):
        ParallelismSpec(strategy="ddp", reshard_after_forward=False)
    ParallelismSpec(strategy="ddp", reshard_after_forward=True)  # a plan sent back as a request


def test_training_samples_are_refused_under_fsdp_whose_ranks_run_every_forward_together() -> None:
    with pytest.raises(ValueError, match="sample_every with parallelism strategy 'fsdp'"):
        train_plan(
            steps=2,
            data={"source": "stdlib"},
            parallelism={"strategy": "fsdp"},
            sample_every=1,
            sample_prompts=["def"],
        )


def test_a_lossy_save_dtype_is_refused_under_fsdp_whose_shards_are_the_training_state() -> None:
    with pytest.raises(ValueError, match="save_dtype 'bfloat16' with parallelism strategy 'fsdp'"):
        train_plan(steps=2, parallelism={"strategy": "fsdp"}, save_dtype="bfloat16")
    assert train_plan(steps=2, parallelism={"strategy": "ddp"}, save_dtype="bfloat16")


def test_fsdp_divides_weights_gradients_and_optimizer_state_by_the_shard_count() -> None:
    ddp = train_need(train_plan(**EIGHT_GPUS_8B)).estimate
    fsdp = train_need(train_plan(**EIGHT_GPUS_8B, parallelism={"strategy": "fsdp"})).estimate

    assert fsdp.weights_and_optimizer == -(-ddp.weights_and_optimizer // 8)
    assert ddp.gathered == 0 < fsdp.gathered  # the root, two blocks, unsharded gradients
    assert fsdp.activations == ddp.activations  # each rank runs its own micro-batches


def test_keeping_blocks_gathered_after_forward_needs_more_memory() -> None:
    def gathered(reshard: bool) -> int:
        parallelism = {"strategy": "fsdp", "reshard_after_forward": reshard}
        return train_need(train_plan(**EIGHT_GPUS_8B, parallelism=parallelism)).estimate.gathered

    assert gathered(False) > gathered(True)


def test_a_run_fitting_only_sharded_is_refused_under_ddp_naming_both_admitted_under_fsdp() -> None:
    with pytest.raises(InvalidRequest) as refused:
        admit(train_need(train_plan(**EIGHT_GPUS_8B)), H100)
    detail = str(refused.value)
    print(detail)
    numbers = re.findall(r"about ([\d,]+\.\d) GiB", detail)
    assert len(numbers) == 2 and float(numbers[1].replace(",", "")) < 80
    assert float(numbers[0].replace(",", "")) > 80
    assert 'set "parallelism": {"strategy": "fsdp"}' in detail

    admit(train_need(train_plan(**EIGHT_GPUS_8B, parallelism={"strategy": "fsdp"})), H100)


def test_a_run_too_large_even_sharded_gets_the_usual_advice() -> None:
    two_gpus = EIGHT_GPUS_8B | {"nproc_per_node": 2, "batch": {"grad_accum_steps": 2}}
    with pytest.raises(InvalidRequest, match="does not fit either: use a smaller"):
        admit(train_need(train_plan(**two_gpus)), MemoryLimit(40 * GIB))

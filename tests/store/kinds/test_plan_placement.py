"""What a request asks of the workers: its plan's placement (nodes, GPUs or CPU processes per
node, spread), its world size across nodes, and the queueing fields that stay out of the plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tests.service.fakes import save_checkpoint
from tests.support.plans import benchmark_plan, train_plan, validate_plan
from tests.support.stores import dataset_store, posix_store
from trainctl.store.db.placement import Placement
from trainctl.store.exceptions import InvalidRequest
from trainctl.store.kinds.benchmark import BenchmarkRequest, resolve_benchmark
from trainctl.store.kinds.export import ExportRequest, resolve_export
from trainctl.store.kinds.prepare import PrepareRequest, resolve_prepare
from trainctl.store.kinds.registry import placement_of
from trainctl.store.kinds.sample import SampleRequest, resolve_sample
from trainctl.store.kinds.train import MAX_NNODES, TrainPlan, TrainRequest, resolve_train
from trainctl.store.resolve import pick_device
from trainctl.store.specs import Request


def test_an_explicit_cuda_device_is_kept_without_a_cuda_worker_so_the_run_can_wait() -> None:
    assert pick_device("cuda", cuda_available=False) == "cuda"
    assert pick_device("auto", cuda_available=False) == "cpu"
    assert pick_device("auto", cuda_available=True) == "cuda"
    assert pick_device("cpu", cuda_available=True) == "cpu"

    plan = resolve_train(
        TrainRequest(steps=1, device="cuda", nproc_per_node=2), cuda_available=False, data_roots=[]
    )
    assert plan.device == "cuda" and plan.model.preset == "small"  # the CUDA profile


@pytest.mark.parametrize(
    ("request_fields", "expected"),
    [
        ({}, Placement()),
        ({"nproc_per_node": 4}, Placement(procs_per_node=4)),
        (
            {"device": "cuda", "nproc_per_node": 8, "nnodes": 2, "spread": "distinct_nodes"},
            Placement(nnodes=2, gpus_per_node=8, procs_per_node=8, spread="distinct_nodes"),
        ),
        (
            {"device": "cuda", "nnodes": 3, "spread": "same_node"},
            Placement(nnodes=3, gpus_per_node=1, procs_per_node=1, spread="same_node"),
        ),
    ],
)
def test_a_train_plan_asks_for_nnodes_nodes_of_nproc_per_node_gpus_or_processes(
    request_fields: dict[str, Any], expected: Placement
) -> None:
    plan = resolve_train(
        TrainRequest(steps=1, **request_fields), cuda_available=False, data_roots=[]
    )

    assert placement_of(plan) == expected


def test_the_other_kinds_ask_for_one_gpu_on_cuda_and_prepare_and_export_for_one_process(
    tmp_path: Path,
) -> None:
    ckpts = posix_store(tmp_path / "checkpoints")
    save_checkpoint(ckpts, "exp", step=3)

    assert placement_of(benchmark_plan(steps=1)) == Placement()
    on_gpu = resolve_benchmark(BenchmarkRequest(steps=1, device="cuda"), cuda_available=False)
    assert placement_of(on_gpu) == Placement(gpus_per_node=1)
    validation = validate_plan(
        tmp_path / "checkpoints", device="cuda", data={"source": "synthetic"}
    )
    assert placement_of(validation) == Placement(gpus_per_node=1)
    sample = resolve_sample(
        SampleRequest(prompt_tokens=[[1, 2]], device="cuda"), cuda_available=True, checkpoints=ckpts
    )
    assert placement_of(sample) == Placement(gpus_per_node=1)
    export = resolve_export(
        ExportRequest(checkpoint="exp/step_3"),
        checkpoints=ckpts,
        exports=posix_store(tmp_path / "exports"),
    )
    assert placement_of(export) == Placement()
    (tmp_path / "corpus.txt").write_text("text")
    prepare = resolve_prepare(
        PrepareRequest(name="ds", inputs=["corpus.txt"]),
        data_roots=[tmp_path],
        datasets=dataset_store(tmp_path),
    )
    assert placement_of(prepare) == Placement()


def test_grad_accum_steps_split_across_every_process_of_every_node() -> None:
    default = train_plan(steps=1, nnodes=2, nproc_per_node=2)  # the CPU profile's 1, rounded up
    assert default.batch.grad_accum_steps == 4

    with pytest.raises(InvalidRequest, match=r"grad_accum_steps 6 .* nnodes 2 x nproc_per_node 2"):
        train_plan(steps=1, nnodes=2, nproc_per_node=2, batch={"grad_accum_steps": 6})
    assert train_plan(steps=1, nnodes=3, batch={"grad_accum_steps": 6}).batch.grad_accum_steps == 6


def test_an_elastic_gang_splits_grad_accum_steps_at_every_size_it_may_take() -> None:
    elastic = {"min": 2, "max": 3, "shrink_after_seconds": 1.0}
    plan = train_plan(steps=1, nnodes=elastic, batch={"grad_accum_steps": 6})
    assert (plan.nnodes, plan.min_nnodes, plan.shrink_after_seconds) == (3, 2, 1.0)
    assert placement_of(plan) == Placement(nnodes=3, min_nnodes=2, shrink_after_seconds=1.0)
    # 4 splits across 2 nodes but not across 3: refused, naming the multiple that would.
    with pytest.raises(InvalidRequest, match=r"grad_accum_steps 4 .* nnodes 3 .* multiple of 6"):
        train_plan(steps=1, nnodes=elastic, batch={"grad_accum_steps": 4})
    with pytest.raises(InvalidRequest, match=r"= 6 processes; use a multiple of 12"):
        train_plan(steps=1, nnodes=elastic, nproc_per_node=2, batch={"grad_accum_steps": 8})
    # By default it is rounded up to one that splits at every size.
    assert train_plan(steps=1, nnodes=elastic).batch.grad_accum_steps == 6
    # min == max is the plain form; a range the wrong way round or of no nodes is refused.
    fixed = train_plan(steps=1, nnodes={"min": 2, "max": 2})
    assert (fixed.nnodes, fixed.min_nnodes) == (2, None)
    with pytest.raises(ValidationError, match="min 3 is above max 2"):
        TrainRequest(steps=1, nnodes={"min": 3, "max": 2})
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        TrainRequest(steps=1, nnodes={"min": 0, "max": 2})
    default = TrainRequest(steps=1, nnodes={"min": 1, "max": 2}).nnodes
    assert not isinstance(default, int) and default.shrink_after_seconds == 300.0


def test_nnodes_and_spread_are_in_the_plan_and_priority_and_attempts_are_not() -> None:
    plan = train_plan(steps=1, nnodes=2, spread="same_node", priority=7, max_attempts=2)

    stored = plan.model_dump(mode="json")
    assert (stored["nnodes"], stored["spread"]) == (2, "same_node")
    assert "priority" not in stored and "max_attempts" not in stored
    assert TrainPlan.model_validate(stored) == plan
    # A plan stored before nodes existed reads back as one node anywhere.
    old = {k: v for k, v in stored.items() if k not in ("nnodes", "spread")}
    assert placement_of(TrainPlan.model_validate(old)).nnodes == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("priority", 1001),
        ("priority", -1001),
        ("priority", 1.5),
        ("priority", "5"),
        ("max_attempts", 0),
        ("max_attempts", 101),
        ("max_attempts", True),
        ("nnodes", 0),
        ("nnodes", MAX_NNODES + 1),
        ("spread", "everywhere"),
    ],
)
def test_queueing_and_placement_fields_are_bounded_and_strict(field: str, value: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        TrainRequest.model_validate({"steps": 1, field: value})

    # nnodes names its form too: ("nnodes", "count") or ("nnodes", "range").
    assert [e["loc"][0] for e in caught.value.errors()] == [field]


@pytest.mark.parametrize(
    "kind", [TrainRequest, BenchmarkRequest, PrepareRequest, SampleRequest, ExportRequest]
)
def test_every_kind_of_request_has_a_priority_and_max_attempts(kind: type[Request]) -> None:
    assert {"priority", "max_attempts"} <= set(kind.model_fields)
    assert kind.model_fields["priority"].default == 0
    assert kind.model_fields["max_attempts"].default is None

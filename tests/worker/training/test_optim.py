from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from tests.plugins.trainctl_rmsprop.builder import BUILDER
from tests.plugins.trainctl_rmsprop.kind import RMSPROP
from tests.support.plans import train_plan
from tests.support.registries import registered
from tests.support.stores import folder, posix_store
from trainctl.store.checkpoints.manifests import MODEL_FILE, OPTIMIZER_FILE
from trainctl.store.kinds.train import TrainRequest, train_need
from trainctl.store.training.optim import (
    OPTIMIZER_KINDS,
    MuonSettings,
    OptimizerKind,
    OptimizerSpec,
)
from trainctl.worker.exceptions import CheckpointMismatch
from trainctl.worker.models.gpt import GPT, build_model
from trainctl.worker.training.hooks import TrainerHooks
from trainctl.worker.training.loop import Trainer
from trainctl.worker.training.optim import (
    OPTIMIZER_BUILDERS,
    Groups,
    OptimizerBuilder,
    Optimizers,
    build_optimizers,
    check_partition,
)

BUILT_IN = ["muon_adamw", "adamw"]


def params_of(optimizer: torch.optim.Optimizer) -> list[nn.Parameter]:
    return [p for g in optimizer.param_groups for p in g["params"]]


def one_step(model: GPT, optimizers: Optimizers) -> None:
    x = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    model.loss(x, x)[0].backward()
    optimizers.step()
    optimizers.zero_grad()


@pytest.mark.parametrize("kind", BUILT_IN)
def test_every_parameter_is_in_exactly_one_optimizer(kind: str) -> None:
    model = build_model("tiny", seed=0, mtp_depth=1)
    optimizers = build_optimizers(model, OptimizerSpec(kind=kind))
    ids = [id(p) for opt in optimizers.values() for p in params_of(opt)]
    assert len(ids) == len(set(ids))
    assert set(ids) == {id(p) for p in model.parameters()}


def test_muon_gets_only_hidden_matrices_and_adamw_the_rest() -> None:
    model = build_model("tiny", seed=0)
    optimizers = build_optimizers(model)
    assert list(optimizers) == ["muon", "adamw"]  # the checkpoint's keys, as ever
    muon_ids = {id(p) for p in params_of(optimizers["muon"])}
    adamw_ids = {id(p) for p in params_of(optimizers["adamw"])}
    for name, p in model.named_parameters():
        if id(p) in muon_ids:
            assert p.dim() == 2 and "tok_emb" not in name, name
    assert id(model.tok_emb.weight) in adamw_ids  # embedding, and so the tied head
    assert id(model.final_norm.weight) in adamw_ids
    assert id(model.get_parameter("blocks.0.attn.q_norm.weight")) in adamw_ids
    assert id(model.get_parameter("blocks.0.mlp.w_gate.weight")) in muon_ids


def test_kind_adamw_trains_every_parameter_with_adamw_and_decays_only_matrices() -> None:
    model = build_model("tiny", seed=0)
    optimizers = build_optimizers(model, OptimizerSpec(kind="adamw"))
    assert list(optimizers) == ["adamw"]
    adamw = optimizers["adamw"]
    assert isinstance(adamw, torch.optim.AdamW)
    decay = {id(p): g["weight_decay"] for g in adamw.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        assert decay[id(p)] == (0.1 if p.dim() >= 2 else 0.0), name


def test_seed_defaults_and_explicit_adjust_lr_fn() -> None:
    optimizers = build_optimizers(build_model("tiny", seed=0))
    muon, adamw = optimizers["muon"], optimizers["adamw"]
    assert muon.defaults["lr"] == 0.02
    assert muon.defaults["adjust_lr_fn"] == "original"
    assert adamw.defaults["lr"] == 3e-4
    assert adamw.defaults["betas"] == (0.9, 0.95)
    assert adamw.defaults["eps"] == 1e-8
    decays = sorted(g["weight_decay"] for g in adamw.param_groups)
    assert decays == [0.0, 0.1]  # vectors never decay; the embedding does


def test_spec_values_reach_the_optimizers() -> None:
    spec = OptimizerSpec(
        muon_lr=0.01, adamw_lr=1e-3, muon_adjust_lr_fn="match_rms_adamw", adamw_eps=1e-6
    )
    optimizers = build_optimizers(build_model("tiny", seed=0), spec)
    muon, adamw = optimizers["muon"], optimizers["adamw"]
    assert (muon.defaults["lr"], adamw.defaults["lr"]) == (0.01, 1e-3)
    assert muon.defaults["adjust_lr_fn"] == "match_rms_adamw"
    assert adamw.defaults["eps"] == 1e-6


def test_every_optimizer_kind_has_a_builder_and_reads_only_spec_fields() -> None:
    assert set(OPTIMIZER_KINDS.names()) == set(OPTIMIZER_BUILDERS.names())
    for kind in OPTIMIZER_KINDS:
        assert kind.reads <= set(OptimizerSpec.model_fields), kind.name


@pytest.mark.parametrize("kind", BUILT_IN)
def test_the_optimizer_state_is_no_larger_than_the_memory_estimate_says(kind: str) -> None:
    """store.training.memory counts `state_per_param` fp32 tensors of state per parameter (besides
    weight and gradient); after a step, the real state must fit it. Scalars kept per tensor
    (AdamW's step count) are not per parameter: the estimate's runtime allowance has them."""
    record = OPTIMIZER_KINDS.get(kind)
    model = build_model("tiny", seed=0)
    optimizers = build_optimizers(model, OptimizerSpec(kind=kind))
    one_step(model, optimizers)
    params = sum(p.numel() for p in model.parameters())
    state_bytes = 0
    for optimizer in optimizers.values():
        for p in params_of(optimizer):
            assert p.dtype == torch.float32  # the 4 bytes of weight and of gradient counted
            for t in optimizer.state[p].values():
                if isinstance(t, torch.Tensor) and t.numel() > 1:
                    assert t.shape == p.shape
                    state_bytes += t.numel() * t.element_size()
                else:
                    assert not isinstance(t, torch.Tensor) or t.numel() <= 1
    assert state_bytes > 0
    assert state_bytes <= 4 * record.state_per_param * params
    assert record.bytes_per_param == 4 * (2 + record.state_per_param)


def test_the_container_steps_saves_and_reports_each_optimizer_by_name() -> None:
    model = build_model("tiny", seed=0)
    optimizers = build_optimizers(model)
    one_step(model, optimizers)
    assert all(p.grad is None for p in model.parameters())
    assert optimizers.lrs() == {"muon": 0.02, "adamw": 3e-4}
    assert optimizers.lr_metrics() == {"lr/muon": 0.02, "lr/adamw": 3e-4}
    state = optimizers.state_dict()
    assert list(state) == ["muon", "adamw"]
    fresh = build_optimizers(build_model("tiny", seed=0))
    fresh.load_state_dict(state)
    assert fresh["adamw"].state_dict()["state"].keys() == state["adamw"]["state"].keys()
    with pytest.raises(CheckpointMismatch, match="optimizer state is of muon, but"):
        fresh.load_state_dict({"muon": state["muon"]})


def test_a_rule_that_leaves_out_or_doubles_a_parameter_is_refused() -> None:
    model = build_model("tiny", seed=0)
    every = list(model.parameters())
    with pytest.raises(ValueError, match=r"gives no optimizer tok_emb\.weight"):
        check_partition(model, {"a": every[1:]}, "k")
    with pytest.raises(ValueError, match=r"gives tok_emb\.weight to a and b"):
        check_partition(model, {"a": every, "b": every[:1]}, "k")
    with pytest.raises(ValueError, match="gives a a parameter not trained"):
        check_partition(model, {"a": [*every, nn.Parameter(torch.zeros(1))]}, "k")


# --- a third kind, from a test alone --------------------------------------------------------

SGD = "sgd_for_the_test"


def sgd_groups(model: nn.Module) -> Groups:
    return {"sgd": [p for p in model.parameters() if p.requires_grad]}


def build_sgd(groups: Groups, spec: MuonSettings) -> dict[str, torch.optim.Optimizer]:
    """Momentum SGD, with Muon's settings (Muon is momentum SGD whose update is
    orthogonalised): lr, momentum and the decay of matrices."""
    matrices = [p for p in groups["sgd"] if p.dim() >= 2]
    vectors = [p for p in groups["sgd"] if p.dim() < 2]
    return {
        "sgd": torch.optim.SGD(
            [
                {"params": matrices, "weight_decay": spec.muon_weight_decay},
                {"params": vectors, "weight_decay": 0.0},
            ],
            lr=spec.muon_lr,
            momentum=spec.muon_momentum,
            nesterov=True,
        )
    }


@pytest.fixture
def sgd_kind() -> Iterator[str]:
    """An optimizer kind registered by this test only, in both registries: the record the
    store reads and the builder the worker runs. Nothing else is told of it."""
    record = OptimizerKind(
        name=SGD,
        description="momentum SGD for every parameter",
        settings=MuonSettings,
        state_per_param=1,  # the momentum buffer
    )
    builder = OptimizerBuilder(sgd_groups, build_sgd)
    with registered((OPTIMIZER_KINDS, SGD, record), (OPTIMIZER_BUILDERS, SGD, builder)):
        yield SGD


def short_plan(
    experiment: str, optimizer: dict[str, Any], checkpoints: Path | None = None, **request: Any
) -> Any:
    """12 steps of the tiny model on synthetic tokens, with `optimizer`."""
    return train_plan(
        checkpoints,
        experiment=experiment,
        steps=12,
        checkpoint_every=4,
        val_batches=1,
        data={"source": "synthetic"},
        batch={"micro_batch_size": 2, "seq_len": 32, "grad_accum_steps": 1},
        optimizer=optimizer,
        **request,
    )


def sgd_plan(kind: str, checkpoints: Path | None = None, **request: Any) -> Any:
    return short_plan("sgd", {"kind": kind, "muon_lr": 0.05}, checkpoints, **request)


def test_a_kind_registered_by_a_plugin_trains_saves_and_resumes_exactly(
    tmp_path: Path, sgd_kind: str
) -> None:
    """Adding an optimizer kind touches only the optimizer registries: the request schema
    lists it, submit resolves it, the memory estimate counts its state, the trainer trains
    and checkpoints it by its optimizers' names and reports `lr/<name>`, and a resume from
    its checkpoint continues the run bit for bit."""
    schema = TrainRequest.model_json_schema()["$defs"]["OptimizerSpec"]["properties"]["kind"]
    assert sgd_kind in schema["enum"]
    with pytest.raises(ValueError, match=f"kind '{sgd_kind}' does not read adamw_lr"):
        OptimizerSpec(kind=sgd_kind, adamw_lr=1e-3)

    plan = sgd_plan(sgd_kind)
    params = plan.model.config.param_counts()["total"]
    assert train_need(plan).estimate.weights_and_optimizer == params * 4 * 3

    straight: list[dict[str, Any]] = []
    straight_store = posix_store(tmp_path / "straight")
    Trainer(plan, straight_store, hooks=TrainerHooks(on_metrics=straight.append)).run()
    train_rows = [m for m in straight if m["kind"] == "train"]
    assert {k for k in train_rows[0] if k.startswith("lr")} == {"lr/sgd"}
    assert train_rows[0]["lr/sgd"] == 0.05  # a 1 % warm-up of 12 steps is none

    root = tmp_path / "resumed"
    first: list[dict[str, Any]] = []
    stop = lambda: len([m for m in first if m["kind"] == "train"]) >= 5  # noqa: E731
    store = posix_store(root)
    Trainer(plan, store, hooks=TrainerHooks(on_metrics=first.append, should_stop=stop)).run()
    info = store.latest("sgd")
    assert info.step == 5
    saved = folder(store, "sgd", info.tag) / OPTIMIZER_FILE
    assert list(torch.load(saved, weights_only=True)) == ["sgd"]

    second: list[dict[str, Any]] = []
    resumed = Trainer(
        sgd_plan(sgd_kind, root, resume_from="latest"),
        store,
        hooks=TrainerHooks(on_metrics=second.append),
    )
    resumed.run()
    losses = [m["loss"] for m in first + second if m["kind"] == "train"]
    assert losses == [m["loss"] for m in train_rows]
    a = load_file(str(folder(straight_store, "sgd", straight_store.latest("sgd").tag) / MODEL_FILE))
    b = load_file(str(folder(store, "sgd", store.latest("sgd").tag) / MODEL_FILE))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --- a kind with settings of its own, from a plug-in package --------------------------------


def test_a_plugin_kind_trains_with_the_settings_of_its_own_that_the_request_sent(
    tmp_path: Path,
) -> None:
    """tests/plugins/trainctl_rmsprop: `rmsprop_lr` and `rmsprop_alpha`, which no built-in
    kind has, go from the request through the plan (as a worker reads it, from JSON) to the
    kind's builder, typed, and so to the optimizer that trains and is checkpointed."""
    with registered(
        (OPTIMIZER_KINDS, RMSPROP.name, RMSPROP), (OPTIMIZER_BUILDERS, RMSPROP.name, BUILDER)
    ):
        optimizer = {"kind": "rmsprop", "rmsprop_lr": 0.005, "rmsprop_alpha": 0.9}
        plan = short_plan("rmsprop", optimizer)
        as_read = type(plan).model_validate_json(plan.model_dump_json())
        metrics: list[dict[str, Any]] = []
        store = posix_store(tmp_path)
        Trainer(as_read, store, hooks=TrainerHooks(on_metrics=metrics.append)).run()

    train_rows = [m for m in metrics if m["kind"] == "train"]
    assert len(train_rows) == 12 and train_rows[0]["lr/rmsprop"] == 0.005
    saved = torch.load(
        folder(store, "rmsprop", store.latest("rmsprop").tag) / OPTIMIZER_FILE, weights_only=True
    )
    [group] = saved["rmsprop"]["param_groups"]
    assert group["alpha"] == 0.9
    assert saved["rmsprop"]["state"] and all(
        "square_avg" in state for state in saved["rmsprop"]["state"].values()
    )

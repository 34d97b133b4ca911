"""Sharded train runs (worker/training/fsdp.py) on CPU: torchrun, gloo ranks, FSDP2.

The ranks follow one process on the same global batch to LOSS_RTOL (tests/worker/
test_distributed.py): they differ by the order the gradient's parts are summed in. Their
checkpoints are sharded (every rank writes its shards, worker.training.ranks.RankTrainer), and are
compared here as one process loads them (`saved_state`), whatever their layout. A resume at the
same world size is bit-exact. Across strategies and world sizes a load is state-exact: a run
resumed from a checkpoint with no step left to train saves again what it loaded, and that
equals the checkpoint tensor for tensor.

Each run here starts torchrun and its ranks (15-60 s on 2 busy cores): the built-in GPT trains
at 2 and 3 ranks and a transformers llama at 2, a run resumes at 2, and checkpoints load at 3
and between ddp and fsdp both ways.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from safetensors.torch import load as load_safetensors

from tests.support.hf_archs import hf
from tests.support.ranks import LOSS_RTOL, STEPS, tiny_plan, train_losses
from tests.support.stores import folder, posix_store
from trainctl.store.checkpoints.manifests import DCP_LAYOUT
from trainctl.store.worker_settings import WorkerSettings
from trainctl.worker.checkpoints.state import load_checkpoint
from trainctl.worker.launch import launch_train
from trainctl.worker.models import build_model
from trainctl.worker.training.hooks import TrainerHooks
from trainctl.worker.training.loop import Trainer
from trainctl.worker.training.optim import build_optimizers
from trainctl.worker.training.schedule import build_scheduler

FSDP = {"strategy": "fsdp"}


def fsdp_plan(checkpoints: Path | None = None, **changes: Any) -> Any:
    return tiny_plan(checkpoints, experiment="fsdp", parallelism=FSDP, **changes)


def saved_state(
    root: Path, experiment: str, tag: str, **changes: Any
) -> tuple[dict[str, Any], Any]:
    """A checkpoint's weights and optimizer state as one process loads them, whatever its
    layout (a sharded run's are its ranks' shard files, a replicated one's two files)."""
    plan = tiny_plan(**changes)
    model = build_model(plan.model.config, seed=1)  # not the run's seed: the load must set all
    optimizers = build_optimizers(model, plan.optimizer)
    # As a resuming run loads: its schedule first, which gives each param group its
    # `initial_lr`. A DCP load fills in only the keys the groups already have, so without it
    # a sharded checkpoint's groups would read back without the key a full one restores.
    build_scheduler(optimizers, plan.steps)
    load_checkpoint(model, optimizers, None, posix_store(root).entry(experiment, tag))
    return dict(model.state_dict()), optimizers.state_dict()


def assert_same_state(a: tuple[dict[str, Any], Any], b: tuple[dict[str, Any], Any]) -> None:
    (weights_a, opt_a), (weights_b, opt_b) = a, b
    assert weights_a.keys() == weights_b.keys()
    for name in weights_a:
        assert torch.equal(weights_a[name], weights_b[name]), name
    assert_equal_nested(opt_a, opt_b)


def assert_equal_nested(a: Any, b: Any, where: str = "optimizer") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a.cpu(), b.cpu()), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_equal_nested(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_equal_nested(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One process and two fsdp ranks, the same six steps; checkpoints at 3 and 6, the fsdp
    ones sharded."""
    root = tmp_path_factory.mktemp("fsdp")
    single: list[dict[str, Any]] = []
    Trainer(
        tiny_plan(), posix_store(root / "checkpoints"), hooks=TrainerHooks(on_metrics=single.append)
    ).run()
    # In the background: the same-world resume below (a synchronous save) is then bit-exact
    # only if the loop's copy of the shards was complete before the step that followed it.
    plan = fsdp_plan(nproc_per_node=2, async_checkpoint=True)
    sharded = launch_train(plan, WorkerSettings(data_dir=root), ctx=None)
    return {"root": root, "single": single, "sharded": sharded}


def resume_without_steps(root: Path, experiment: str, source: str, **changes: Any) -> None:
    """Load `source`'s best checkpoint in a copy of it filed as `experiment`, with no step left
    to train: the run saves what it loaded as step_<N>."""
    checkpoints = root / "checkpoints"
    shutil.copytree(
        folder(posix_store(checkpoints), source, "best"), checkpoints / experiment / "best"
    )
    step = posix_store(checkpoints).get(experiment, "best").step
    assert step is not None
    plan = tiny_plan(checkpoints, experiment=experiment, resume_from="best", **changes)
    launch_train(plan.model_copy(update={"steps": step}), WorkerSettings(data_dir=root), ctx=None)


def train_sharded_like_one_process(root: Path, ranks: int, **changes: Any) -> None:
    """Three steps in one process, then at `ranks` fsdp ranks (checkpoints under `root`):
    the same losses, to LOSS_RTOL."""
    single: list[dict[str, Any]] = []
    plan = tiny_plan(steps=3, **changes)
    Trainer(plan, posix_store(root / "single"), hooks=TrainerHooks(on_metrics=single.append)).run()
    sharded = fsdp_plan(steps=3, nproc_per_node=ranks, **changes)
    result = launch_train(sharded, WorkerSettings(data_dir=root), ctx=None)
    assert result is not None
    assert train_losses(result["metrics"]) == pytest.approx(train_losses(single), rel=LOSS_RTOL)


@pytest.mark.slow
def test_two_fsdp_ranks_train_like_one_process(trained: dict[str, Any]) -> None:
    expected, got = train_losses(trained["single"]), train_losses(trained["sharded"]["metrics"])
    print(f"single: {expected}\nfsdp x2: {got}")
    assert len(got) == STEPS
    assert got == pytest.approx(expected, rel=LOSS_RTOL)
    assert trained["sharded"]["final_val_loss"] == pytest.approx(
        trained["single"][-1]["val_loss"], rel=LOSS_RTOL
    )


@pytest.mark.slow
def test_an_fsdp_run_resumes_at_the_same_world_size_exactly(trained: dict[str, Any]) -> None:
    root = trained["root"]
    checkpoints = posix_store(root / "checkpoints")
    assert checkpoints.get("fsdp", "step_6").layout == DCP_LAYOUT  # every rank wrote its shards
    straight = saved_state(root / "checkpoints", "fsdp", "step_6")
    checkpoints.delete("fsdp", "step_6")

    resumed = launch_train(
        fsdp_plan(root / "checkpoints", nproc_per_node=2, resume_from="step_3"),
        WorkerSettings(data_dir=root),
        ctx=None,
    )
    assert resumed is not None

    steps = train_losses(resumed["metrics"])
    assert steps == train_losses(trained["sharded"]["metrics"])[3:]
    # Bit-identical with the same world size: weights and both optimizers' state.
    assert_same_state(saved_state(root / "checkpoints", "fsdp", "step_6"), straight)


@pytest.mark.slow
def test_three_fsdp_ranks_train_like_one_process(tmp_path: Path) -> None:
    """Uneven shards: the tiny model's widths do not all divide by 3."""
    batch = {"micro_batch_size": 2, "seq_len": 32, "grad_accum_steps": 3}
    train_sharded_like_one_process(tmp_path, 3, batch=batch)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("source", "loader"),
    [
        ("ddp", {"parallelism": FSDP, "nproc_per_node": 2}),  # replicated -> sharded
        ("fsdp", {"nproc_per_node": 2}),  # sharded -> ddp
        ("fsdp", {"parallelism": FSDP, "nproc_per_node": 3}),  # 2 -> 3 shards, uneven
    ],
    ids=["ddp-to-fsdp", "fsdp-to-ddp", "fsdp2-to-fsdp3"],
)
def test_a_checkpoint_loads_state_exact_across_strategies_and_world_sizes(
    trained: dict[str, Any], source: str, loader: dict[str, Any]
) -> None:
    root = trained["root"]
    target = f"load-{source}-{loader['nproc_per_node']}-{len(loader)}"
    batch = {"micro_batch_size": 2, "seq_len": 32, "grad_accum_steps": 6}  # splits by 2 and 3
    resume_without_steps(root, target, source, batch=batch, **loader)

    step = posix_store(root / "checkpoints").get(target, "best").step
    assert_same_state(
        saved_state(root / "checkpoints", target, f"step_{step}"),
        saved_state(root / "checkpoints", source, "best"),
    )


@pytest.mark.slow
def test_a_transformers_model_trains_sharded_like_one_process_into_a_transformers_file(
    tmp_path: Path,
) -> None:
    """A llama from a config, sharded per decoder layer: the losses of one process, and the
    stitched model file of its shards holds transformers' names, loading strictly into a
    fresh transformers model of the same config."""
    train_sharded_like_one_process(tmp_path, 2, model={"hf": hf("llama")})
    store = posix_store(tmp_path / "checkpoints")
    assert store.get("fsdp", "step_3").sharded
    stitched = store.consolidated("fsdp", "step_3")
    assert stitched is not None
    weights = load_safetensors(b"".join(stitched.chunks()))
    config = transformers.AutoConfig.for_model(**hf("llama"))
    reference = transformers.AutoModelForCausalLM.from_config(config)
    reference.load_state_dict(weights, strict=True)


@pytest.mark.slow
def test_a_tied_transformers_checkpoint_loads_state_exact_between_one_process_and_fsdp(
    tmp_path: Path,
) -> None:
    """A tied head is one tensor under two names: one process's model file holds it once (the
    embedding's), and the sharded run must load it into both; its shards, read back by one
    process (`saved_state`), are the state it loaded."""
    tied: dict[str, Any] = {"model": {"hf": hf("llama", tie_word_embeddings=True)}}
    Trainer(tiny_plan(steps=3, **tied), posix_store(tmp_path / "checkpoints")).run()
    resume_without_steps(tmp_path, "sharded", "ddp", parallelism=FSDP, nproc_per_node=2, **tied)
    store = posix_store(tmp_path / "checkpoints")
    assert store.get("sharded", "step_3").sharded
    assert_same_state(
        saved_state(tmp_path / "checkpoints", "sharded", "step_3", **tied),
        saved_state(tmp_path / "checkpoints", "ddp", "best", **tied),
    )


# make soak: inductor compiles every block on both ranks (41 s alone on 2 quiet cores, twice
# that beside a second pytest process). make test holds the parts: the eager sharded runs
# above; tests/reliability/test_compile.py (soak too) checks one process's compiled step.
@pytest.mark.soak
def test_compiled_checkpointed_blocks_train_sharded_like_one_eager_process(
    tmp_path: Path,
) -> None:
    """Activation checkpointing, then torch.compile of each block, then fully_shard
    (torchtitan's order, worker.training.fsdp.shard_model): the losses of one eager process.
    Inductor reorders float32 reductions and Muon rounds to bfloat16 (measured: 2.4e-6 relative at
    the third step); 1e-3 is far below what a stale weight or a dropped recompute does."""
    per_layer = {"use_checkpoint_per_layer": True}
    eager: list[dict[str, Any]] = []
    plan = tiny_plan(steps=3, model={"preset": "tiny", "overrides": per_layer})
    Trainer(
        plan, posix_store(tmp_path / "single"), hooks=TrainerHooks(on_metrics=eager.append)
    ).run()
    compiled = {**per_layer, "use_compile": True, "compile_mode": "default"}
    sharded = fsdp_plan(steps=3, nproc_per_node=2, model={"preset": "tiny", "overrides": compiled})
    result = launch_train(sharded, WorkerSettings(data_dir=tmp_path), ctx=None)
    assert result is not None
    got, expected = train_losses(result["metrics"]), train_losses(eager)
    print(f"eager: {expected}\ncompiled fsdp x2: {got}")
    assert len(got) == 3 and got == pytest.approx(expected, rel=1e-3)

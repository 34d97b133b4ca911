from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from tests.support.checkpoints import tensors
from tests.support.plans import train_plan
from tests.support.stores import entry_at, posix_store
from tests.support.train_script import run_script
from trainctl.store.checkpoints.manifests import MODEL_FILE, OPTIMIZER_FILE, verify_manifest
from trainctl.worker.checkpoints.async_save import AsyncCheckpointer, SaveAbandoned
from trainctl.worker.checkpoints.state import CheckpointState, capture_checkpoint, write_checkpoint
from trainctl.worker.checkpoints.training_state import Progress, TrainingState
from trainctl.worker.exceptions import CheckpointWriteFailed
from trainctl.worker.models.gpt import build_model
from trainctl.worker.training.hooks import TrainerHooks
from trainctl.worker.training.loop import train
from trainctl.worker.training.optim import Optimizers, build_optimizers

Parts = tuple[torch.nn.Module, Optimizers]


def trained(device: str = "cpu") -> Parts:
    model = build_model("tiny", seed=0, device=device)
    optimizers = build_optimizers(model)
    x = torch.zeros(1, 8, dtype=torch.long, device=device)
    model.loss(x, x)[0].backward()
    optimizers.step()
    return model, optimizers


def capture(parts: Parts, step: int = 1, dtype: torch.dtype | None = None) -> CheckpointState:
    return capture_checkpoint(TrainingState(*parts, None, "exp", Progress(step)), dtype=dtype)


def captured(
    step: int = 1, device: str = "cpu", dtype: torch.dtype | None = None
) -> tuple[torch.nn.Module, CheckpointState]:
    parts = trained(device)
    return parts[0], capture(parts, step, dtype)


@pytest.mark.slow
def test_the_background_save_writes_the_state_as_it_was_when_saved(tmp_path: Path) -> None:
    model, state = captured()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    saver = AsyncCheckpointer()
    saver.save(state, lambda s: write_checkpoint(s, posix_store(tmp_path)), {"step": 1})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # training goes on while the thread writes
    [done] = saver.wait()
    verify_manifest(entry_at(Path(done["path"])), deep=True)
    saved = load_file(str(Path(done["path"]) / "model.safetensors"))
    assert all(torch.equal(saved[k], before[k]) for k in saved)


def test_each_save_stages_into_the_same_buffers_never_the_live_tensors(tmp_path: Path) -> None:
    parts = trained()
    model, state = parts[0], capture(parts)
    live = {t.data_ptr() for t in [*state.model.values(), *tensors(state.optimizer)]}
    staged: list[list[int]] = []

    def write(s: CheckpointState) -> str:
        staged.append([t.data_ptr() for t in [*s.model.values(), *tensors(s.optimizer)]])
        return write_checkpoint(s, posix_store(tmp_path))

    saver = AsyncCheckpointer()
    saver.save(state, write, {"step": 1})
    saver.wait()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)
    saver.save(capture(parts, step=2), write, {"step": 2})
    [done] = saver.wait()
    first, second = staged
    assert first == second  # the second save reused every buffer of the first
    assert not set(first) & live
    saved = load_file(str(Path(done["path"]) / MODEL_FILE))
    assert all(torch.equal(saved[k], t) for k, t in model.state_dict().items())


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["master", "bf16"])
def test_an_async_save_writes_what_a_synchronous_one_does(
    tmp_path: Path, dtype: torch.dtype | None
) -> None:
    model, state = captured(dtype=dtype)
    sync = Path(write_checkpoint(state, posix_store(tmp_path / "sync")))
    saver = AsyncCheckpointer()
    saver.save(state, lambda s: write_checkpoint(s, posix_store(tmp_path / "async")), {"step": 1})
    [done] = saver.wait()
    staged = Path(done["path"])
    assert (staged / MODEL_FILE).read_bytes() == (sync / MODEL_FILE).read_bytes()
    saved = load_file(str(staged / MODEL_FILE))
    cast = dtype or torch.float32
    assert all(torch.equal(saved[k], t.to(cast)) for k, t in model.state_dict().items())
    # Same values, not the same bytes (nor were they before the copy at capture went): pickle
    # writes an object the live state_dict shares (AdamW's betas, one tuple for its groups)
    # once, and the staged state is a new nest of dicts, lists and tuples.
    a, b = (torch.load(d / OPTIMIZER_FILE, weights_only=True) for d in (staged, sync))
    assert a.keys() == b.keys()
    assert all(torch.equal(x, y) for x, y in zip(tensors(a), tensors(b), strict=True))


def test_a_failed_background_save_is_raised_on_the_training_thread(tmp_path: Path) -> None:
    _, state = captured()
    (tmp_path / "exp").write_text("a file where the experiment folder should be")
    saver = AsyncCheckpointer()
    saver.save(state, lambda s: write_checkpoint(s, posix_store(tmp_path)), {"step": 1})
    with pytest.raises(CheckpointWriteFailed):
        saver.wait()
    assert saver.wait() == []  # reported once


def test_at_most_one_save_is_in_flight(tmp_path: Path) -> None:
    _, state = captured()
    release, order = threading.Event(), []

    def slow_write(s: CheckpointState) -> str:
        release.wait(timeout=30)
        order.append(s.tag)
        return write_checkpoint(s, posix_store(tmp_path))

    saver = AsyncCheckpointer()
    saver.save(state, slow_write, {"step": 1})
    second = threading.Thread(target=lambda: saver.save(state, slow_write, {"step": 2}))
    second.start()
    second.join(timeout=0.5)
    assert second.is_alive() and order == []  # the second save waits for the first
    release.set()
    second.join(timeout=30)
    saver.wait()
    assert order == ["step_1", "step_1"]


@pytest.mark.slow
def test_a_stopped_async_run_leaves_its_checkpoint_before_it_returns(tmp_path: Path) -> None:
    steps: list[int] = []
    reported: list[dict[str, Any]] = []
    result = train(
        train_plan(experiment="e", steps=50, checkpoint_every=3, async_checkpoint=True),
        posix_store(tmp_path),
        hooks=TrainerHooks(
            on_metrics=lambda m: steps.append(m["step"]) if m["kind"] == "train" else None,
            on_checkpoint=reported.append,
            should_stop=lambda: len(steps) >= 7,
        ),
    )
    assert result["stopped"] and result["step"] == 7
    assert posix_store(tmp_path).latest("e").step == 7
    assert [r["step"] for r in reported if r["tag"].startswith("step_")] == [3, 6, 7]


@pytest.mark.slow
def test_resume_from_an_async_checkpoint_is_bit_identical(tmp_path: Path) -> None:
    common: dict[str, Any] = dict(
        steps=24,
        checkpoint_every=8,
        val_batches=2,
        batch={"micro_batch_size": 4, "seq_len": 64, "grad_accum_steps": 2},
    )
    straight = run_script(train_plan(experiment="straight", **common), tmp_path)
    first = run_script(
        train_plan(experiment="resumed", async_checkpoint=True, **common), tmp_path, stop_after=10
    )
    second = run_script(
        train_plan(
            tmp_path, experiment="resumed", resume_from="latest", async_checkpoint=True, **common
        ),
        tmp_path,
    )
    assert [r["step"] for r in second] == list(range(11, 25))
    assert [r["loss"] for r in first + second] == [r["loss"] for r in straight]
    a = load_file(str(tmp_path / "straight" / "step_24" / "model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "step_24" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["master", "bf16"])
def test_on_cuda_the_state_is_staged_in_pinned_buffers_and_saved_as_it_was(
    tmp_path: Path, dtype: torch.dtype | None
) -> None:
    model, state = captured(device="cuda", dtype=dtype)
    live = [*state.model.values(), *tensors(state.optimizer)]
    weights = {k: t.to(dtype or t.dtype).cpu() for k, t in state.model.items()}
    moments = [t.cpu() for t in tensors(state.optimizer)]
    sync = Path(write_checkpoint(state, posix_store(tmp_path / "sync")))
    staged: list[torch.Tensor] = []

    def write(s: CheckpointState) -> str:
        staged.extend([*s.model.values(), *tensors(s.optimizer)])
        return write_checkpoint(s, posix_store(tmp_path / "async"))

    saver = AsyncCheckpointer()
    saver.save(state, write, {"step": 1})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # queued on the stream behind the copies: they must not see it
    [done] = saver.wait()
    assert len(staged) == len(live) and all(t.device.type == "cpu" for t in staged)
    assert all(t.is_pinned() for t, source in zip(staged, live, strict=True) if source.is_cuda)
    saved = load_file(str(Path(done["path"]) / MODEL_FILE))
    assert saved.keys() == weights.keys()
    assert all(torch.equal(saved[k], weights[k]) for k in weights)
    assert (Path(done["path"]) / MODEL_FILE).read_bytes() == (sync / MODEL_FILE).read_bytes()
    # A synchronous save pickles the optimizer's CUDA tensors as such, a staged one CPU
    # copies: same values, not the same bytes.
    opt = torch.load(Path(done["path"]) / OPTIMIZER_FILE, weights_only=True)
    assert all(torch.equal(a, b) for a, b in zip(tensors(opt), moments, strict=True))


def test_a_save_abandoned_at_the_deadline_never_commits_however_late_its_write_ends(
    tmp_path: Path,
) -> None:
    _, state = captured()
    store, release, ended = posix_store(tmp_path), threading.Event(), threading.Event()

    def stuck_write(s: CheckpointState) -> str:
        try:
            release.wait(timeout=60)  # a store that stopped answering, until the test lets go
            return write_checkpoint(s, store, before_commit=AsyncCheckpointer.commit_gate)
        finally:
            ended.set()

    saver = AsyncCheckpointer()
    saver.save(state, stuck_write, {"step": 1})
    with pytest.raises(SaveAbandoned, match="did not commit by the drain's deadline"):
        saver.wait(until=time.monotonic())
    release.set()
    assert ended.wait(timeout=60)
    assert store.latest_or_none("exp") is None and store.list_checkpoints("exp") == []


def test_a_save_that_reached_its_commit_is_waited_for_past_the_deadline(tmp_path: Path) -> None:
    _, state = captured()
    store, committing, release = posix_store(tmp_path), threading.Event(), threading.Event()

    def gate_then_stall() -> None:
        AsyncCheckpointer.commit_gate()
        committing.set()
        release.wait(timeout=60)  # the commit's rename, slow

    saver = AsyncCheckpointer()
    saver.save(state, lambda s: write_checkpoint(s, store, before_commit=gate_then_stall), {})
    assert committing.wait(timeout=60)
    threading.Timer(0.5, release.set).start()  # after wait() finds it committing
    [done] = saver.wait(until=time.monotonic())
    assert store.latest("exp").tag == state.tag and done["committed_at"] is not None

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from store.checkpoints import CheckpointStore, verify_manifest
from tests.worker.test_train import run_script, spec
from worker.async_checkpoint import AsyncCheckpointer
from worker.checkpoint import CheckpointState, capture_checkpoint, write_checkpoint
from worker.exceptions import CheckpointWriteFailed
from worker.model import build_model
from worker.optim import build_optimizers
from worker.train import train


def captured(step: int = 1) -> tuple[torch.nn.Module, CheckpointState]:
    model = build_model("tiny", seed=0)
    muon, adamw = build_optimizers(model)
    model.loss(torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long))[
        0
    ].backward()
    muon.step()
    adamw.step()
    return model, capture_checkpoint(model, muon, adamw, None, step, 0, None, "exp")


def test_the_background_save_writes_the_state_as_it_was_when_saved(tmp_path: Path) -> None:
    model, state = captured()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    saver = AsyncCheckpointer()
    saver.save(state, lambda s: write_checkpoint(s, tmp_path), {"step": 1})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # training goes on while the thread writes
    [done] = saver.wait()
    verify_manifest(Path(done["path"]), deep=True)
    saved = load_file(str(Path(done["path"]) / "model.safetensors"))
    assert all(torch.equal(saved[k], before[k]) for k in saved)


def test_a_failed_background_save_is_raised_on_the_training_thread(tmp_path: Path) -> None:
    _, state = captured()
    (tmp_path / "exp").write_text("a file where the experiment folder should be")
    saver = AsyncCheckpointer()
    saver.save(state, lambda s: write_checkpoint(s, tmp_path), {"step": 1})
    with pytest.raises(CheckpointWriteFailed):
        saver.wait()
    assert saver.wait() == []  # reported once


def test_at_most_one_save_is_in_flight(tmp_path: Path) -> None:
    _, state = captured()
    release, order = threading.Event(), []

    def slow_write(s: CheckpointState) -> Path:
        release.wait(timeout=30)
        order.append(s.tag)
        return write_checkpoint(s, tmp_path)

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


def test_a_stopped_async_run_leaves_its_checkpoint_before_it_returns(tmp_path: Path) -> None:
    steps: list[int] = []
    reported: list[dict[str, Any]] = []
    result = train(
        spec(experiment="e", steps=50, checkpoint_every=3, async_checkpoint=True),
        tmp_path,
        on_metrics=lambda m: steps.append(m["step"]) if m["kind"] == "train" else None,
        on_checkpoint=reported.append,
        should_stop=lambda: len(steps) >= 7,
    )
    assert result["stopped"] and result["step"] == 7
    assert CheckpointStore(tmp_path).latest("e").step == 7
    assert [r["step"] for r in reported if r["tag"].startswith("step_")] == [3, 6, 7]


def test_resume_from_an_async_checkpoint_is_bit_identical(tmp_path: Path) -> None:
    common: dict[str, Any] = dict(
        steps=24,
        checkpoint_every=8,
        val_batches=2,
        batch={"micro_batch_size": 4, "seq_len": 64, "grad_accum_steps": 2},
    )
    straight = run_script(spec(experiment="straight", **common), tmp_path)
    first = run_script(
        spec(experiment="resumed", async_checkpoint=True, **common), tmp_path, stop_after=10
    )
    second = run_script(
        spec(experiment="resumed", resume_from="latest", async_checkpoint=True, **common),
        tmp_path,
    )
    assert [r["step"] for r in second] == list(range(11, 25))
    assert [r["loss"] for r in first + second] == [r["loss"] for r in straight]
    a = load_file(str(tmp_path / "straight" / "step_24" / "model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "step_24" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)

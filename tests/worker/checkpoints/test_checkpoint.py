from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.support.checkpoints import (
    Parts,
    find_latest_checkpoint,
    make_parts,
    save,
    tensors,
)
from tests.support.stores import entry_at, manifest_of, posix_store, write_entry
from trainctl.store.checkpoints.manifests import (
    MANIFEST_FILE,
    METADATA_FILE,
    MODEL_FILE,
    OPTIMIZER_FILE,
)
from trainctl.worker.checkpoints.state import capture_checkpoint, load_checkpoint
from trainctl.worker.checkpoints.training_state import Progress, TrainingState
from trainctl.worker.exceptions import (
    CheckpointCorrupt,
    CheckpointMismatch,
    LeaseExpired,
    LeaseLost,
)


def train_a_little(parts: Parts, steps: int = 3) -> None:
    model, optimizers, sched = parts
    x = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    for _ in range(steps):
        loss, _ = model.loss(x, x)
        loss.backward()
        optimizers.step()
        optimizers.zero_grad()
        sched.step()


def test_save_then_load_restores_model_optimizers_and_schedule(tmp_path: Path) -> None:
    parts = make_parts()
    train_a_little(parts)
    path = save(parts, tmp_path, 3, data_position=3, run_id="r1")
    assert sorted(p.name for p in path.iterdir()) == sorted(
        ["model.safetensors", "optimizer.pt", "metadata.json", "manifest.json"]
    )
    fresh = make_parts()
    meta = load_checkpoint(*fresh, entry_at(path))
    assert (meta["step"], meta["token_count"], meta["data_position"]) == (3, 300, 3)
    assert meta["run_id"] == "r1" and meta["model_config"]["d_model"] == 64
    assert {"torch", "python", "trainctl"} <= set(meta["versions"])
    for a, b in zip(parts[0].parameters(), fresh[0].parameters(), strict=True):
        assert torch.equal(a, b)
    assert fresh[2].lrs() == parts[2].lrs()
    for name in ("muon", "adamw"):
        assert (
            fresh[1][name].state_dict()["state"].keys()
            == parts[1][name].state_dict()["state"].keys()
        )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "names"), [("muon_adamw", ["muon", "adamw"]), ("adamw", ["adamw"])]
)
def test_the_optimizer_file_holds_each_optimizer_under_its_name(
    tmp_path: Path, kind: str, names: list[str]
) -> None:
    parts = make_parts(kind)
    train_a_little(parts, steps=1)
    path = save(parts, tmp_path, 1)
    saved = torch.load(path / OPTIMIZER_FILE, weights_only=True)
    assert list(saved) == names  # what checkpoints from before the container hold, too
    fresh = make_parts(kind)
    load_checkpoint(*fresh, entry_at(path))
    assert fresh[1].state_dict().keys() == parts[1].state_dict().keys()


def test_a_checkpoint_of_other_optimizers_is_refused_naming_both(tmp_path: Path) -> None:
    path = save(make_parts("muon_adamw"), tmp_path, 1)
    with pytest.raises(CheckpointMismatch) as caught:
        load_checkpoint(*make_parts("adamw"), entry_at(path))
    message = str(caught.value)
    assert "optimizer state is of adamw, muon" in message
    assert "optimizer kind 'adamw' trains with adamw" in message and str(path) in message


def test_weights_are_saved_in_the_master_dtype_unless_bf16_is_asked(tmp_path: Path) -> None:
    parts = make_parts()
    master = load_file(str(save(parts, tmp_path, 1) / MODEL_FILE))
    exported = load_file(str(save(parts, tmp_path, 2, dtype=torch.bfloat16) / MODEL_FILE))
    assert master["tok_emb.weight"].dtype == torch.float32
    assert exported["tok_emb.weight"].dtype == torch.bfloat16


def test_a_capture_holds_the_live_tensors_and_copies_none() -> None:
    parts = make_parts()
    train_a_little(parts, steps=1)
    model, optimizers, sched = parts
    training = TrainingState(model, optimizers, sched, "exp", Progress(step=1, token_count=100))
    state = capture_checkpoint(training, dtype=torch.bfloat16)
    live = model.state_dict()
    assert state.model.keys() == live.keys()
    # bf16 too: the cast is made by the one copy that writes or stages the weights.
    assert all(state.model[k].data_ptr() == live[k].data_ptr() for k in live)
    live_opt = {t.data_ptr() for o in optimizers.values() for t in tensors(list(o.state.values()))}
    captured_opt = [t.data_ptr() for t in tensors(state.optimizer)]
    assert captured_opt and set(captured_opt) == live_opt


def test_a_bf16_save_writes_the_live_weights_cast(tmp_path: Path) -> None:
    parts = make_parts()
    train_a_little(parts, steps=1)
    live = parts[0].state_dict()
    master = load_file(str(save(parts, tmp_path, 1) / MODEL_FILE))
    exported = load_file(str(save(parts, tmp_path, 2, dtype=torch.bfloat16) / MODEL_FILE))
    assert master.keys() == exported.keys() == live.keys()
    assert all(torch.equal(master[k], live[k]) for k in live)
    assert all(torch.equal(exported[k], live[k].to(torch.bfloat16)) for k in live)


def test_retention_keeps_max_keep_and_never_deletes_best_or_newest(tmp_path: Path) -> None:
    parts = make_parts()
    save(parts, tmp_path, 1, max_keep=2)
    save(parts, tmp_path, 2, max_keep=2, tag="best")
    for step in (2, 3, 4, 5):
        save(parts, tmp_path, step, max_keep=2)
    tags = sorted(p.name for p in (tmp_path / "exp").iterdir())
    assert tags == ["best", "step_4", "step_5"]
    assert find_latest_checkpoint(tmp_path / "exp") == tmp_path / "exp" / "step_5"


def test_a_retention_whose_lease_ran_out_in_an_outage_deletes_nothing_and_the_save_stands(
    tmp_path: Path,
) -> None:
    # The retention asks the run database what is protected, with its lease confirmed; a
    # lease that ran out while the database did not answer leaves every checkpoint, and the
    # committed save stands rather than ending the run (a run whose last save committed
    # keeps its success: tests/reliability/test_db_outage.py).
    def lease_ran_out() -> frozenset[tuple[str, str]]:
        raise LeaseExpired("the lease ran out while the run database did not answer")

    parts = make_parts()
    for step in (1, 2):
        save(parts, tmp_path, step, max_keep=1)
    assert sorted(p.name for p in (tmp_path / "exp").iterdir()) == ["step_2"]
    save(parts, tmp_path, 3, max_keep=1, protected=lease_ran_out)
    assert sorted(p.name for p in (tmp_path / "exp").iterdir()) == ["step_2", "step_3"]

    def lease_lost() -> frozenset[tuple[str, str]]:
        raise LeaseLost("another attempt has the run")

    with pytest.raises(LeaseLost):  # fenced out for good: the run stops
        save(parts, tmp_path, 4, max_keep=1, protected=lease_lost)


def test_a_flipped_byte_is_caught_by_the_manifest(tmp_path: Path) -> None:
    parts = make_parts()
    path = save(parts, tmp_path, 1)
    data = bytearray((path / OPTIMIZER_FILE).read_bytes())
    data[-10] ^= 0xFF
    (path / OPTIMIZER_FILE).write_bytes(bytes(data))
    with pytest.raises(CheckpointCorrupt, match=r"optimizer\.pt"):
        load_checkpoint(*make_parts(), entry_at(path))


def test_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    path = save(make_parts(), tmp_path, 1)
    (path / MODEL_FILE).unlink()
    with pytest.raises(CheckpointCorrupt, match=r"model\.safetensors"):
        load_checkpoint(*make_parts(), entry_at(path))


def test_loading_into_a_different_model_names_the_difference(tmp_path: Path) -> None:
    path = save(make_parts(), tmp_path, 1)
    with pytest.raises(CheckpointMismatch, match="n_layers: checkpoint 2 vs requested 3"):
        load_checkpoint(*make_parts(n_layers=3), entry_at(path))


def test_runtime_switches_do_not_block_loading(tmp_path: Path) -> None:
    path = save(make_parts(), tmp_path, 1)
    load_checkpoint(*make_parts(use_checkpoint_per_layer=True), entry_at(path))


CRASH_SCRIPT = """
import os, sys, threading, torch
from pathlib import Path
import trainctl.worker.checkpoints.state as checkpoint
from tests.support.checkpoints import make_parts, save
root = Path(sys.argv[1])
parts = make_parts()
save(parts, root, 1)
# Die for real (no cleanup, no exception handling) once the weights of step 2 are written
# and the optimizer file is about to be. The two files are written by two threads at once,
# so the crash waits for the weights (else it races them, and loses on a busy machine).
weights_written = threading.Event()
write_weights = checkpoint.write_safetensors
def write_and_tell(*args, **kwargs):
    write_weights(*args, **kwargs)
    weights_written.set()
def crash(*args, **kwargs):
    weights_written.wait(timeout=60)
    os._exit(9)
checkpoint.write_safetensors = write_and_tell
torch.save = crash
save(parts, root, 2)
"""


@pytest.mark.slow
def test_a_crash_between_the_files_of_a_save_leaves_no_visible_checkpoint(
    tmp_path: Path,
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CRASH_SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 9, proc.stderr
    store = posix_store(tmp_path)
    assert [c.tag for c in store.list_checkpoints("exp")] == ["step_1"]
    staged = [p for p in (tmp_path / "exp").iterdir() if p.name.startswith(".staging-")]
    assert staged and (staged[0] / MODEL_FILE).exists()  # the half-written save is hidden
    assert not (staged[0] / MANIFEST_FILE).exists()
    assert find_latest_checkpoint(tmp_path / "exp") == tmp_path / "exp" / "step_1"
    meta = load_checkpoint(*make_parts(), entry_at(tmp_path / "exp" / "step_1"))
    assert meta["step"] == 1
    store.cleanup("exp")
    assert sorted(p.name for p in (tmp_path / "exp").iterdir()) == ["step_1"]


def test_optimizer_state_is_loaded_with_weights_only(tmp_path: Path) -> None:
    import pickle

    path = save(make_parts(), tmp_path, 1)
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (exec, (f"open({str(marker)!r}, 'w').write('x')",))

    files = {name: (path / name).read_bytes() for name in (MODEL_FILE, METADATA_FILE)}
    files[OPTIMIZER_FILE] = pickle.dumps({"muon": Evil(), "adamw": {}}, protocol=2)
    write_entry(
        posix_store(tmp_path), "exp", path.name, {**files, MANIFEST_FILE: manifest_of(files)}
    )
    with pytest.raises(CheckpointCorrupt, match="refusing to unpickle"):
        load_checkpoint(*make_parts(), entry_at(path))
    assert not marker.exists()
    json.loads((path / "metadata.json").read_text())

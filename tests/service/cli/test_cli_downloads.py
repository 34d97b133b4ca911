"""What `trainctl checkpoints download` says it verified, against the real service: a file
is "sha256 verified" only when the manifest lists its sha256 (the SDK refuses one that
differs); a sharded checkpoint's model.safetensors is stitched by the service and listed
nowhere, and the line says so instead (docs/cli.md, "Commands")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.service.cli.invoke import trainctl
from tests.service.fakes import save_checkpoint
from tests.support.service_process import Service
from tests.support.stores import posix_store
from trainctl.store.checkpoints.manifests import MANIFEST_FILE, MODEL_FILE
from trainctl.store.training.optim import OptimizerSpec
from trainctl.worker.checkpoints.sharded import capture_sharded, write_sharded
from trainctl.worker.checkpoints.training_state import Progress, TrainingState
from trainctl.worker.models.gpt import build_model
from trainctl.worker.training.optim import build_optimizers


@pytest.fixture(scope="module")
def listed(service: Service) -> dict[str, list[str]]:
    """A sharded checkpoint (sharded/step_1) and a whole one (whole/step_10) in the service's
    store; the names each one's manifest lists."""
    ckpts = posix_store(service.data_dir / "checkpoints")
    model = build_model("tiny", seed=0)
    optimizers = build_optimizers(model, OptimizerSpec(kind="muon_adamw"))
    write_sharded(
        capture_sharded(TrainingState(model, optimizers, None, "sharded", Progress(1, 1))), ckpts
    )
    save_checkpoint(ckpts, "whole", step=10)
    return {
        "sharded": [f["name"] for f in ckpts.get("sharded", "step_1").files],
        "whole": [f["name"] for f in ckpts.get("whole", "step_10").files],
    }


def download(service: Service, dest: Path, experiment: str, tag: str, *names: str) -> str:
    files = [arg for name in names for arg in ("--file", name)]
    code, out, err = trainctl(
        service, "checkpoints", "download", experiment, tag, "-o", str(dest), *files
    )
    assert code == 0, err
    return " ".join(out.split())  # as one line, however the console wrapped it


def claimed(out: str) -> int:
    """How many files the line says were sha256 verified (0 where it claims none)."""
    found = re.search(r"(\d+) files?,? sha256 verified", out)
    return int(found.group(1)) if found else 0


@pytest.mark.slow
def test_a_stitched_model_file_is_never_said_to_be_verified(
    service: Service, listed: dict[str, list[str]], tmp_path: Path
) -> None:
    assert MODEL_FILE not in listed["sharded"]

    out = download(service, tmp_path / "model", "sharded", "step_1", MODEL_FILE)

    assert "sha256 verified" not in out and claimed(out) == 0
    assert f"{MODEL_FILE} not verified: stitched by the service from the shards" in out
    assert load_file(tmp_path / "model" / MODEL_FILE)  # the file did come


@pytest.mark.slow
@pytest.mark.parametrize(
    ("experiment", "tag", "names"),
    [
        ("sharded", "step_1", ()),  # every listed file and the manifest
        ("sharded", "step_1", (MODEL_FILE, MANIFEST_FILE)),
        ("sharded", "step_1", (MANIFEST_FILE,)),
        ("whole", "step_10", ()),
        ("whole", "step_10", (MODEL_FILE,)),
        ("whole", "step_10", (MANIFEST_FILE,)),
    ],
)
def test_every_verified_claim_counts_only_files_the_manifest_lists(
    service: Service,
    listed: dict[str, list[str]],
    tmp_path: Path,
    experiment: str,
    tag: str,
    names: tuple[str, ...],
) -> None:
    out = download(service, tmp_path / "d", experiment, tag, *names)

    fetched = names or (*listed[experiment], MANIFEST_FILE)
    checkable = [n for n in fetched if n in listed[experiment]]
    assert claimed(out) == len(checkable), out
    assert "0 files" not in out
    unlisted = [n for n in fetched if n not in listed[experiment] and n != MANIFEST_FILE]
    assert ("not verified" in out) == bool(unlisted), out

"""A sharded checkpoint (docs/design/checkpoints.md, "Sharded checkpoints") through the file and
archive routes: users get one model.safetensors, stitched from the shards as it streams."""

from __future__ import annotations

import io
import tarfile

import torch
from fastapi.testclient import TestClient
from safetensors.torch import load

from trainctl.store.checkpoints.manifests import MODEL_FILE
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.training.optim import OptimizerSpec
from trainctl.worker.checkpoints.sharded import capture_sharded, write_sharded
from trainctl.worker.checkpoints.training_state import Progress, TrainingState
from trainctl.worker.models.gpt import build_model
from trainctl.worker.training.optim import build_optimizers


def test_the_model_file_of_a_sharded_checkpoint_is_served_and_archived_whole(
    client: TestClient, ckpts: CheckpointStore
) -> None:
    model = build_model("tiny", seed=0)
    optimizers = build_optimizers(model, OptimizerSpec(kind="muon_adamw"))
    write_sharded(
        capture_sharded(TrainingState(model, optimizers, None, "exp", Progress(1, 1))), ckpts
    )
    assert MODEL_FILE not in {f["name"] for f in ckpts.get("exp", "step_1").files}

    url = "/checkpoints/exp/step_1/files/model.safetensors"
    got = client.get(url)
    assert got.status_code == 200
    assert int(got.headers["content-length"]) == len(got.content)
    weights = load(got.content)
    expected = model.state_dict()
    assert weights.keys() == expected.keys()
    assert all(torch.equal(weights[k], expected[k]) for k in expected)
    assert client.get(url, headers={"If-None-Match": got.headers["etag"]}).status_code == 304

    archive = client.get("/checkpoints/exp/step_1/archive")
    with tarfile.open(fileobj=io.BytesIO(archive.content), mode="r:") as tar:
        member = tar.extractfile(f"step_1/{MODEL_FILE}")
        assert member is not None and member.read() == got.content

"""A plug-in optimizer kind with hyperparameters of its own trains through the real API and a
real worker (store/training/choice.py): `rmsprop`, from tests/plugins/trainctl_rmsprop,
installed by pip as a distribution declaring it under `trainctl.optimizer_kinds` (its record
and settings model) and `trainctl.optimizers` (its builder) (tests/e2e/plugin_env.py). Its own
`rmsprop_lr` travels in the plan to the isolated worker's builder; the service checks it with
the plug-in's model and lists it in the schema."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.e2e.plugin_env import install_plugin, pyproject
from tests.e2e.runs import wait_done
from tests.support.service_process import Service
from trainctl.service.sdk.client import TrainctlClient

RMSPROP = pyproject(
    "trainctl-rmsprop",
    "trainctl_rmsprop",
    {
        "trainctl.optimizer_kinds": {"rmsprop": "trainctl_rmsprop.kind:RMSPROP"},
        "trainctl.optimizers": {"rmsprop": "trainctl_rmsprop.builder:BUILDER"},
    },
)
OPTIMIZER = {"kind": "rmsprop", "rmsprop_lr": 0.005, "rmsprop_alpha": 0.9}
REQUEST = {
    "experiment": "rmsprop",
    "steps": 12,
    "log_every": 1,
    "device": "cpu",
    "val_batches": 1,
    "data": {"source": "synthetic"},
    "batch": {"micro_batch_size": 2, "seq_len": 32, "grad_accum_steps": 1},
    "optimizer": OPTIMIZER,
}


@pytest.fixture(scope="module")
def rmsprop_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env, source = tmp_path_factory.mktemp("rmsprop-env"), tmp_path_factory.mktemp("rmsprop-src")
    return install_plugin(env, source, "trainctl_rmsprop", RMSPROP)


@pytest.mark.slow
def test_a_plugin_optimizer_kind_trains_with_its_own_settings_through_the_api(
    service: Service, rmsprop_python: Path
) -> None:
    service.argv = [str(rmsprop_python), "-m", "trainctl.service"]
    url = service.start().url

    schema = httpx.get(f"{url}/openapi.json", timeout=10).json()["components"]["schemas"]
    assert schema["OptimizerSpec"]["properties"]["rmsprop_lr"]["maximum"] == 1
    refused = httpx.post(
        f"{url}/runs/train", json=REQUEST | {"optimizer": OPTIMIZER | {"kind": "adamw"}}
    )
    assert refused.status_code == 422
    assert "optimizer kind 'adamw' does not read rmsprop_alpha, rmsprop_lr" in refused.text

    with TrainctlClient(url) as client:
        submitted = client.submit("train", REQUEST)
        run = wait_done(client, submitted.id, timeout=180)
        assert run.state == "succeeded", (run.error, service.log_tail())
        train = [m.model_extra or {} for m in client.metrics(run.id, kind="train")]
    assert run.spec["optimizer"] | OPTIMIZER == run.spec["optimizer"]
    # A 1 % warm-up of 12 steps is none: the first step trains at the plug-in's own lr.
    assert train[0]["lr/rmsprop"] == 0.005
    assert [m["step"] for m in train] == list(range(1, 13))

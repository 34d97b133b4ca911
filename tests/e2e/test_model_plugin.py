"""A plug-in model trains through the real API and a real worker (docs/models.md, "Plug-in
models"): `tiny_mlp`, from tests/plugins/trainctl_tinylm, installed by pip as a distribution
declaring it under `trainctl.models` (tests/e2e/plugin_env.py). Its workers report it, GET
/models lists it, and a run naming it trains; where no worker has it, the run waits, saying
why."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.e2e.plugin_env import install_plugin, pyproject
from tests.support.polling import poll
from tests.support.service_process import Service

TINYLM = pyproject(
    "trainctl-tinylm", "trainctl_tinylm", {"trainctl.models": {"tiny_mlp": "trainctl_tinylm:MODEL"}}
)
REQUEST = {
    "experiment": "plugin",
    "steps": 30,
    "model": {"plugin": {"name": "tiny_mlp", "config": {"vocab_size": 256, "max_seq_len": 32}}},
    "batch": {"micro_batch_size": 4, "seq_len": 32},
}


@pytest.fixture(scope="module")
def tinylm_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env, source = tmp_path_factory.mktemp("tinylm-env"), tmp_path_factory.mktemp("tinylm-src")
    return install_plugin(env, source, "trainctl_tinylm", TINYLM)


def test_a_plugin_model_is_listed_and_trains_through_the_api(
    service: Service, tinylm_python: Path
) -> None:
    service.argv = [str(tinylm_python), "-m", "trainctl.service"]
    url = service.start().url

    def listed() -> list[dict] | None:
        plugins = httpx.get(f"{url}/models", timeout=10).json()["plugins"]
        return plugins or None

    plugins = poll(listed, timeout=60, what="the worker's plug-ins in GET /models")
    assert [p["name"] for p in plugins] == ["tiny_mlp"]
    models = httpx.get(f"{url}/models", timeout=10).json()
    assert "tiny" in [p["name"] for p in models["presets"]]

    answer = httpx.post(f"{url}/runs/train", json=REQUEST, timeout=30)
    assert answer.status_code == 202, answer.text

    def done() -> dict | None:
        run = httpx.get(f"{url}/runs/{answer.json()['id']}", timeout=10).json()
        return run if run["state"] in ("succeeded", "failed", "cancelled") else None

    run = poll(done, timeout=180, what="the plug-in model's run to finish")
    assert run["state"] == "succeeded", (run.get("error"), service.log_tail())
    assert run["spec"]["model"]["config"]["plugin"] == "tiny_mlp"
    metrics = httpx.get(f"{url}/runs/{run['id']}/metrics", timeout=10).json()["items"]
    losses = [m["loss"] for m in metrics if m.get("kind") == "train" and "loss" in m]
    assert run["progress"]["step"] == 30 and losses[-1] < losses[0]


def test_a_run_naming_a_plugin_no_worker_has_waits_saying_so(service: Service) -> None:
    url = service.start().url
    assert httpx.get(f"{url}/models", timeout=10).json()["plugins"] == []
    answer = httpx.post(f"{url}/runs/train", json=REQUEST, timeout=30)
    assert answer.status_code == 202, answer.text
    run = httpx.get(f"{url}/runs/{answer.json()['id']}", timeout=10).json()
    assert run["state"] == "queued"
    assert "needs the plug-in model 'tiny_mlp'; no live worker has it" in run["waiting_reason"]

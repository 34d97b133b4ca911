"""Models over HTTP: what `model.hf` may hold at submit, and GET /models (docs/models.md)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.service.api.submits import CPU_TRAIN, submit
from tests.support.hf_archs import BASE
from trainctl.store.db.runs import RunStore

TINY_MOE = {"model_type": "qwen3_moe", **BASE}


def test_a_field_the_modeling_code_reads_is_accepted_and_planned(client: TestClient) -> None:
    response = submit(client, "train", {**CPU_TRAIN, "model": {"hf": {**TINY_MOE, "head_dim": 32}}})
    assert response.status_code == 202, response.text
    assert response.json()["spec"]["model"]["config"]["fields"]["head_dim"] == 32


def test_an_unknown_field_is_a_422_listing_the_accepted_ones(client: TestClient) -> None:
    response = submit(client, "train", {**CPU_TRAIN, "model": {"hf": {**TINY_MOE, "n_embd": 64}}})
    assert response.status_code == 422
    detail = response.text
    assert "Qwen3MoeConfig has no field n_embd" in detail and "head_dim" in detail


def test_models_lists_the_service_catalog_labelled_as_such_while_no_worker_reported(
    client: TestClient,
) -> None:
    models = client.get("/models").json()
    assert models["hf_model_types_from"] == "service"
    assert {"llama", "qwen3_moe", "deepseek_v3"} <= set(models["hf_model_types"])


def test_models_lists_the_transformers_types_the_live_workers_reported(
    client: TestClient, runs: RunStore
) -> None:
    runs.workers.register(
        "w1", host="n1", pid=1, device="cpu", info={}, hf_model_types=["llama", "qwen3"]
    )
    runs.workers.register("w2", host="n2", pid=2, device="cpu", info={}, hf_model_types=["olmo2"])
    models = client.get("/models").json()
    assert models["hf_model_types_from"] == "workers"
    assert models["hf_model_types"] == ["llama", "olmo2", "qwen3"]


def test_the_1b_and_8b_presets_are_listed_and_refused_on_a_small_cpu_node_with_the_numbers(
    client: TestClient, runs: RunStore
) -> None:
    presets = {p["name"]: p for p in client.get("/models").json()["presets"]}
    assert presets["1b"]["params"] == 1_235_816_448 and presets["8b"]["params"] == 7_504_932_864
    assert presets["8b"]["flops_per_token"] > presets["1b"]["flops_per_token"] > 0

    # A node like the one the tests run on: 2 cores, 24 GiB.
    runs.workers.register("w1", host="n1", pid=1, device="cpu", info={"memory_bytes": 24 << 30})
    for preset in ("1b", "8b"):
        response = submit(client, "train", {**CPU_TRAIN, "model": {"preset": preset}})
        assert response.status_code == 422
        detail = response.json()["detail"]
        assert "weights, gradients and optimizer state" in detail
        assert "more than the largest worker has: 24.0 GiB" in detail

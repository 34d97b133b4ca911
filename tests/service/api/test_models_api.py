"""Models over HTTP: what `model.hf` may hold at submit, and GET /models (docs/models.md)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.service.api.submits import CPU_TRAIN, submit
from tests.support.hf_archs import BASE, MOE
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


LLAMA = {"model_type": "llama", **BASE}
# What the estimate did not model, each seen to allocate tens of GB on a worker (issue 43).
UNMODELLED = [
    (
        {"model_type": "qwen3_next", **BASE, "linear_num_value_heads": 1 << 20},
        {},
        "linear_num_value_heads 1048576",
    ),
    (
        {"model_type": "deepseek_v3", **BASE, "num_key_value_heads": 4, "v_head_dim": 1 << 26},
        {},
        "v_head_dim 67108864",
    ),
    (
        {"model_type": "deepseek_v3", **BASE, "num_key_value_heads": 4, "kv_lora_rank": 1 << 26},
        {},
        "kv_lora_rank 67108864",
    ),
    (
        {"model_type": "qwen2_moe", **BASE, "shared_expert_intermediate_size": 1 << 30},
        {},
        "shared_expert_intermediate_size 1073741824",
    ),
    # 1,024 heads at 65,536 positions: every head's scores, 16 TiB in fp32.
    (
        {
            **LLAMA,
            "hidden_size": 2048,
            "num_attention_heads": 1024,
            "num_key_value_heads": 1024,
            "max_position_embeddings": 65536,
        },
        {"batch": {"micro_batch_size": 1, "seq_len": 65536}},
        "activations",
    ),
    # A size within its bound, but wide: a shared expert the old formula did not know of;
    # the estimate counts a matrix of the widest size per layer (24 x 1024 x 2^18 x 3).
    (
        {
            "model_type": "qwen2_moe",
            **BASE,
            "num_hidden_layers": 24,
            "hidden_size": 1024,
            **MOE,
            "shared_expert_intermediate_size": 1 << 18,
        },
        {},
        "weights, gradients and optimizer state",
    ),
]


@pytest.mark.parametrize(("hf", "run", "named"), UNMODELLED)
def test_what_the_estimate_did_not_model_is_a_422_at_submit(
    client: TestClient, runs: RunStore, hf: dict[str, Any], run: dict[str, Any], named: str
) -> None:
    runs.workers.register("w1", host="n1", pid=1, device="cpu", info={"memory_bytes": 24 << 30})
    response = submit(client, "train", {**CPU_TRAIN, **run, "model": {"hf": hf}})
    assert response.status_code == 422, response.text
    assert named in response.json()["detail"]

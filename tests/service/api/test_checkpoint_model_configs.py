"""What a checkpoint says is input too (docs/models.md, "What is checked where"): a checkpoint
planted in the store whose metadata.json names a field no request may set is refused by every
kind that reads one, at submit with a 422 naming the field, and by the worker before it builds
anything."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.service.api.submits import CPU_TRAIN, submit
from tests.service.fakes import save_checkpoint
from tests.support.hf_archs import hf
from trainctl.store.checkpoints.store import CheckpointStore

# What transformers would act on: a Hub kernel, remote code, a dtype of its choosing.
PLANTED = {
    "_attn_implementation": "kernels-community/flash-attn",
    "auto_map": ["AutoModelForCausalLM", "evil.Model"],
    "trust_remote_code": True,
    "torch_dtype": "float64",
    "attn_implementation": "flash_attention_2",
    "eos_token_id": 50000,  # a shape rule, as a request's is checked
    "num_attention_heads": 1 << 20,
}
KINDS: dict[str, dict[str, Any]] = {
    "validate": {"checkpoint": "planted/step_10"},
    "sample": {"checkpoint": "planted/step_10", "prompt_tokens": [[1, 2, 3]]},
    "export": {"checkpoint": "planted/step_10"},
    "evaluate": {"checkpoint": "planted/step_10", "tasks": ["hellaswag"], "limit": 1},
    "fork": {**CPU_TRAIN, "experiment": "fork", "fork_from": "planted/step_10"},
    "resume": {**CPU_TRAIN, "experiment": "planted", "resume_from": "step_10"},
}


def planted_config(field: str, value: Any) -> dict[str, Any]:
    request = hf("llama")
    fields = {k: v for k, v in request.items() if k != "model_type"}
    return {
        "model_type": "llama",
        "fields": {**fields, field: value},
        "vocab_size": 256,
        "max_seq_len": 128,
    }


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("field", PLANTED)
def test_a_checkpoint_whose_model_config_a_request_could_not_give_is_a_422_naming_it(
    client: TestClient, ckpts: CheckpointStore, kind: str, field: str
) -> None:
    save_checkpoint(ckpts, "planted", step=10, model_config=planted_config(field, PLANTED[field]))
    response = submit(client, "train" if kind in ("fork", "resume") else kind, KINDS[kind])
    assert response.status_code == 422, response.text
    assert field in response.json()["detail"], response.text

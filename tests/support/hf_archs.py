"""Tiny configs of the transformers architectures the tests train (docs/models.md): two
layers, width 64, a byte-level vocabulary of 256."""

from __future__ import annotations

from typing import Any

import pytest

BASE = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
}
MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64}
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama": {},
    "qwen3": {"head_dim": 16},
    "qwen3_moe": {**MOE, "output_router_logits": True},
    "olmo2": {},
    "gemma3_text": {"head_dim": 16, "sliding_window": 32},
    "deepseek_v3": {
        # Multi-head latent attention expands one latent into every head's keys and values.
        "num_key_value_heads": 4,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "n_group": 1,
        "topk_group": 1,
        "q_lora_rank": 32,
        "kv_lora_rank": 16,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8,
        "v_head_dim": 16,
    },
    "qwen3_next": {
        **MOE,
        "head_dim": 16,
        "shared_expert_intermediate_size": 64,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "layer_types": ["linear_attention", "full_attention"],
        "output_router_logits": True,
    },
}
# `make test` trains a dense model, an MoE and a hybrid; `make soak` trains every architecture.
IN_MAKE_TEST = ("llama", "qwen3_moe", "qwen3_next")
TRAINED = [
    pytest.param(m, marks=() if m in IN_MAKE_TEST else pytest.mark.soak) for m in ARCHITECTURES
]


def hf(model_type: str, **changes: Any) -> dict[str, Any]:
    """The `model.hf` of a request for the tiny `model_type`."""
    return {"model_type": model_type, **BASE, **ARCHITECTURES[model_type], **changes}

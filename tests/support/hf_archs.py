"""Tiny configs of the transformers architectures trainctl trains (docs/models.md,
`store.models.hf_catalog.SUPPORTED_MODEL_TYPES`): two layers, width 64, a byte-level
vocabulary of 256. `BASE`'s sizes go to every type under its own names (GPT-2's `n_embd`),
where it takes them; `ARCHITECTURES` and `OTHERS` add what each needs besides."""

from __future__ import annotations

from typing import Any

import pytest

from trainctl.store.models.hf_catalog import attribute_map, config_fields

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
# Token ids inside the byte vocabulary, for types whose defaults are a real tokenizer's.
BYTE_IDS = {"bos_token_id": 1, "eos_token_id": 2}
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama": {},
    "qwen3": {"head_dim": 16},
    "qwen3_moe": {**MOE, "output_router_logits": True},
    "olmo2": {"eos_token_id": 2},
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
"""The architectures trained in depth (a run that learns, resume, export, samples)."""
OTHERS: dict[str, dict[str, Any]] = {
    "falcon": {"num_kv_heads": 2, **BYTE_IDS},
    "gemma": {"head_dim": 16},
    "gemma2": {"head_dim": 16, "sliding_window": 32},
    "gpt2": BYTE_IDS,
    "gpt_neox": {},
    "granite": {},
    "mamba": {"state_size": 8},
    "mistral": {"head_dim": 16},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "olmo": {"eos_token_id": 2},
    "olmo3": {"eos_token_id": 2},
    "olmoe": {"num_experts": 4, "num_experts_per_tok": 2, "eos_token_id": 2},
    "phi": {},
    "phi3": {"pad_token_id": 0, "eos_token_id": 2},
    "qwen2": {},
    "qwen2_moe": {**MOE, "shared_expert_intermediate_size": 64},
    "rwkv": {"attention_hidden_size": 64},
    "stablelm": {},
    "starcoder2": BYTE_IDS,
}
"""The other types trainctl trains: a step each (tests/worker/models/test_hf_listing.py)."""
TINY = ARCHITECTURES | OTHERS
# `make test` trains a dense model, an MoE and a hybrid; `make soak` trains every architecture.
IN_MAKE_TEST = ("llama", "qwen3_moe", "qwen3_next")
TRAINED = [
    pytest.param(m, marks=() if m in IN_MAKE_TEST else pytest.mark.soak) for m in ARCHITECTURES
]


def base(model_type: str) -> dict[str, Any]:
    """`BASE` under `model_type`'s own names, the sizes it takes only."""
    names, taken = attribute_map(model_type), config_fields(model_type) or frozenset()
    own = {names.get(k, k): v for k, v in BASE.items()}
    return {k: v for k, v in own.items() if k in taken}


def hf(model_type: str, **changes: Any) -> dict[str, Any]:
    """The `model.hf` of a request for the tiny `model_type`."""
    return {"model_type": model_type, **base(model_type), **TINY[model_type], **changes}

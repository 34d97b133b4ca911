"""Shapes a transformers architecture cannot take, refused at submit (docs/models.md).

The config classes accept these and transformers builds the model, but its forward pass
fails with a bare torch error (a `view` that does not fit, a `topk` larger than its input)
at the run's first step. Each rule here names the field and says why, read from the
modeling code of the architectures trainctl tests. A rule is checked only where every
field it reads is known at submit (the request's or a literal default, `store.models.hf`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ShapeRule:
    model_types: frozenset[str]
    field: str
    """The field the refusal names."""
    rule: str
    """The rule, in words."""
    holds: Callable[[dict[str, Any]], bool]
    needs: tuple[str, ...]
    """The fields `holds` reads; the rule is skipped unless all are known integers."""


def _head_dim(c: dict[str, Any]) -> int:
    head_dim = c.get("head_dim")
    return head_dim if head_dim else c["hidden_size"] // c["num_attention_heads"]


ROTARY = frozenset({"llama", "qwen3", "qwen3_moe", "olmo2", "gemma3_text"})
MOE_TOPK = frozenset({"qwen3_moe", "qwen3_next"})
RULES = (
    ShapeRule(
        ROTARY,
        "head_dim",
        "rotary embeddings rotate pairs of a head's channels: the head dimension "
        "(head_dim, or hidden_size / num_attention_heads) must be even",
        lambda c: _head_dim(c) % 2 == 0,
        ("hidden_size", "num_attention_heads"),
    ),
    ShapeRule(
        MOE_TOPK,
        "num_experts_per_tok",
        "each token is routed to num_experts_per_tok of the num_experts experts: at most "
        "num_experts",
        lambda c: c["num_experts_per_tok"] <= c["num_experts"],
        ("num_experts_per_tok", "num_experts"),
    ),
    ShapeRule(
        frozenset({"qwen3_moe", "qwen3_next"}),
        "decoder_sparse_step",
        "every decoder_sparse_step-th layer is an MoE layer: at least 1",
        lambda c: c["decoder_sparse_step"] >= 1,
        ("decoder_sparse_step",),
    ),
    ShapeRule(
        frozenset({"qwen3_next"}),
        "linear_num_value_heads",
        "Gated DeltaNet shares each key head among a whole number of value heads: "
        "linear_num_value_heads must be a multiple of linear_num_key_heads",
        lambda c: c["linear_num_value_heads"] % c["linear_num_key_heads"] == 0,
        ("linear_num_value_heads", "linear_num_key_heads"),
    ),
    ShapeRule(
        frozenset({"deepseek_v3"}),
        "num_key_value_heads",
        "multi-head latent attention expands one latent into every head's keys and values: "
        "num_key_value_heads must equal num_attention_heads",
        lambda c: c["num_key_value_heads"] == c["num_attention_heads"],
        ("num_key_value_heads", "num_attention_heads"),
    ),
    ShapeRule(
        frozenset({"deepseek_v3"}),
        "qk_rope_head_dim",
        "rotary embeddings rotate pairs of channels: qk_rope_head_dim must be even",
        lambda c: c["qk_rope_head_dim"] % 2 == 0,
        ("qk_rope_head_dim",),
    ),
    ShapeRule(
        frozenset({"deepseek_v3"}),
        "n_group",
        "the router splits the experts into n_group equal groups of at least 2 (it scores "
        "a group by its best two): n_routed_experts must be a multiple of n_group, at least "
        "twice it",
        lambda c: (
            c["n_routed_experts"] % c["n_group"] == 0 and c["n_routed_experts"] >= 2 * c["n_group"]
        ),
        ("n_routed_experts", "n_group"),
    ),
    ShapeRule(
        frozenset({"deepseek_v3"}),
        "topk_group",
        "the router keeps topk_group of the n_group groups: at most n_group",
        lambda c: c["topk_group"] <= c["n_group"],
        ("topk_group", "n_group"),
    ),
    ShapeRule(
        frozenset({"deepseek_v3"}),
        "num_experts_per_tok",
        "each token is routed to num_experts_per_tok of the n_routed_experts experts: at "
        "most n_routed_experts",
        lambda c: c["num_experts_per_tok"] <= c["n_routed_experts"],
        ("num_experts_per_tok", "n_routed_experts"),
    ),
)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_shapes(model_type: str, config: dict[str, Any]) -> None:
    """ValueError naming the field and the rule for the first of `RULES` the config breaks."""
    for rule in RULES:
        if model_type not in rule.model_types:
            continue
        if not all(_is_number(config.get(key)) for key in rule.needs):
            continue
        try:
            holds = rule.holds(config)
        except ZeroDivisionError:  # a count of 0 where the rule divides by it
            holds = False
        if not holds:
            named = dict.fromkeys((rule.field, *rule.needs))
            got = ", ".join(f"{key} {config.get(key)!r}" for key in named)
            raise ValueError(f"{rule.field}: {rule.rule} (got {got})")

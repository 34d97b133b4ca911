"""Shapes a transformers architecture cannot take, refused at submit (docs/models.md).

The config classes accept these and transformers builds the model, but its forward pass
fails with a bare torch error (a `view` that does not fit, a `topk` larger than its input,
an embedding row past the table) at the run's first step. Each rule names the field and says
why. The generic ones read only the fields' names, for every architecture alike: token ids
below `vocab_size` (`check_token_ids`), an even rotary dimension wherever the config has
rotary settings (`check_rotary`), and a bound on every size (`check_dimensions`), so that
what a model allocates is what the memory estimate counts. `RULES` are an architecture's
own, read from its modeling code. A rule is checked only where every field it reads is
known (at submit: the request's or a literal default, `store.models.hf`; at the worker, the
built config's every field).
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


MOE_TOPK = frozenset({"qwen3_moe", "qwen3_next"})
RULES = (
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


# Fields whose presence says the architecture rotates channels (RoPE): its rotary dimension
# must be even, since rotary embeddings rotate pairs of channels.
ROTARY_FIELDS = frozenset(
    {
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "rope_interleave",
        "rotary_pct",
        "rotary_emb_base",
        "rotary_dim",
        "partial_rotary_factor",
        "qk_rope_head_dim",
    }
)
# The most a size may be, by what its name says it counts: heads, experts, groups and
# layers are counts; a per-head dimension is at most a few thousand channels; any other
# width (a hidden, intermediate or latent size, a rank) at most the built-in model's widest.
COUNT_MAX = 1024
HEAD_DIM_MAX = 1 << 12
WIDTH_MAX = 1 << 18
COUNT_WORDS = ("heads", "experts", "group", "layers")
WIDTH_WORDS = ("size", "dim", "rank", "width", "channels")


def dimension_cap(key: str) -> int | None:
    """The most a field named `key` may be, by its name; None for what is not a size (a
    token id, a theta, a window, a position count: bounded elsewhere or allocating nothing)."""
    name = key.lower()
    if "token_id" in name or "position" in name or "vocab" in name:
        return None
    if "head_dim" in name:
        return HEAD_DIM_MAX
    if any(word in name for word in COUNT_WORDS):
        return COUNT_MAX
    if any(word in name for word in WIDTH_WORDS):
        return WIDTH_MAX
    return None


def _integers(value: Any) -> list[int]:
    items = value if isinstance(value, list) else [value]
    return [v for v in items if isinstance(v, int) and not isinstance(v, bool)]


def check_dimensions(config: dict[str, Any], skip: frozenset[str] = frozenset()) -> None:
    """ValueError naming every size field above its cap (`dimension_cap`), so that no one
    field can make the model allocate more than the memory estimate sees: 2^20 heads of
    linear attention, a latent rank of 2^26, a shared expert of 2^30."""
    over = []
    for key, value in config.items():
        cap = dimension_cap(key) if key not in skip else None
        if cap is None:
            continue
        if any(v > cap or v < 0 for v in _integers(value)):
            over.append(f"{key} {value!r} (at most {cap:,})")
    if over:
        raise ValueError(
            f"{', '.join(over)}: a size beyond what any model trainctl runs has; the bound "
            "keeps what the model allocates within what submit estimates"
        )


def check_token_ids(config: dict[str, Any], vocab: int) -> None:
    """ValueError naming every token id (`pad_token_id`, `bos_token_id`, `eos_token_id`,
    `decoder_start_token_id`, ...: any field so named, a literal default included) outside
    the vocabulary: the embedding has `vocab_size` rows (a padding row past it fails the
    build; an eos past it is never produced)."""
    bad = sorted(
        f"{key} {value!r}"
        for key, value in config.items()
        if key.endswith(("token_id", "token_ids"))
        and value is not None
        and (
            any(v < 0 or v >= vocab for v in _integers(value))
            or len(_integers(value)) != len(value if isinstance(value, list) else [value])
        )
    )
    if bad:
        raise ValueError(
            f"{', '.join(bad)}: token ids are from 0 to vocab_size - 1 ({vocab - 1}); set "
            "each to an id of the vocabulary, or to null"
        )


def _known_int(config: dict[str, Any], key: str) -> int | None:
    value = config.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def check_rotary(config: dict[str, Any], fields: frozenset[str]) -> None:
    """ValueError naming the field when the architecture rotates channels (`fields`, what
    its config takes, has rotary settings) and its rotary dimension is odd: `qk_rope_head_dim`
    (latent attention), `rotary_dim`, or the head dimension (`head_dim`, or hidden_size /
    num_attention_heads) times `partial_rotary_factor` (`rotary_pct`)."""
    if not fields & ROTARY_FIELDS:
        return
    rule = "rotary embeddings rotate pairs of channels: the rotary dimension must be even"
    for key in ("qk_rope_head_dim", "rotary_dim"):
        dim = _known_int(config, key)
        if key in fields and dim is not None:
            if dim % 2:
                raise ValueError(f"{key}: {rule} (got {key} {dim})")
            return
    hidden, heads = _known_int(config, "hidden_size"), _known_int(config, "num_attention_heads")
    head_dim = _known_int(config, "head_dim")
    if head_dim is not None:
        source = f"head_dim {head_dim}"
    elif hidden is not None and heads is not None:
        head_dim = hidden // heads
        source = f"head_dim {head_dim} (hidden_size {hidden} / num_attention_heads {heads})"
    else:
        return
    factor = next(
        (
            config[key]
            for key in ("partial_rotary_factor", "rotary_pct")
            if _is_number(config.get(key))
        ),
        1.0,
    )
    dim = int(head_dim * factor)
    if dim % 2:
        part = f", times the rotary fraction {factor}: {dim}" if factor != 1.0 else ""
        raise ValueError(f"head_dim: {rule} (got {source}{part})")


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

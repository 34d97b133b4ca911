"""A transformers architecture named in a request: `model: {"hf": {"model_type": ..., ...}}`.

The request names a model type transformers ships and the config fields to change from
its defaults; the worker builds it with `AutoConfig.for_model` and
`AutoModelForCausalLM.from_config` (worker/models/hf.py). Nothing in a request is imported
or executed: no remote code, no `auto_map`, no path to load from, and values are JSON
scalars and lists only. What submit can know without torch it checks here against
transformers' own source (`store.models.hf_catalog`); the rest the worker checks when it builds
the model, before the first step (docs/models.md, "What is checked where").
"""

from __future__ import annotations

from typing import Any

from trainctl.store.models.hf_catalog import (
    MISSING,
    attribute_map,
    config_fields,
    config_signature,
    supported_model_types,
)
from trainctl.store.models.hf_rules import (
    check_dimensions,
    check_rotary,
    check_shapes,
    check_token_ids,
)
from trainctl.store.models.presets import BOUNDS

MODEL_TYPE = "model_type"
# Fields that would make transformers load or run something from elsewhere, or that
# trainctl decides itself (the weights' dtype, the attention kernel), never a request.
REFUSED_FIELDS = frozenset(
    {
        "auto_map",
        "trust_remote_code",
        "name_or_path",
        "architectures",
        "transformers_version",
        "torch_dtype",
        "dtype",
        "quantization_config",
        "attn_implementation",
        "use_cache",
        "return_dict",
        "torchscript",
    }
)
# PretrainedConfig's own arguments that a causal LM's config takes through **kwargs.
BASE_FIELDS = frozenset({"tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id"})
# A dict value is allowed only here, and holds scalars and lists (RoPE's scaling settings).
DICT_FIELDS = frozenset({"rope_scaling", "rope_parameters"})
MAX_FIELDS = 256
MAX_LIST_LENGTH = 4096
# The sizes every model type names alike, bounded as the built-in model's are.
SIZE_BOUNDS = {
    "vocab_size": BOUNDS["vocab_size"],
    "max_position_embeddings": BOUNDS["max_seq_len"],
    "hidden_size": BOUNDS["d_model"],
    "num_hidden_layers": BOUNDS["n_layers"],
    "num_attention_heads": BOUNDS["n_heads"],
    "num_key_value_heads": BOUNDS["n_kv_heads"],
    "intermediate_size": BOUNDS["ffn_hidden"],
}


def _check_value(key: str, value: Any, depth: int = 0) -> None:
    if value is None or isinstance(value, bool | int | float | str):
        if (isinstance(value, float) and value != value) or value in (float("inf"), -float("inf")):
            raise ValueError(f"{key}: {value} is not a finite number")
        return
    if isinstance(value, list) and depth < 2 and len(value) <= MAX_LIST_LENGTH:
        for item in value:
            _check_value(key, item, depth + 1)
        return
    if isinstance(value, dict) and depth == 0 and key.rsplit(".", 1)[-1] in DICT_FIELDS:
        for k, item in value.items():
            if isinstance(item, dict):
                raise ValueError(f"{key}.{k}: a scalar or a list, not an object")
            _check_value(f"{key}.{k}", item, depth + 1)
        return
    raise ValueError(
        f"{key}: values are JSON scalars or lists of them"
        + (
            f" ({', '.join(sorted(DICT_FIELDS))} may be an object)"
            if isinstance(value, dict)
            else ""
        )
    )


def check_values(fields: dict[str, Any], where: str = "") -> None:
    """Every value JSON scalars or lists of them (two levels); an object only under
    `DICT_FIELDS`. ValueError naming the field (after `where`, e.g. 'config.')."""
    for key, value in fields.items():
        if not isinstance(key, str):
            raise ValueError(f"{where}{key!r}: field names are strings")
        _check_value(f"{where}{key}", value)


def check_hf_fields(hf: dict[str, Any]) -> dict[str, Any]:
    """The `model.hf` of a request, checked: ValueError naming what is wrong."""
    model_type = hf.get(MODEL_TYPE)
    if not isinstance(model_type, str) or not model_type:
        raise ValueError(f"{MODEL_TYPE}: name a transformers model type, e.g. 'llama' or 'qwen3'")
    known = supported_model_types()
    if known is not None and model_type not in known:
        raise ValueError(
            f"{MODEL_TYPE} {model_type!r} is not a causal LM that trainctl trains (of those "
            "transformers ships, the ones tested to build and train); GET /models lists them"
        )
    fields = {k: v for k, v in hf.items() if k != MODEL_TYPE}
    if len(fields) > MAX_FIELDS:
        raise ValueError(f"at most {MAX_FIELDS} config fields, got {len(fields)}")
    refused = sorted(k for k in fields if k in REFUSED_FIELDS or k.startswith("_"))
    if refused:
        raise ValueError(
            f"{', '.join(refused)}: not accepted in a request (trainctl never loads remote "
            "code or files, and chooses dtype and kernels itself)"
        )
    check_values(fields)
    # What the config class takes and what the architecture's modeling code reads (a field
    # taken through **kwargs, such as Qwen3-MoE's head_dim, is one the model uses).
    signature, taken = config_signature(model_type), config_fields(model_type)
    if signature is not None and taken is not None:
        unknown = sorted(k for k in fields if k not in taken and k not in BASE_FIELDS)
        if unknown:
            accepted = (taken | BASE_FIELDS) - REFUSED_FIELDS - {"kwargs"}
            raise ValueError(
                f"{signature.class_name} has no field {', '.join(unknown)} (neither its "
                f"__init__ nor the model's code reads it); its fields are "
                f"{', '.join(sorted(accepted))}"
            )
    return hf


def known_fields(hf: dict[str, Any]) -> dict[str, Any]:
    """The config as far as submit knows it: the class's literal defaults, then the
    request's fields. A default computed in `__init__` is absent."""
    signature = config_signature(hf[MODEL_TYPE])
    defaults = signature.defaults if signature is not None else {}
    known = {k: v for k, v in defaults.items() if v is not MISSING}
    return known | {k: v for k, v in hf.items() if k != MODEL_TYPE}


def common_view(model_type: str, config: dict[str, Any]) -> dict[str, Any]:
    """`config` with each field the class names its own way (GPT-2's `n_embd`, RWKV's
    `context_length`) also under its common name (`hidden_size`, `max_position_embeddings`),
    as transformers' `attribute_map` maps them: the rules read the common names."""
    view = dict(config)
    for common, own in attribute_map(model_type).items():
        if own in config:
            view[common] = config[own]
    return view


def _positive_int(config: dict[str, Any], key: str, named: str) -> int | None:
    value = config.get(key)
    if value is None:
        return None
    low, high = SIZE_BOUNDS.get(key, (1, 1 << 30))
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(
            f"{named} must be an integer from {int(low)} to {int(high):,}, got {value!r}"
        )
    return value


def takes_positions(model_type: str) -> bool:
    """Whether the architecture has a longest context (`max_position_embeddings` under some
    name); Mamba's recurrence has none. True where the config class cannot be read."""
    taken = config_fields(model_type)
    own = attribute_map(model_type).get("max_position_embeddings", "max_position_embeddings")
    return taken is None or own in taken


def check_config(model_type: str, config: dict[str, Any]) -> tuple[int, int]:
    """(vocab_size, longest context) of `config`, a model type's fields (submit's known
    ones, or at the worker the built config's every field), after every rule that reads
    only fields: sizes, head counts, token ids, rotary, the architecture's own shapes.
    ValueError naming the field."""
    names = attribute_map(model_type)
    view = common_view(model_type, config)
    sizes = {key: _positive_int(view, key, names.get(key, key)) for key in SIZE_BOUNDS}
    check_dimensions(view, skip=frozenset(SIZE_BOUNDS) | frozenset(names.values()))
    heads, kv = sizes["num_attention_heads"], sizes["num_key_value_heads"]
    hidden = sizes["hidden_size"]
    if heads is not None and kv is not None and heads % kv:
        raise ValueError(
            f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}: "
            "grouped-query attention shares each key/value head among a whole number of heads"
        )
    if heads is not None and hidden is not None and view.get("head_dim") is None and hidden % heads:
        raise ValueError(
            f"hidden_size {hidden} is not divisible by num_attention_heads {heads}, and no "
            "head_dim is given"
        )
    vocab, context = sizes["vocab_size"], sizes["max_position_embeddings"]
    if context is None and not takes_positions(model_type):
        context = int(SIZE_BOUNDS["max_position_embeddings"][1])  # no limit of its own
    if vocab is None or context is None:
        positions = names.get("max_position_embeddings", "max_position_embeddings")
        raise ValueError(
            f"give vocab_size and {positions}: this model type's defaults for them cannot "
            "be read at submit"
        )
    check_token_ids(view, vocab)
    check_rotary(view, (config_fields(model_type) or frozenset()) | frozenset(view))
    check_shapes(model_type, view)
    return vocab, context


def check_geometry(hf: dict[str, Any]) -> tuple[int, int]:
    """(vocab_size, max_position_embeddings) of a request's config, after the rules that
    can be checked without building it (`check_config`); ValueError naming the field."""
    return check_config(hf[MODEL_TYPE], known_fields(hf))

"""A transformers model as a plan holds it (docs/models.md): the request's model type and
fields, and the sizes submit read from them (store.models.hf)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, StrictBool, StrictInt, model_validator

from trainctl.store.models.hf import (
    MODEL_TYPE,
    SIZE_BOUNDS,
    check_geometry,
    check_hf_fields,
    common_view,
    known_fields,
)
from trainctl.store.models.hf_rules import COUNT_MAX, HEAD_DIM_MAX, dimension_cap
from trainctl.store.models.plugin import PLUGIN, PluginModelConfig
from trainctl.store.models.presets import ModelConfig
from trainctl.store.specs import Spec


class HfModelConfig(Spec):
    """A transformers model as a plan holds it: what builds it, and the sizes submit read."""

    model_type: str = Field(description="The transformers model type (config.json's).")
    fields: dict[str, Any] = Field(
        description="Config fields changed from the model type's defaults: the request's."
    )
    vocab_size: StrictInt = Field(ge=1, description="Token ids are below this.")
    max_seq_len: StrictInt = Field(ge=1, description="max_position_embeddings.")
    use_checkpoint_per_layer: StrictBool = Field(
        False, description="Gradient checkpointing (transformers' own, per layer)."
    )
    use_compile: StrictBool = Field(False, description="torch.compile the model.")
    compile_mode: str = Field("default", description="torch.compile mode.")

    @model_validator(mode="after")
    def _as_a_request_is(self) -> HfModelConfig:
        """Every config, wherever it comes from (a request, a plan, a checkpoint's or an
        export's metadata.json, written by whoever could write the store), passes the rules a
        request's does: no field a request may not set (`auto_map`, `_attn_implementation`,
        `torch_dtype`), a type trainctl trains, the shapes and sizes it can run. The one
        check on every path that reads a model config (docs/models.md, "What is checked
        where"); ValueError naming the field."""
        hf = {MODEL_TYPE: self.model_type, **self.fields}
        check_hf_fields(hf)
        check_geometry(hf)
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HfModelConfig:
        return cls.model_validate(data)

    def replace(self, **changes: Any) -> HfModelConfig:
        return self.model_copy(update=changes)

    def architecture(self) -> dict[str, Any]:
        """What decides the weights: two configs alike here load each other's checkpoints."""
        return {"model_type": self.model_type, **self.fields}

    def differences(self, other: Any) -> dict[str, tuple[Any, Any]]:
        """Architecture fields that differ ({field: (ours, theirs)}); a built-in model's
        config differs in everything, under `model`."""
        if not isinstance(other, HfModelConfig):
            return {"model": (self.model_type, "trainctl gpt")}
        ours, theirs = self.architecture(), other.architecture()
        return {
            k: (ours.get(k), theirs.get(k)) for k in ours | theirs if ours.get(k) != theirs.get(k)
        }

    def sizes(self) -> dict[str, int]:
        """Approximate sizes for the memory estimate (store.training.memory): the parameters from
        the config's widths, as a dense or MoE decoder has them, and at least a matrix of the
        widest size the config names (any field `hf_rules.dimension_cap` calls a width: a
        shared expert, a latent rank, a linear-attention head's width times its heads) per
        layer; the worker counts the real ones when it builds the model, on the meta device,
        before it allocates anything (worker/training/memory.py)."""
        known = common_view(
            self.model_type, known_fields({MODEL_TYPE: self.model_type, **self.fields})
        )

        def get(*keys: str, default: int = 0) -> int:
            for key in keys:
                value = known.get(key)
                if isinstance(value, int) and not isinstance(value, bool):
                    return value
            return default

        d = get("hidden_size", default=1)
        layers = get("num_hidden_layers", default=1)
        heads = get("num_attention_heads", default=1)
        head_dim = get("head_dim", default=max(d // max(heads, 1), 1))
        kv = get("num_key_value_heads", default=heads) * head_dim
        ffn = get("intermediate_size", default=4 * d)
        experts = get("num_experts", "n_routed_experts", "num_local_experts")
        expert_ffn = get("moe_intermediate_size", default=ffn)
        mlp = 3 * d * (expert_ffn * experts if experts else ffn)
        attention = 2 * d * heads * head_dim + 2 * d * kv
        untied = 1 if known.get("tie_word_embeddings") else 2
        widest = max(ffn, heads * head_dim, *self._widths(known))
        params = untied * self.vocab_size * d + layers * max(
            attention + mlp + 4 * d, 3 * d * widest
        )
        return {
            "params": params,
            "d_model": d,
            "ffn": widest,
            "kv": kv,
            "layers": layers,
            "cache_layers": layers,
            "heads": max([heads, *self._counts(known, "heads")]),
        }

    @staticmethod
    def _counts(known: dict[str, Any], word: str) -> list[int]:
        return [
            v
            for k, v in known.items()
            if word in k and isinstance(v, int) and not isinstance(v, bool) and v > 0
        ]

    @classmethod
    def _widths(cls, known: dict[str, Any]) -> list[int]:
        """Every width the config names, a per-head one times the most heads it names."""
        most_heads = max([1, *cls._counts(known, "heads")])
        widths = []
        for key, value in known.items():
            cap = dimension_cap(key)
            if cap is None or cap == COUNT_MAX or key in SIZE_BOUNDS:
                continue
            for v in value if isinstance(value, list) else [value]:
                if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                    widths.append(v * most_heads if cap == HEAD_DIM_MAX else v)
        return widths

    @classmethod
    def of_request(cls, hf: dict[str, Any]) -> HfModelConfig:
        vocab, context = check_geometry(hf)
        fields = {k: v for k, v in hf.items() if k != MODEL_TYPE}
        return cls(model_type=hf[MODEL_TYPE], fields=fields, vocab_size=vocab, max_seq_len=context)


AnyModelConfig = ModelConfig | HfModelConfig | PluginModelConfig
"""A model a plan or a checkpoint names: the built-in GPT's config, a transformers one or a
plug-in's."""


def model_config_from_dict(data: dict[str, Any]) -> AnyModelConfig:
    """A checkpoint's `model_config` (or a plan's), by its tag (`model_tag`)."""
    tag = model_tag(data)
    if tag == "hf":
        return HfModelConfig.from_dict(data)
    if tag == "plugin":
        return PluginModelConfig.from_dict(data)
    return ModelConfig.from_dict(data)


def model_tag(data: Any) -> str:
    """The union's tag of a config or its dict (plans.ModelPlan): 'hf' (a transformers
    config names its model_type), 'plugin' (a plug-in's names its plugin) or 'gpt'."""
    if isinstance(data, HfModelConfig) or (isinstance(data, dict) and MODEL_TYPE in data):
        return "hf"
    if isinstance(data, PluginModelConfig) or (isinstance(data, dict) and PLUGIN in data):
        return "plugin"
    return "gpt"

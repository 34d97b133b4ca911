"""Model configurations and the registry of named presets.

The config lives here, without torch, so that the API can validate a spec (unknown preset,
seq_len above the model's maximum) without importing the worker; `worker.models.gpt` builds a
module from it. A checkpoint's metadata holds `ModelConfig.to_dict()`, and
`ModelConfig.from_dict` rebuilds it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from trainctl.store.exceptions import InvalidRequest, UnknownPreset

# Fields that change how a model runs, not what it computes: two configs that differ only in
# these load each other's checkpoints.
RUNTIME_FIELDS = frozenset({"use_checkpoint_per_layer", "use_compile", "compile_mode"})


# What a model of this service can be: far beyond any preset, well short of what would only
# exhaust a node (a 300 M vocabulary, 100,000 MTP heads). NaN and the infinities are outside
# every range, so they are refused too. The total size is bounded apart (MAX_MODEL_PARAMS).
BOUNDS: dict[str, tuple[float, float]] = {
    "vocab_size": (1, 1 << 20),
    "d_model": (1, 1 << 16),
    "n_layers": (1, 1024),
    "n_heads": (1, 1024),
    "n_kv_heads": (1, 1024),
    "ffn_hidden": (1, 1 << 18),
    "max_seq_len": (1, 131_072),
    "rope_theta": (1.0, 1e9),
    "logit_softcap": (0.0, 1e4),
    "norm_eps": (1e-12, 1.0),
    "mtp_depth": (0, 16),
    "mtp_loss_weights": (0.0, 1e3),
    "init_std": (1e-6, 10.0),
}


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 64_000
    """Size of the token vocabulary; the tied embedding and head have this many rows."""
    d_model: int = 768
    """Width of the residual stream."""
    n_layers: int = 12
    """Number of transformer blocks."""
    n_heads: int = 12
    """Query heads per attention layer; head_dim = d_model / n_heads."""
    n_kv_heads: int = 4
    """Key/value heads (grouped-query attention); must divide n_heads."""
    ffn_hidden: int = 2048
    """Hidden width of the SwiGLU MLP."""
    max_seq_len: int = 4096
    """Longest sequence the RoPE tables are built for."""
    rope_theta: float = 10_000.0
    """RoPE base frequency."""
    logit_softcap: float = 15.0
    """Logits are squashed to (-cap, cap) with cap * tanh(logits / cap); 0 disables."""
    norm_eps: float = 1e-6
    """Epsilon of every RMSNorm."""
    qk_norm: bool = True
    """RMSNorm on queries and keys per head before RoPE (stabilises attention logits)."""
    mtp_depth: int = 0
    """Extra multi-token-prediction heads: head k predicts the token k+1 positions ahead."""
    mtp_loss_weights: tuple[float, ...] = ()
    """Loss weight of each MTP head; empty means 0.3 for each."""
    init_std: float = 0.02
    """Standard deviation of the weight initialisation."""
    use_checkpoint_per_layer: bool = False
    """Recompute each block's activations in backward (activation checkpointing)."""
    use_compile: bool = False
    """Compile the model with torch.compile."""
    compile_mode: str = "default"
    """torch.compile mode: default, reduce-overhead or max-autotune."""

    def __post_init__(self) -> None:
        self._check_types()
        for name, (low, high) in BOUNDS.items():
            values = getattr(self, name)
            for value in values if isinstance(values, tuple | list) else (values,):
                # `not low <= value <= high` is also true for NaN.
                if not low <= value <= high:
                    raise InvalidRequest(
                        f"model {name} must be between {low:,} and {high:,}, got {value!r}"
                    )
        if self.d_model % self.n_heads:
            raise InvalidRequest(
                f"model d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        if (self.d_model // self.n_heads) % 2:
            raise InvalidRequest("model head_dim (d_model / n_heads) must be even for RoPE")
        if self.n_heads % self.n_kv_heads:
            raise InvalidRequest(
                f"model n_heads ({self.n_heads}) must be divisible by n_kv_heads "
                f"({self.n_kv_heads})"
            )
        if self.mtp_loss_weights and len(self.mtp_loss_weights) != self.mtp_depth:
            raise InvalidRequest(
                f"model mtp_loss_weights has {len(self.mtp_loss_weights)} entries "
                f"but mtp_depth is {self.mtp_depth}"
            )
        if self.compile_mode not in ("default", "reduce-overhead", "max-autotune"):
            raise InvalidRequest(f"model compile_mode {self.compile_mode!r} is not a known mode")

    def _check_types(self) -> None:
        """Refuse values of the wrong JSON type: overrides arrive from users as JSON, and
        `{"n_layers": true}` must not build a one-layer model. A whole number may stand for a
        float; a boolean is never a number."""
        expected: dict[str, tuple[type, ...]] = {
            "int": (int,),
            "float": (int, float),
            "bool": (bool,),
            "str": (str,),
        }
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "mtp_loss_weights":
                what = "a list of numbers"
                if not isinstance(value, list | tuple):
                    raise InvalidRequest(f"model {f.name} must be {what}, got {value!r}")
                values, kinds = tuple(value), expected["float"]
            elif str(f.type) in expected:
                values, kinds, what = (value,), expected[str(f.type)], f"of type {f.type}"
            else:
                continue
            for v in values:
                if not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds):
                    raise InvalidRequest(f"model {f.name} must be {what}, got {value!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def mtp_weights(self) -> tuple[float, ...]:
        return self.mtp_loss_weights or (0.3,) * self.mtp_depth

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["mtp_loss_weights"] = list(self.mtp_loss_weights)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidRequest(f"unknown model config field(s): {', '.join(unknown)}")
        values = dict(data)
        if "mtp_loss_weights" in values:
            values["mtp_loss_weights"] = tuple(values["mtp_loss_weights"])
        return cls(**values)

    def replace(self, **changes: Any) -> ModelConfig:
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise InvalidRequest(f"unknown model config field(s): {', '.join(unknown)}")
        return dataclasses.replace(self, **changes)

    def architecture(self) -> dict[str, Any]:
        """What the weights depend on: the config without its runtime switches."""
        return {k: v for k, v in self.to_dict().items() if k not in RUNTIME_FIELDS}

    def differences(self, other: Any) -> dict[str, tuple[Any, Any]]:
        """Architecture fields that differ: {field: (self's value, other's value)}.

        Empty means the two load each other's weights; runtime switches do not count. A
        transformers model (store.models.hf_config) differs in everything, under `model`.
        """
        if not isinstance(other, ModelConfig):
            return {"model": ("trainctl gpt", getattr(other, "model_type", type(other).__name__))}
        ours, theirs = self.architecture(), other.architecture()
        return {k: (ours[k], theirs[k]) for k in ours if ours[k] != theirs[k]}

    def sizes(self) -> dict[str, int]:
        """What the memory estimate reads (store.training.memory), as HfModelConfig.sizes gives it
        for a transformers model: parameters, widths, the layers that keep activations (MTP's too)
        and the layers a sampler caches keys and values for."""
        return {
            "params": self.param_counts()["total"],
            "d_model": self.d_model,
            "ffn": self.ffn_hidden,
            "kv": self.n_kv_heads * self.head_dim,
            "layers": self.n_layers + self.mtp_depth,
            "cache_layers": self.n_layers,
        }

    def param_counts(self) -> dict[str, int]:
        """Parameter counts by kind, computed from the shapes (no torch needed).

        `matmul` counts every weight used in a matrix multiply once per use per token:
        the block matrices plus the tied head (the embedding lookup is not a matmul).
        """
        d, hd = self.d_model, self.head_dim
        attn = d * d * 2 + d * self.n_kv_heads * hd * 2  # wq, wo, wk, wv
        mlp = 3 * d * self.ffn_hidden
        norms = 2 * d + (2 * hd if self.qk_norm else 0)
        per_layer = attn + mlp + norms
        mtp = self.mtp_depth * (d * d + d)
        embedding = self.vocab_size * d
        total = embedding + self.n_layers * per_layer + d + mtp
        matmul = self.n_layers * (attn + mlp) + embedding
        return {"total": total, "embedding": embedding, "matmul": matmul}

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token at `seq_len`: 6·N_matmul for the weights plus 12·L·d·T
        for attention (PaLM appendix B)."""
        return 6 * self.param_counts()["matmul"] + 12 * self.n_layers * self.d_model * seq_len


@dataclass
class PresetRegistry:
    _presets: dict[str, ModelConfig] = field(default_factory=dict)
    _docs: dict[str, str] = field(default_factory=dict)

    def register(self, name: str, config: ModelConfig, doc: str) -> None:
        if name in self._presets:
            raise ValueError(f"model preset {name!r} is already registered")
        self._presets[name] = config
        self._docs[name] = doc

    def get(self, name: str) -> ModelConfig:
        try:
            return self._presets[name]
        except KeyError:
            raise UnknownPreset(
                f"unknown model preset {name!r}; valid presets: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._presets)

    def doc(self, name: str) -> str:
        self.get(name)
        return self._docs[name]


PRESETS = PresetRegistry()
register_preset = PRESETS.register
get_preset = PRESETS.get

register_preset(
    "tiny",
    ModelConfig(
        vocab_size=512,
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        ffn_hidden=192,
        max_seq_len=512,
    ),
    "About 0.2 M parameters, byte-level vocabulary (512): unit tests and CPU smoke runs.",
)
register_preset(
    "small",
    ModelConfig(
        vocab_size=64_000,
        d_model=768,
        n_layers=12,
        n_heads=12,
        n_kv_heads=4,
        ffn_hidden=2048,
        max_seq_len=4096,
    ),
    "About 125 M parameters (GPT-2-small sized), vocabulary 64,000, sequence 4096.",
)
register_preset(
    "base",
    ModelConfig(
        vocab_size=64_000,
        d_model=1024,
        n_layers=24,
        n_heads=16,
        n_kv_heads=4,
        ffn_hidden=3840,
        max_seq_len=4096,
    ),
    "About 410 M dense parameters, vocabulary 64,000, sequence 4096: the GPU benchmark model.",
)
register_preset(
    "1b",
    ModelConfig(
        vocab_size=128_256,
        d_model=2048,
        n_layers=16,
        n_heads=32,
        n_kv_heads=8,
        ffn_hidden=8192,
        max_seq_len=8192,
        rope_theta=500_000.0,
    ),
    "About 1.2 B parameters, Llama-3.2-1B's shapes (16 layers, d_model 2048, 32 heads, 8 "
    "kv heads, ffn 8192, vocabulary 128,256, tied embedding): one GPU, fsdp past one.",
)
register_preset(
    "8b",
    ModelConfig(
        vocab_size=128_256,
        d_model=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=8,
        ffn_hidden=14_336,
        max_seq_len=8192,
        rope_theta=500_000.0,
    ),
    "About 7.5 B parameters, Llama-3-8B's shapes (32 layers, d_model 4096, 32 heads, 8 kv "
    "heads, ffn 14,336, vocabulary 128,256) but with the built-in GPT's tied embedding and "
    "head (Llama's are separate: 8.0 B): fsdp across GPUs.",
)

"""A checkpoint exported to Hugging Face transformers: what the folder holds and what it says,
without torch (issue 15; the worker writes it in `worker.checkpoints.exports`;
docs/design/models.md, "Model output: samples, sample runs, exports", "Exports").

```
<export>/
  config.json              Qwen3Config (with QK-norm) or LlamaConfig (without), for AutoConfig
  model.safetensors        the weights, in the transformers names; the tied embedding stored once
  generation_config.json   end-of-text id where the tokenizer has one
  tokenizer.json           the checkpoint's BPE, or a 256-token byte-level one (none if unknown)
  tokenizer_config.json    PreTrainedTokenizerFast, the end-of-text token
  README.md                the model card: training facts and what differs from trainctl
  metadata.json            the checkpoint's training facts and model config, and the export's
  manifest.json            size and sha256 of every file, as a checkpoint's (manifests.py)
```

The config is Qwen3's for a model with QK-norm (per head before RoPE, half-split RoPE, GQA,
SwiGLU, RMSNorm, tied head), Llama's for the same without. Every `ModelConfig` field has a rule here
(`FIELD_RULES`); what neither architecture computes is stated in `differences`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata as importlib_metadata
from typing import Any

from trainctl.store.data.datasets import bits_per_byte
from trainctl.store.evals.tasks import EvalResult
from trainctl.store.exceptions import InvalidRequest
from trainctl.store.models.presets import ModelConfig
from trainctl.store.specs import ExportDtype

HF_FORMAT = "hf"

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
MODEL_CARD_FILE = "README.md"

QWEN3 = "Qwen3ForCausalLM"
LLAMA = "LlamaForCausalLM"
# The first transformers releases that read these configs as written here (Qwen3; Llama's
# head_dim field), for the model card.
MIN_TRANSFORMERS = {QWEN3: "4.51", LLAMA: "4.45"}

# How each ModelConfig field reaches the exported model. "config": a config.json field;
# "architecture": picks Qwen3 or Llama; "difference": not computed by transformers, stated
# in `differences`; "training": has no effect on what the trained model computes.
FIELD_RULES = {
    "vocab_size": "config",
    "d_model": "config",
    "n_layers": "config",
    "n_heads": "config",
    "n_kv_heads": "config",
    "ffn_hidden": "config",
    "max_seq_len": "config",
    "rope_theta": "config",
    "norm_eps": "config",
    "qk_norm": "architecture",
    "logit_softcap": "difference",
    "mtp_depth": "difference",
    "mtp_loss_weights": "training",
    "init_std": "training",
    "use_checkpoint_per_layer": "training",
    "use_compile": "training",
    "compile_mode": "training",
}


def check_exportable(config: ModelConfig) -> None:
    """Refuse a model with a config field that no rule maps (see FIELD_RULES)."""
    unmapped = sorted(f.name for f in dataclasses.fields(config) if f.name not in FIELD_RULES)
    if unmapped:
        raise InvalidRequest(
            f"cannot export to transformers: model config field(s) {', '.join(unmapped)} have "
            "no mapping to a transformers architecture, and export never silently changes "
            "what the model computes"
        )


def hf_architecture(config: ModelConfig) -> str:
    """Qwen3 applies an RMSNorm to every query and key head, with no switch to turn it off
    (weights of ones still normalise), so a model without QK-norm is exported as Llama."""
    return QWEN3 if config.qk_norm else LLAMA


def hf_config(config: ModelConfig, dtype: ExportDtype, eos_id: int | None) -> dict[str, Any]:
    """config.json: what `AutoConfig` reads to build the model trainctl's config describes."""
    architecture = hf_architecture(config)
    data: dict[str, Any] = {
        "architectures": [architecture],
        "model_type": "qwen3" if architecture == QWEN3 else "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.ffn_hidden,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_seq_len,
        "rope_theta": float(config.rope_theta),
        "rope_scaling": None,
        "rms_norm_eps": config.norm_eps,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": True,
        # `torch_dtype`, not 4.56's `dtype`: every release reads this name.
        "torch_dtype": dtype,
        "bos_token_id": None,  # trainctl's data has no beginning-of-text token
        "eos_token_id": eos_id,
        "use_cache": True,
    }
    if architecture == QWEN3:
        data |= {"use_sliding_window": False, "sliding_window": None}
    else:
        data |= {"mlp_bias": False, "pretraining_tp": 1}
    return data


def generation_config(eos_id: int | None) -> dict[str, Any]:
    """generation_config.json: stop at end-of-text when the tokenizer has one."""
    return {"bos_token_id": None, "eos_token_id": eos_id, "pad_token_id": eos_id}


def tokenizer_config(
    eos_token: str | None, max_length: int, bos_token: str | None = None
) -> dict[str, Any]:
    """tokenizer_config.json: the fast tokenizer over tokenizer.json, nothing model-specific.
    A `bos_token` is named only, never added to an encoding (no post-processor adds it)."""
    data: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
        # Without it the tokenizer also returns token_type_ids, which a causal LM's
        # generate(**tokenizer(text)) refuses ("model_kwargs are not used").
        "model_input_names": ["input_ids", "attention_mask"],
    }
    if eos_token is not None:
        data |= {"eos_token": eos_token, "pad_token": eos_token}
    if bos_token is not None:
        data |= {"bos_token": bos_token, "add_bos_token": False}
    return data


# --- what differs ---------------------------------------------------------------------------


def differences(config: ModelConfig, dtype: ExportDtype, saved_dtype: str) -> list[str]:
    """What the exported model computes differently from the checkpoint, one sentence each.

    `saved_dtype` is the dtype of the checkpoint's weights (metadata.json's `dtype`).
    """
    found = []
    cap = config.logit_softcap
    if cap > 0:
        found.append(
            f"logit softcap: transformers computes z; trainctl computes cap*tanh(z/cap) with "
            f"cap={cap:g}. The map is monotonic, so greedy decoding is unchanged, but sampling "
            "probabilities differ; apply it to the logits to get trainctl's."
        )
    if config.mtp_depth:
        found.append(
            f"multi-token-prediction heads dropped: {config.mtp_depth} (used only in training; "
            "next-token logits are unaffected)."
        )
    if dtype == "bfloat16":
        if saved_dtype != "bfloat16":
            found.append(
                f"weights rounded from {saved_dtype} to bfloat16: outputs differ from the "
                "checkpoint's by that rounding."
            )
        found.append(
            "RMSNorm in bfloat16: transformers rounds the normalised activations to bfloat16 "
            "before multiplying by the weight; trainctl (torch's rms_norm) multiplies in "
            "float32 and rounds once. In float32 the two agree."
        )
    return found


# --- training facts and the model card ------------------------------------------------------


def _typed(meta: object, key: str, kind: type | tuple[type, ...]) -> Any:
    """`meta[key]` if `meta` is a dict and the value has the expected type (bool is no
    number here), else None: metadata.json is read, not trusted."""
    value = meta.get(key) if isinstance(meta, dict) else None
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class TrainingFacts:
    """What a checkpoint's metadata.json says of how it was made (None where it says nothing)."""

    experiment: str | None
    tag: str | None
    step: int | None
    token_count: int | None
    best_loss: float | None
    """The best validation loss (nats per token) up to this step."""
    run_id: str | None
    created_at: str | None
    trainctl_version: str | None
    """The version that trained it."""
    dataset: dict[str, Any] | None
    """The prepared dataset's identity (folder, tokenizer, vocab_size, bytes_per_token)."""
    tokenizer: str | None
    """bytes, bpe, or None when unknown."""

    @classmethod
    def from_metadata(cls, meta: dict[str, Any]) -> TrainingFacts:
        kind = _typed(meta.get("tokenizer"), "kind", str)
        best = _typed(meta, "best_loss", (int, float))
        return cls(
            experiment=_typed(meta, "experiment", str),
            tag=_typed(meta, "tag", str),
            step=_typed(meta, "step", int),
            token_count=_typed(meta, "token_count", int),
            best_loss=float(best) if best is not None and math.isfinite(best) else None,
            run_id=_typed(meta, "run_id", str),
            created_at=_typed(meta, "created_at", str),
            trainctl_version=_typed(meta.get("versions"), "trainctl", str),
            dataset=_typed(meta, "dataset", dict),
            tokenizer=kind if kind in ("bytes", "bpe") else None,
        )

    def bits_per_byte(self) -> float | None:
        per_token = self.dataset.get("bytes_per_token") if self.dataset else None
        if self.best_loss is None or not isinstance(per_token, int | float) or per_token <= 0:
            return None
        return bits_per_byte(self.best_loss, per_token)

    def rows(self) -> list[tuple[str, str]]:
        """(fact, value) for the model card, in reading order; unknown facts say so."""

        def known(value: Any, shown: str | None = None) -> str:
            return "unknown" if value is None else (shown or str(value))

        bpb = self.bits_per_byte()
        data = self.dataset.get("folder") if self.dataset else None
        return [
            ("checkpoint", f"{known(self.experiment)}/{known(self.tag)}"),
            ("steps", known(self.step, f"{self.step:,}" if self.step is not None else None)),
            ("tokens", known(self.token_count, f"{self.token_count or 0:,}")),
            ("data", known(data, f"prepared dataset `{data}`")),
            ("tokenizer", known(self.tokenizer)),
            (
                "best validation loss",
                known(self.best_loss, f"{self.best_loss or 0:.4f} nats/token"),
            ),
            ("best validation bits per byte", known(bpb, f"{bpb or 0:.4f}")),
            ("run", known(self.run_id)),
            ("saved at", known(self.created_at)),
            ("trained by", f"trainctl {known(self.trainctl_version)}"),
        ]


def trainctl_version() -> str:
    try:
        return importlib_metadata.version("trainctl")
    except importlib_metadata.PackageNotFoundError:
        return "unknown"


def _escape(cell: str) -> str:
    return cell.replace("|", "\\|").replace("\n", " ")


def model_card(
    facts: TrainingFacts,
    architecture: str,
    dtype: ExportDtype,
    found: list[str],
    notes: list[str],
    extra: dict[str, str] | None = None,
    min_transformers: str | None = None,
    evals: Sequence[EvalResult] = (),
) -> str:
    """README.md: the Hub's front matter, the training facts, the checkpoint's eval results
    (`evals`), what differs, how to load it. `min_transformers`: the oldest release that loads
    it, where MIN_TRANSFORMERS does not know the architecture (a transformers model's: the
    release that trained it)."""
    min_version = min_transformers or MIN_TRANSFORMERS[architecture]
    rows = [*facts.rows(), *(extra or {}).items()]
    table = "\n".join(f"| {_escape(k)} | {_escape(v)} |" for k, v in rows)
    differs = "\n".join(f"- {d}" for d in found) or "- none: transformers computes the same."
    noted = "".join(f"- {n}\n" for n in notes)
    title = f"{facts.experiment or 'trainctl model'}/{facts.tag or 'export'}"
    return f"""---
library_name: transformers
pipeline_tag: text-generation
tags:
- trainctl
---

# {title}

A language model trained with trainctl and exported by trainctl {trainctl_version()} as
`{architecture}` ({dtype}); it loads with transformers >= {min_version},
without `trust_remote_code`.

## Training

| fact | value |
|---|---|
{table}

## Evaluations

{eval_section(evals)}

## Differences from trainctl

{differs}

## Notes

- trainctl refuses sequences longer than `max_position_embeddings`; transformers will run
  past it, on positions the model never trained on.
{noted}
## Use

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

# dtype="auto": the weights' dtype (`torch_dtype=` before transformers 4.56)
model = AutoModelForCausalLM.from_pretrained("path/to/this/folder", dtype="auto")
tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")
```
"""


def eval_section(evals: Sequence[EvalResult]) -> str:
    """The model card's eval results: a row per score of each finished evaluate run of the
    checkpoint (`store.db.scores.checkpoint_results`), or a line saying there were none."""
    if not evals:
        return (
            "None were run: no evaluate run had scored this checkpoint when it was exported "
            "(docs/evals.md)."
        )
    rows = "\n".join(
        f"| {e.task} | {e.metric} | {e.value:.4f} | {e.num_fewshot} | "
        f"{'all' if e.limit is None else e.limit} | {e.evaluate_run} |"
        for e in evals
    )
    return (
        "Scored as lm-evaluation-harness scores multiple choice (docs/evals.md); `limit` is "
        "the items scored per task.\n\n"
        "| task | metric | value | few-shot | limit | evaluate run |\n"
        f"|---|---|---|---|---|---|\n{rows}"
    )


# Training facts of the checkpoint's metadata.json that its export keeps; the training state
# (optimizer schedule, RNG, data position) is no use without the optimizer, which stays behind.
KEPT_METADATA = (
    "format_version",
    "step",
    "token_count",
    "best_loss",
    "model_config",
    "run_id",
    "experiment",
    "tag",
    "created_at",
    "versions",
    "dataset",
    "tokenizer",
)


def export_metadata(
    meta: dict[str, Any],
    architecture: str,
    dtype: ExportDtype,
    found: list[str],
    notes: list[str],
) -> dict[str, Any]:
    """metadata.json of an export: the checkpoint's training facts, `dtype` of the exported
    weights, and under `export` how it was made and what differs."""
    kept = {k: meta[k] for k in KEPT_METADATA if k in meta}
    return kept | {
        "dtype": dtype,
        "export": {
            "format": HF_FORMAT,
            "architecture": architecture,
            "differences": found,
            "notes": notes,
            "exported_at": datetime.now(UTC).isoformat(),
            "trainctl_version": trainctl_version(),
        },
    }


# --- the result -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportResult:
    """What an export wrote: an export run's result (`to_dict`)."""

    folder: str
    """Where the export is: its entry of the exports store, in words (a folder on POSIX)."""
    format: str
    architecture: str
    """The transformers class in config.json: Qwen3ForCausalLM or LlamaForCausalLM."""
    dtype: ExportDtype
    tokenizer: str | None
    """bpe, bytes, or None when no tokenizer was exported (see notes)."""
    differences: list[str]
    """What the exported model computes differently, one sentence each (also in README.md)."""
    notes: list[str]
    """Everything else a user should know: what was left out and why."""
    files: list[dict[str, Any]] = field(default_factory=list)
    """The manifest's entries: {name, size, sha256}."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

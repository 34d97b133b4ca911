"""Export a checkpoint as a Hugging Face transformers folder (issue 15; the layout, the config
and the model card are in `store.checkpoints.exports`).

The weights are loaded through `load_checkpoint`, so a damaged checkpoint fails here with the
same integrity error a resume would raise, and renamed to the transformers names of Qwen3 (or
Llama, for a model without QK-norm), which compute trainctl's function: checked in
`tests/worker/checkpoints/test_export.py` against trainctl's logits. The checkpoint is read through
the checkpoint store, and the export written as a checkpoint is, through a staged entry of the
exports store, the manifest last: an export is there complete or not at all.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load
from torch import nn

from trainctl.store.checkpoints.exports import (
    CONFIG_FILE,
    GENERATION_CONFIG_FILE,
    HF_FORMAT,
    MODEL_CARD_FILE,
    TOKENIZER_CONFIG_FILE,
    ExportResult,
    TrainingFacts,
    check_exportable,
    differences,
    export_metadata,
    generation_config,
    hf_architecture,
    hf_config,
    model_card,
    tokenizer_config,
)
from trainctl.store.checkpoints.manifests import (
    METADATA_FILE,
    MODEL_FILE,
    read_metadata,
    verify_manifest,
)
from trainctl.store.checkpoints.storage import Files
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.data.datasets import TOKENIZER_FILE
from trainctl.store.data.tokenizer import EOT_NAMES
from trainctl.store.evals.tasks import EvalResult
from trainctl.store.exceptions import CheckpointCorrupt, Conflict, InvalidRequest
from trainctl.store.models.hf_config import AnyModelConfig, model_config_from_dict
from trainctl.store.models.presets import ModelConfig
from trainctl.store.specs import EXPORT_DTYPES, ExportDtype
from trainctl.store.text import ids_span
from trainctl.worker.checkpoints.hashed_file import HashedFile
from trainctl.worker.checkpoints.safetensors_stream import write_safetensors
from trainctl.worker.checkpoints.state import load_checkpoint
from trainctl.worker.models import build_model
from trainctl.worker.models.gpt import GPT
from trainctl.worker.models.hf import HFCausalLM, config_json
from trainctl.worker.stops import maybe_stop

# What torch.compile's wrapper (OptimizedModule) puts before every name in its state dict.
# trainctl compiles in place (`build_model`), so its checkpoints never carry it; a state dict
# saved from a `torch.compile(model)` wrapper does.
COMPILE_PREFIX = "_orig_mod."

TOP_NAMES = {
    "tok_emb.weight": "model.embed_tokens.weight",  # lm_head is tied to it: stored once
    "final_norm.weight": "model.norm.weight",
}
BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.wq.weight": "self_attn.q_proj.weight",
    "attn.wk.weight": "self_attn.k_proj.weight",
    "attn.wv.weight": "self_attn.v_proj.weight",
    "attn.wo.weight": "self_attn.o_proj.weight",
    "attn.q_norm.weight": "self_attn.q_norm.weight",
    "attn.k_norm.weight": "self_attn.k_norm.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "mlp.w_gate.weight": "mlp.gate_proj.weight",
    "mlp.w_up.weight": "mlp.up_proj.weight",
    "mlp.w_down.weight": "mlp.down_proj.weight",
}
_BLOCK_RE = re.compile(r"blocks\.(\d+)\.(.+)")
_DROPPED_PREFIX = "mtp_heads."  # training-only; `differences` says so
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class CardFacts:
    """What the model card says beyond the checkpoint's own metadata."""

    extra: dict[str, str]
    """(fact, value) rows after the training facts."""
    evals: Sequence[EvalResult]
    """The checkpoint's eval results."""


def export_hf(
    checkpoint: Files,
    exports: CheckpointStore,
    experiment: str,
    tag: str,
    *,
    dtype: ExportDtype = "float32",
    facts: Mapping[str, str] | None = None,
    evals: Sequence[EvalResult] = (),
) -> ExportResult:
    """Write `checkpoint` (`CheckpointStore.entry`) as a new transformers folder, entry
    `experiment`/`tag` of the `exports` store, and say what differs (see
    `store.checkpoints.exports`).

    `facts` are further (fact, value) rows for the model card, after those the checkpoint's
    metadata gives (the export run can add what only the run knows, such as its data spec);
    `evals` the checkpoint's eval results, which the card lists (or says there are none).
    Raises `CheckpointCorrupt` for a damaged checkpoint, `Conflict` when the export exists
    (an export is never overwritten) and `InvalidRequest` for a model it cannot map;
    whatever fails, no export is left.
    """
    if dtype not in EXPORT_DTYPES:
        raise InvalidRequest(
            f"export dtype must be one of {', '.join(EXPORT_DTYPES)}, not {dtype!r}"
        )
    where = exports.describe(experiment, tag)
    if exports.storage.exists(experiment, tag):
        raise Conflict(f"{where} exists; an export is never overwritten: delete it first")
    model, meta = load_trained(checkpoint)
    card = CardFacts(dict(facts or {}), evals)
    if isinstance(model, HFCausalLM):
        return export_transformers(checkpoint, exports, experiment, tag, model, meta, dtype, card)
    check_exportable(model.config)
    tokenizer = export_tokenizer(checkpoint, meta, model.config)
    found = differences(model.config, dtype, str(meta.get("dtype")))
    texts = export_texts(model.config, meta, dtype, tokenizer, found, card)
    weights = hf_weights(model, TORCH_DTYPES[dtype])
    manifest = write_export(exports, experiment, tag, weights, texts)
    return ExportResult(
        folder=where,
        format=HF_FORMAT,
        architecture=hf_architecture(model.config),
        dtype=dtype,
        tokenizer=tokenizer.kind,
        differences=found,
        notes=tokenizer.notes,
        files=manifest["files"],
    )


def export_transformers(
    checkpoint: Files,
    exports: CheckpointStore,
    experiment: str,
    tag: str,
    model: HFCausalLM,
    meta: dict[str, Any],
    dtype: ExportDtype,
    card_facts: CardFacts,
) -> ExportResult:
    """A transformers model's export: its checkpoint's weights (already under transformers'
    names) and the config.json of the model built from its checked metadata (not the
    checkpoint's own file, which whoever wrote the store may have given an `auto_map` or a
    Hub kernel), plus the tokenizer files and a model card."""
    config = json.loads(config_json(model.inner.config))
    tokenizer = export_tokenizer(checkpoint, meta, model.config)
    config["torch_dtype"] = config["dtype"] = dtype
    if tokenizer.eos_id is not None:
        config["eos_token_id"] = tokenizer.eos_id
    architecture = str((config.get("architectures") or [model.config.model_type])[0])
    saved = str(meta.get("dtype"))
    found = (
        [f"weights rounded from {saved} to bfloat16: outputs differ by that rounding."]
        if dtype == "bfloat16" and saved != "bfloat16"
        else []
    )
    card = model_card(
        TrainingFacts.from_metadata(meta),
        architecture,
        dtype,
        found,
        tokenizer.notes,
        card_facts.extra,
        min_transformers=str(config.get("transformers_version", "4.40")),
        evals=card_facts.evals,
    )
    texts = {
        CONFIG_FILE: _json(config),
        GENERATION_CONFIG_FILE: _json(generation_config(tokenizer.eos_id)),
        **tokenizer.files,
        MODEL_CARD_FILE: card.encode(),
        METADATA_FILE: _json(export_metadata(meta, architecture, dtype, found, tokenizer.notes)),
    }
    weights = {}
    for k, t in model.state_dict().items():
        maybe_stop()
        weights[k] = t.detach().to(TORCH_DTYPES[dtype]).contiguous().clone()
    manifest = write_export(exports, experiment, tag, weights, texts)
    return ExportResult(
        folder=exports.describe(experiment, tag),
        format=HF_FORMAT,
        architecture=architecture,
        dtype=dtype,
        tokenizer=tokenizer.kind,
        differences=found,
        notes=tokenizer.notes,
        files=manifest["files"],
    )


def export_texts(
    config: ModelConfig,
    meta: dict[str, Any],
    dtype: ExportDtype,
    tokenizer: TokenizerExport,
    found: list[str],
    card_facts: CardFacts,
) -> dict[str, bytes]:
    """Every file of the export but the weights and the manifest, by name."""
    card = model_card(
        TrainingFacts.from_metadata(meta),
        hf_architecture(config),
        dtype,
        found,
        tokenizer.notes,
        card_facts.extra,
        evals=card_facts.evals,
    )
    metadata = export_metadata(meta, hf_architecture(config), dtype, found, tokenizer.notes)
    return {
        CONFIG_FILE: _json(hf_config(config, dtype, tokenizer.eos_id)),
        GENERATION_CONFIG_FILE: _json(generation_config(tokenizer.eos_id)),
        **tokenizer.files,
        MODEL_CARD_FILE: card.encode(),
        METADATA_FILE: _json(metadata),
    }


def write_export(
    exports: CheckpointStore,
    experiment: str,
    tag: str,
    weights: dict[str, torch.Tensor],
    texts: dict[str, bytes],
) -> dict[str, Any]:
    """Stage the files in the exports store, manifest last, and commit them as a new entry
    (never over one); return the manifest."""
    with exports.stage(experiment, tag) as staged:
        with (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainctl-export") as pool,
            HashedFile(staged.create(MODEL_FILE), pool) as f,
        ):
            # The framework in the file's metadata: older transformers releases fail to load
            # a safetensors file without it.
            write_safetensors(weights, f, metadata={"format": "pt"})
        for name, data in texts.items():
            staged.write(name, data)
        try:
            return staged.commit({MODEL_FILE: f.hexdigest()}, replace=False)
        except FileExistsError:
            where = exports.describe(experiment, tag)
            raise Conflict(f"{where} appeared during the export; delete it first") from None


def _json(data: dict[str, Any]) -> bytes:
    return (json.dumps(data, indent=2) + "\n").encode()


# --- loading --------------------------------------------------------------------------------


class _CompiledNames(nn.Module):
    """Holds the model where torch.compile's wrapper does, so a state dict saved from one
    ("_orig_mod.<name>") loads through `load_checkpoint` unchanged, strictly."""

    def __init__(self, model: GPT) -> None:
        super().__init__()
        self._orig_mod = model
        self.config = model.config  # load_checkpoint checks it against the saved config


def load_trained(checkpoint: Files) -> tuple[GPT | HFCausalLM, dict[str, Any]]:
    """The checkpoint's model in float32 on the CPU, and its metadata, integrity checked."""
    verify_manifest(checkpoint, deep=False)  # sizes only: load_checkpoint hashes every byte
    saved = read_metadata(checkpoint).get("model_config")
    if not isinstance(saved, dict):
        raise InvalidRequest(
            f"checkpoint {checkpoint.describe()} records no model_config; nothing to export"
        )
    # Runtime switches off: export runs no forward pass and needs no compiled graph.
    try:
        config = model_config_from_dict(saved)
    except ValueError as exc:  # checked as a request's is: whoever wrote the store wrote it
        raise InvalidRequest(
            f"checkpoint {checkpoint.describe()}: its model_config is refused: {exc}"
        ) from exc
    model = build_model(config, use_compile=False, use_checkpoint_per_layer=False)
    target: nn.Module = _CompiledNames(model) if saved_compiled(checkpoint) else model
    meta = load_checkpoint(target, None, None, checkpoint)
    return model, meta


def saved_compiled(checkpoint: Files) -> bool:
    """True when every weight's name starts with torch.compile's prefix.

    Only the safetensors header is read; a damaged file answers False here and fails its
    integrity check in `load_checkpoint`, with the message that names it.
    """
    try:
        with checkpoint.open(MODEL_FILE) as f:
            if f.local_path is None:
                names = list(load(f.read()))
            else:
                with safe_open(f.local_path, framework="pt") as st:
                    names = list(st.keys())
    except Exception:  # safetensors raises its own error types for a bad header
        return False
    return bool(names) and all(n.startswith(COMPILE_PREFIX) for n in names)


# --- weights --------------------------------------------------------------------------------


def hf_name(name: str) -> str | None:
    """The transformers name of a trainctl weight; None for one export drops (MTP heads)."""
    if name.startswith(_DROPPED_PREFIX):
        return None
    if name in TOP_NAMES:
        return TOP_NAMES[name]
    match = _BLOCK_RE.fullmatch(name)
    if match and match.group(2) in BLOCK_NAMES:
        return f"model.layers.{match.group(1)}.{BLOCK_NAMES[match.group(2)]}"
    raise InvalidRequest(
        f"cannot export weight {name!r}: it has no transformers counterpart, and export never "
        "silently changes what the model computes"
    )


def hf_weights(model: GPT, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The model's weights under transformers names, in `dtype`, each with its own memory."""
    weights = {}
    for name, t in model.state_dict().items():
        maybe_stop()  # an export stops at a cancel between tensors (worker.stops)
        target = hf_name(name)
        if target is not None:
            weights[target] = t.detach().to(dtype).contiguous().clone()
    return weights


# --- the tokenizer --------------------------------------------------------------------------

BYTES = 256
"""The ids of a byte-level tokenizer's bytes: 0..255."""
BYTE_LEVEL_BOS = "<|begin_of_text|>"


@dataclass(frozen=True)
class TokenizerExport:
    kind: str | None
    """bpe, bytes, or None (no tokenizer exported)."""
    files: dict[str, bytes] = field(default_factory=dict)
    eos_id: int | None = None
    notes: list[str] = field(default_factory=list)


def export_tokenizer(
    checkpoint: Files, meta: dict[str, Any], config: AnyModelConfig
) -> TokenizerExport:
    """The tokenizer files for the checkpoint's data: its BPE's tokenizer.json, a byte-level
    one, or none when the checkpoint does not know its tokens' meaning."""
    recorded = meta.get("tokenizer")
    kind = recorded.get("kind") if isinstance(recorded, dict) else None
    if kind == "bpe":
        assert isinstance(recorded, dict)
        return bpe_tokenizer(checkpoint, recorded, config)
    if kind == "bytes":
        return byte_level_export(config)
    return TokenizerExport(
        None,
        notes=[
            "no tokenizer exported: the checkpoint records none (synthetic tokens or bare "
            "shards), so AutoTokenizer cannot load this folder; feed the model token ids."
        ],
    )


def byte_level_export(config: AnyModelConfig) -> TokenizerExport:
    """The byte-level tokenizer, with a begin-of-text token at id 256 where the model has that
    id: lm-evaluation-harness's HFLM feeds BOS (else EOS) as the context of a request whose
    context is empty, and fails on a tokenizer with neither. The model never saw the id in
    training, so it is a neutral start rather than a learned one; nothing adds it to an
    encoding, and it is no end-of-text (generation would never stop at it)."""
    bos = BYTE_LEVEL_BOS if config.vocab_size > BYTES else None
    unused = ids_span(BYTES + (bos is not None), config.vocab_size)
    bytes_note = "byte-level tokenizer: ids 0..255 are the bytes"
    if unused is not None:
        verb = "has" if unused.startswith("id ") else "have"
        bytes_note += f"; {unused} of the model {verb} no token (byte-level data never holds them)"
    notes = [
        bytes_note + ".",
        "no end-of-text token (byte-level documents run together): generation stops "
        "only at its length limit.",
        f"id {BYTES} is {bos}, a begin-of-text token that lm-evaluation-harness's HFLM puts "
        "before an empty context; the model never saw it in training."
        if bos is not None
        else "no begin-of-text token (the model has no id beyond the bytes): give "
        "lm-evaluation-harness's HFLM prefix_token_id (docs/evals.md) to score a request "
        "with an empty context.",
    ]
    files = {
        TOKENIZER_FILE: byte_level_tokenizer_json(bos).encode(),
        TOKENIZER_CONFIG_FILE: _json(tokenizer_config(None, config.max_seq_len, bos)),
    }
    return TokenizerExport("bytes", files, notes=notes)


def bpe_tokenizer(
    checkpoint: Files, recorded: dict[str, Any], config: AnyModelConfig
) -> TokenizerExport:
    from tokenizers import Tokenizer

    where = checkpoint.describe()
    try:
        with checkpoint.open(TOKENIZER_FILE) as f:
            data = f.read()
    except FileNotFoundError:
        raise CheckpointCorrupt(
            f"checkpoint {where} records a bpe tokenizer but holds no {TOKENIZER_FILE}"
        ) from None
    # The manifest vouches for the bytes; this, that they are the tokenizer the data used.
    if hashlib.sha256(data).hexdigest() != recorded.get("sha256"):
        raise CheckpointCorrupt(
            f"checkpoint {where}: {TOKENIZER_FILE} is not the tokenizer its metadata.json "
            "records (sha256 differs)"
        )
    tokenizer = Tokenizer.from_str(data.decode())
    eos_id = _end_of_text(tokenizer, recorded.get("eot_id"))
    eos = tokenizer.id_to_token(eos_id) if eos_id is not None else None
    notes = (
        []
        if eos is not None
        else [
            "the tokenizer has no end-of-text token (nor a begin-of-text one): give "
            "lm-evaluation-harness's HFLM prefix_token_id (docs/evals.md) to score a request "
            "with an empty context."
        ]
    )
    files = {
        TOKENIZER_FILE: data,
        TOKENIZER_CONFIG_FILE: _json(tokenizer_config(eos, config.max_seq_len)),
    }
    return TokenizerExport("bpe", files, eos_id, notes)


def _end_of_text(tokenizer: Any, recorded: object) -> int | None:
    """The id the data put between documents: as recorded, else a token with a known name."""
    if isinstance(recorded, int) and tokenizer.id_to_token(recorded) is not None:
        return recorded
    for name in EOT_NAMES:
        if (token_id := tokenizer.token_to_id(name)) is not None:
            return int(token_id)
    return None


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's table, which the ByteLevel pre-tokenizer and decoder use: a byte that is a
    printable character stands for itself, the others for characters from 256 up."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, moved = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + moved)
            moved += 1
    return table


def byte_level_tokenizer_json(bos: str | None = None) -> str:
    """tokenizer.json whose token ids are the byte values 0..255: a BPE with no merges over
    the ByteLevel alphabet, so every text encodes to its UTF-8 bytes and back; `bos`, a
    special token, is id 256 (a text holding it literally encodes it as that id, as GPT-2's
    tokenizer does with its <|endoftext|>)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    table = byte_to_unicode()
    assert set(table.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab={table[b]: b for b in range(256)}, merges=[]))
    # No regex split: with no merges, where words break cannot change a token.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    if bos is not None:
        tokenizer.add_special_tokens([AddedToken(bos, special=True, normalized=False)])
        assert tokenizer.token_to_id(bos) == BYTES
    return str(tokenizer.to_str())

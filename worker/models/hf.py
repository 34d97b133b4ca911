"""A transformers causal LM trained by trainctl (docs/models.md).

`HFCausalLM` holds the transformers model (`inner`) and gives the rest of the worker what it
asks of the built-in GPT: `loss(tokens, targets)` -> (training loss, next-token loss),
`forward(tokens)` -> logits, a generation cache, `config` (the plan's `HfModelConfig`). The
state dict is the transformers model's own, under its own names, with each tied weight once
(the tied head is the embedding), so `model.safetensors` plus the transformers config
(`config.json`, saved beside it) is a folder `from_pretrained` loads.

The next-token loss is the cross-entropy of the logits in float32, computed here as the GPT
path computes it (not by transformers' `labels`, whose shift would drop a position), so the
losses of the two compare. An MoE model whose config has `output_router_logits` gets
transformers' own load-balancing loss (`outputs.aux_loss`, weighted by
`router_aux_loss_coef`) added to the training loss, as transformers' forward with labels
does; it is reported as its own metric, `aux_loss`.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainctl.store.models.hf import MODEL_TYPE, check_config, check_hf_fields
from trainctl.store.models.hf_config import HfModelConfig

CONFIG_FILE = "config.json"
"""The transformers config, saved with every checkpoint of a transformers model."""
AUX_LOSS_METRIC = "aux_loss"


class ModelBuildError(ValueError):
    """The architecture's config or model cannot be built from the request's fields."""


def build_hf_config(config: HfModelConfig) -> Any:
    """The transformers config of a plan's model, checked by submit's rules before anything
    is built: the fields a request may not set (a plan or a checkpoint's metadata may have
    been written by anyone who can write the store), then the built config's every field,
    defaults computed in `__init__` included (store.models.hf.check_config). Raises
    ModelBuildError naming the field, or with transformers' reason for a config it refuses."""
    from transformers import AutoConfig

    try:
        check_hf_fields({MODEL_TYPE: config.model_type, **config.fields})
        hf = AutoConfig.for_model(config.model_type, **config.fields)
    except (ValueError, TypeError, KeyError) as exc:
        raise ModelBuildError(f"model.hf: transformers refuses the config: {exc}") from exc
    refused = sorted(k for k in config.fields if not hasattr(hf, k))
    if refused:
        raise ModelBuildError(f"model.hf: {type(hf).__name__} does not take {', '.join(refused)}")
    try:
        check_config(config.model_type, hf.to_dict())
    except ValueError as exc:
        raise ModelBuildError(f"model.hf: {exc}") from exc
    hf.architectures = None  # set from the class built, below
    return hf


@dataclass
class HfCache:
    """A generation cache: transformers' own (made by its first forward), and the positions
    it holds."""

    past: Any = None
    pos: int = 0

    def fan_out(self, n: int) -> bool:
        """Its one row as n, in place (KVCache.fan_out); False, untouched, where the cache
        is not transformers' own: Qwen3-Next's linear-attention states continue a prefix by
        another computation than a whole sequence's (4e-4 relative apart in the scorer's
        test), so its choices are scored as whole rows."""
        if not hasattr(self.past, "batch_repeat_interleave"):
            return False
        self.past.batch_repeat_interleave(n)
        return True


class HFCausalLM(nn.Module):
    def __init__(self, config: HfModelConfig, inner: nn.Module) -> None:
        super().__init__()
        self.config = config
        self.inner = inner
        hf = inner.config
        self.aux_coef = (
            float(getattr(hf, "router_aux_loss_coef", 0.0))
            if getattr(hf, "output_router_logits", False)
            else 0.0
        )
        self._aux: list[torch.Tensor] = []
        self.tied_names = _tied_names(inner)
        takes = inspect.signature(inner.forward).parameters
        # Mamba's and RWKV's recurrent state is not a `past_key_values` cache: they decode
        # without one (the prefix recomputed for each token), as a plug-in does.
        self.keeps_cache = "past_key_values" in takes
        self._trims_logits = "logits_to_keep" in takes

    # -- the state dict: transformers' names, each tied tensor once --------------------------

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        state = self.inner.state_dict(*args, **kwargs)
        for name in self.tied_names:
            state.pop(name, None)
        return state

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        result = self.inner.load_state_dict(state_dict, strict=False, assign=assign)
        missing = [k for k in result.missing_keys if k not in self.tied_names]
        if strict and (missing or result.unexpected_keys):
            raise RuntimeError(
                f"missing keys {missing[:8]}, unexpected keys {result.unexpected_keys[:8]}"
            )
        return result

    @property
    def state_module(self) -> nn.Module:
        """Where the state's names lead (worker.models.state_module): transformers' model."""
        return self.inner

    def output_heads(self) -> list[nn.Module]:
        """The output head: AdamW's, tied or not (worker.training.optim.muon_params)."""
        head = self.inner.get_output_embeddings()  # type: ignore[operator]
        return [head] if head is not None else []

    def files(self) -> dict[str, bytes]:
        """What a checkpoint saves beside the weights: the transformers config.json."""
        return {CONFIG_FILE: config_json(self.inner.config)}

    # -- training ------------------------------------------------------------------------

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits of the next token at every position: (B, T) -> (B, T, vocab)."""
        return self.inner(input_ids=idx, use_cache=False).logits

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.inner(input_ids=idx, use_cache=False)
        logits = out.logits  # (B, T, vocab)
        main = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100)
        aux = getattr(out, "aux_loss", None)
        if self.aux_coef and aux is not None:
            self._aux.append(aux.detach().float())
            return main + self.aux_coef * aux.to(main.dtype), main
        return main, main

    def take_step_metrics(self) -> dict[str, torch.Tensor]:
        """The step's extra metrics (the mean aux loss of its micro-batches), and a fresh
        start for the next step's."""
        if not self._aux:
            return {}
        aux, self._aux = torch.stack(self._aux).mean(), []
        return {AUX_LOSS_METRIC: aux}

    # -- generation ----------------------------------------------------------------------

    def new_cache(self, batch: int, total: int, device: Any, dtype: Any) -> HfCache | None:
        """transformers' own cache; None (decode without one) where the model keeps none."""
        return HfCache() if self.keeps_cache else None

    def next_logits(self, idx: torch.Tensor) -> torch.Tensor:
        """The last position's logits of idx, without a cache: (B, T) -> (B, vocab)."""
        trim = {"logits_to_keep": 1} if self._trims_logits else {}
        out = self.inner(input_ids=idx, use_cache=False, **trim)
        return out.logits[:, -1]

    def forward_cached(
        self, idx: torch.Tensor, cache: HfCache, *, last_only: bool = False
    ) -> torch.Tensor:
        """`forward` of idx continuing the positions `cache` holds, adding idx's to it."""
        out = self.inner(
            input_ids=idx,
            past_key_values=cache.past,
            use_cache=True,
            logits_to_keep=1 if last_only else 0,
        )
        cache.past, cache.pos = out.past_key_values, cache.pos + idx.shape[1]
        return out.logits


def config_json(hf: Any) -> bytes:
    """config.json as transformers writes it (every field, not only those changed)."""
    return (json.dumps(hf.to_dict(), indent=2, sort_keys=True) + "\n").encode()


def _tied_names(inner: nn.Module) -> frozenset[str]:
    """State-dict names whose tensor an earlier name already holds (a tied head)."""
    seen: set[int] = set()
    tied = set()
    for name, t in inner.state_dict(keep_vars=True).items():
        if id(t) in seen:
            tied.add(name)
        seen.add(id(t))
    return frozenset(tied)


def build_hf_model(config: HfModelConfig, seed: int | None) -> HFCausalLM:
    """The transformers model of `config`, initialised by transformers (seeded), in float32."""
    from transformers import AutoModelForCausalLM

    hf = build_hf_config(config)
    try:
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            inner = AutoModelForCausalLM.from_config(hf, dtype=torch.float32)
    except (ValueError, TypeError, KeyError, RuntimeError, AssertionError) as exc:
        raise ModelBuildError(f"model.hf: transformers cannot build this model: {exc}") from exc
    inner.config.architectures = [type(inner).__name__]
    if config.use_checkpoint_per_layer and inner.supports_gradient_checkpointing:
        inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = HFCausalLM(config, inner)
    if config.use_compile:
        # In place (nn.Module.compile), so the state dict's names stay transformers'.
        inner.compile(mode=None if config.compile_mode == "default" else config.compile_mode)
    return model

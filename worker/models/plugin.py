"""Plug-in models: a model an operator installs on a worker's node (docs/models.md,
"Plug-in models").

A package declares a `ModelPlugin` under the `trainctl.models` entry-point group:

    [project.entry-points."trainctl.models"]
    tiny_mlp = "my_package:MODEL"

Its `build(config, seed)` gets the request's `model.plugin.config` (a dict of JSON values)
and returns a module with `loss(tokens, targets)` -> (training loss, next-token loss) and
`forward(tokens)` -> logits (B, T, vocab), as the built-in GPT has. `PluginModel` wraps it
for the rest of the worker: `config` (the plan's `PluginModelConfig`), the state dict under
the module's own names, generation without a cache (the prefix is recomputed each token),
and the plug-in's Muon rule and FLOPs when it declares them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainctl.store.models.plugin import PluginModelConfig
from trainctl.store.registry import Registry
from trainctl.worker.models.hf import ModelBuildError


@dataclass(frozen=True)
class ModelPlugin:
    """What a plug-in package declares under `trainctl.models`."""

    build: Callable[[dict[str, Any], int | None], nn.Module]
    """The module of a config, initialised with the seed (None: the global RNG)."""
    muon_params: Callable[[nn.Module], Iterable[str]] | None = None
    """The names (as the module's `named_parameters` gives them) of the 2-D parameters Muon
    trains; the rest go to AdamW. None: trainctl's one rule (worker.training.optim.muon_params)."""
    flops_per_token: Callable[[dict[str, Any], int], float] | None = None
    """Training FLOPs per token of (config, seq_len), for the benchmark's MFU. None: 6N of
    the counted parameters."""


MODEL_PLUGINS: Registry[ModelPlugin] = Registry("plug-in model", group="trainctl.models")


class PluginModel(nn.Module):
    def __init__(self, config: PluginModelConfig, plugin: ModelPlugin, inner: nn.Module) -> None:
        super().__init__()
        self.config = config
        self.plugin = plugin
        self.inner = inner

    # -- the state dict: the plug-in module's own names --------------------------------------

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        return self.inner.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        return self.inner.load_state_dict(state_dict, strict=strict, assign=assign)

    # -- the optimizers and the benchmark ----------------------------------------------------

    def muon_param_names(self) -> set[str] | None:
        """Muon's parameters by the plug-in's rule, under this module's names; None when it
        declares none."""
        if self.plugin.muon_params is None:
            return None
        params = dict(self.inner.named_parameters())
        names = set(self.plugin.muon_params(self.inner))
        wrong = sorted(n for n in names if n not in params or params[n].dim() != 2)
        if wrong:
            raise ModelBuildError(
                f"model.plugin {self.config.plugin!r}: its Muon rule names "
                f"{', '.join(wrong[:8])}, which are not 2-D parameters of the model"
            )
        return {f"inner.{n}" for n in names}

    def flops_per_token(self, seq_len: int) -> float | None:
        if self.plugin.flops_per_token is None:
            return None
        return float(self.plugin.flops_per_token(self.config.config, seq_len))

    # -- training and generation -------------------------------------------------------------

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits of the next token at every position: (B, T) -> (B, T, vocab)."""
        logits: torch.Tensor = self.inner(idx)
        return logits

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loss = self.inner.loss(idx, targets)  # type: ignore[operator]
        return loss[0], loss[1]

    def new_cache(self, batch: int, total: int, device: Any, dtype: Any) -> None:
        return None  # no cache: `next_logits` recomputes the prefix

    def next_logits(self, idx: torch.Tensor) -> torch.Tensor:
        """The last position's logits of idx: (B, T) -> (B, vocab)."""
        return self.forward(idx)[:, -1]

    def forward_cached(self, idx: torch.Tensor, cache: Any, *, last_only: bool = False) -> Any:
        raise TypeError("a plug-in model decodes without a cache (its new_cache gives None)")


def build_plugin_model(config: PluginModelConfig, seed: int | None) -> PluginModel:
    """The plug-in's module of `config`, seeded. Raises ModelBuildError when this worker has
    no such plug-in, or the plug-in refuses the config."""
    plugin = MODEL_PLUGINS.get(config.plugin) if config.plugin in MODEL_PLUGINS else None
    if not isinstance(plugin, ModelPlugin):
        raise ModelBuildError(
            f"model.plugin: this worker has no plug-in model {config.plugin!r} (it has: "
            f"{', '.join(MODEL_PLUGINS.names()) or 'none'})"
        )
    try:
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            inner = plugin.build(dict(config.config), seed)
    except (ValueError, TypeError, KeyError) as exc:
        raise ModelBuildError(f"model.plugin: {config.plugin!r} refuses the config: {exc}") from exc
    for method in ("forward", "loss"):
        if not callable(getattr(inner, method, None)):
            raise ModelBuildError(
                f"model.plugin: {config.plugin!r} built a {type(inner).__name__}, which has "
                f"no {method}(tokens, ...)"
            )
    model = PluginModel(config, plugin, inner.float())
    if config.use_compile:
        inner.compile(mode=None if config.compile_mode == "default" else config.compile_mode)
    return model

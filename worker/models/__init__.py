"""The models a worker builds, by name: the built-in GPT, transformers architectures and the
plug-in models installed on the node (docs/models.md).

A `ModelBuilder` turns a plan's model config into a module that trains through the same
loop: `loss(tokens, targets)` -> (training loss, next-token loss) and `forward(tokens)` ->
logits. Builders are a `Registry` (registering a name twice raises); which one a config
takes is `builder_name(config)`. Plug-ins are a registry of their own (`MODEL_PLUGINS`,
the `trainctl.models` entry-point group, worker/models/plugin.py), so a plug-in can never
take a built-in's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainctl.store.models.hf_config import AnyModelConfig, HfModelConfig, model_config_from_dict
from trainctl.store.models.plugin import PluginModelConfig
from trainctl.store.registry import Registry
from trainctl.worker.models import gpt
from trainctl.worker.models.hf import HFCausalLM, build_hf_model
from trainctl.worker.models.plugin import PluginModel, build_plugin_model

LanguageModel = gpt.GPT | HFCausalLM | PluginModel
"""What the loop, validation and generation are given."""


@dataclass(frozen=True)
class ModelBuilder:
    build: Callable[[Any, int | None], nn.Module]
    """The module of a config, initialised with the seed (None: the global RNG)."""


MODEL_BUILDERS: Registry[ModelBuilder] = Registry("model builder")


def builder_name(config: AnyModelConfig) -> str:
    if isinstance(config, HfModelConfig):
        return "hf"
    return "plugin" if isinstance(config, PluginModelConfig) else "gpt"


def build_model(
    config: AnyModelConfig | str | dict[str, Any],
    *,
    device: torch.device | str = "cpu",
    seed: int | None = None,
    **runtime: Any,
) -> Any:
    """The model of a plan's (or a checkpoint's) config, a preset's name or a config dict,
    on `device`, in float32; `runtime` changes switches such as use_compile."""
    if isinstance(config, str):
        config = gpt.get_preset(config)
    elif isinstance(config, dict):
        config = model_config_from_dict(config)
    if runtime:
        config = config.replace(**runtime)
    model = MODEL_BUILDERS.get(builder_name(config)).build(config, seed)
    return model.to(device=device)


def take_step_metrics(model: nn.Module) -> dict[str, torch.Tensor]:
    """A model's own metrics of the step just taken (an MoE's aux loss); none for most."""
    take = getattr(model, "take_step_metrics", None)
    return take() if take is not None else {}


def model_files(model: nn.Module) -> dict[str, bytes]:
    """Files a checkpoint saves beside the weights for this model (transformers' config)."""
    files = getattr(model, "files", None)
    return files() if files is not None else {}


def state_module(model: nn.Module) -> nn.Module:
    """The module whose attribute paths name `model`'s state: what torch.distributed.
    checkpoint's state-dict helpers are given (they resolve every state-dict key as attributes
    from that module). A wrapper whose state dict is an inner model's, under the inner
    model's names (HFCausalLM: transformers' names), says so with `state_module`."""
    inner = getattr(model, "state_module", None)
    return inner if isinstance(inner, nn.Module) else model


MODEL_BUILDERS.register("gpt", ModelBuilder(lambda cfg, seed: gpt.build_model(cfg, seed=seed)))
MODEL_BUILDERS.register("hf", ModelBuilder(build_hf_model))
MODEL_BUILDERS.register("plugin", ModelBuilder(build_plugin_model))

"""A plug-in model named in a request: `model: {"plugin": {"name": ..., "config": {...}}}`
(docs/models.md, "Plug-in models").

An operator installs a package on a worker's node that declares a model under the
`trainctl.models` entry-point group (worker/models/plugin.py, `ModelPlugin`). The service
never has it (it may run elsewhere, and it never imports torch): a request may only name a
plug-in, and the config is data for the plug-in's builder, checked here as a transformers
config's values are (JSON scalars and lists). Workers report the plug-ins they have when
they register; a run naming one waits until a live worker has it (store/db/placement.py).

Two keys of the config are trainctl's as well as the plug-in's: `vocab_size` and
`max_seq_len`, against which submit checks the data's tokens and the batch's `seq_len`.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, StrictBool, StrictInt, model_validator

from trainctl.store.models.hf import MAX_FIELDS, check_values
from trainctl.store.models.presets import BOUNDS
from trainctl.store.specs import Spec

PLUGIN = "plugin"
"""The key that tags a plug-in model's config (a plan's, a checkpoint's)."""
# Matched whole (fullmatch): `$` with `re.match` also matches before a final newline
# (store/names.py).
PLUGIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
SIZE_KEYS = {"vocab_size": BOUNDS["vocab_size"], "max_seq_len": BOUNDS["max_seq_len"]}
# Widths the memory estimate reads from a config that names them so (any of each row).
WIDTH_KEYS = {
    "d_model": ("d_model", "hidden_size", "n_embd", "dim"),
    "layers": ("n_layers", "num_hidden_layers", "n_layer", "depth"),
    "ffn": ("ffn_hidden", "intermediate_size"),
}


def check_plugin_request(plugin: dict[str, Any]) -> dict[str, Any]:
    """The `model.plugin` of a request, checked: ValueError naming what is wrong."""
    unknown = sorted(set(plugin) - {"name", "config"})
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: a plug-in model takes only name and config")
    name = plugin.get("name")
    if not isinstance(name, str) or PLUGIN_NAME.fullmatch(name) is None:
        raise ValueError(
            "name: the name a plug-in model is registered under (GET /models lists those "
            "the live workers have)"
        )
    config = plugin.get("config", {})
    if not isinstance(config, dict):
        raise ValueError("config: an object, handed to the plug-in's builder")
    if len(config) > MAX_FIELDS:
        raise ValueError(f"config: at most {MAX_FIELDS} fields, got {len(config)}")
    check_values(config, where="config.")
    for key, (low, high) in SIZE_KEYS.items():
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(
                f"config.{key}: an integer from {int(low)} to {int(high):,}, which trainctl "
                f"checks the data and the batch against, got {value!r}"
            )
    return {"name": name, "config": config}


class PluginModelConfig(Spec):
    """A plug-in model as a plan holds it: its registered name and the config it is built
    from."""

    plugin: str = Field(description="The name the plug-in is registered under.")
    config: dict[str, Any] = Field(description="What the plug-in's builder is given.")
    vocab_size: StrictInt = Field(ge=1, description="Token ids are below this (config's).")
    max_seq_len: StrictInt = Field(ge=1, description="The longest context (config's).")
    use_checkpoint_per_layer: StrictBool = Field(
        False, description="Not applied: a plug-in's module checkpoints itself if it wants."
    )
    use_compile: StrictBool = Field(False, description="torch.compile the model.")
    compile_mode: str = Field("default", description="torch.compile mode.")

    @model_validator(mode="after")
    def _as_a_request_is(self) -> PluginModelConfig:
        """A plug-in's config from a plan or a checkpoint passes the request's rules too."""
        check_plugin_request({"name": self.plugin, "config": self.config})
        return self

    @classmethod
    def of_request(cls, plugin: dict[str, Any]) -> PluginModelConfig:
        plugin = check_plugin_request(plugin)
        config = plugin["config"]
        return cls(
            plugin=plugin["name"],
            config=config,
            vocab_size=config["vocab_size"],
            max_seq_len=config["max_seq_len"],
        )

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PluginModelConfig:
        return cls.model_validate(data)

    def replace(self, **changes: Any) -> PluginModelConfig:
        return self.model_copy(update=changes)

    def architecture(self) -> dict[str, Any]:
        """What decides the weights: the plug-in and its config."""
        return {PLUGIN: self.plugin, **self.config}

    def differences(self, other: Any) -> dict[str, tuple[Any, Any]]:
        if not isinstance(other, PluginModelConfig):
            return {"model": (f"plug-in {self.plugin}", type(other).__name__)}
        ours, theirs = self.architecture(), other.architecture()
        return {
            k: (ours.get(k), theirs.get(k)) for k in ours | theirs if ours.get(k) != theirs.get(k)
        }

    def sizes(self) -> dict[str, int]:
        """Rough sizes for the memory estimate (store.training.memory): submit cannot count a
        plug-in's parameters, so they are those of a decoder of the widths its config names under
        the usual names (`d_model` or `hidden_size`, `n_layers` or `num_hidden_layers`, ...),
        or of a small one where it names none."""

        def get(row: str, default: int) -> int:
            for key in WIDTH_KEYS[row]:
                value = self.config.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
            return default

        d = get("d_model", 64)
        layers = get("layers", 1)
        ffn = get("ffn", 4 * d)
        params = 2 * self.vocab_size * d + layers * (4 * d * d + 3 * d * ffn)
        return {
            "params": params,
            "d_model": d,
            "ffn": ffn,
            "kv": d,
            "layers": layers,
            "cache_layers": layers,
        }

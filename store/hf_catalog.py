"""What transformers ships, read from its source without importing it (docs/models.md).

Importing transformers imports torch, which the service never does (docs/architecture.md,
"Rooms"). The facts submit needs are literals in transformers' own files: the causal-LM
model types (`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`), each one's config class
(`CONFIG_MAPPING_NAMES`) and module, and the arguments of that class's `__init__` with their
defaults. `ast` reads them; nothing of transformers is executed. Where transformers is not
installed beside the service, or a file does not read as expected, the answer is None and
the worker, which imports transformers to build the model, checks at claim instead.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

MISSING: Any = object()
"""A default that is not a literal (computed in `__init__`): unknown at submit."""


@dataclass(frozen=True)
class ConfigSignature:
    """A config class's `__init__`: its argument names and their literal defaults."""

    class_name: str
    defaults: dict[str, Any]
    """Each argument's default; MISSING where it is not a literal."""


def transformers_root() -> Path | None:
    """transformers' package folder, found without importing it; None when not installed."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def _module_literals(path: Path, names: set[str]) -> dict[str, Any]:
    """The module-level assignments `names` of `path` whose values are literals (an
    `OrderedDict([...])` call reads as its list of pairs)."""
    found: dict[str, Any] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if not (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)):
            continue
        name, value = node.targets[0].id, node.value
        if name not in names:
            continue
        if isinstance(value, ast.Call) and value.args:
            value = value.args[0]
        try:
            found[name] = ast.literal_eval(value)
        except ValueError:
            continue
    return found


@cache
def causal_lm_types() -> frozenset[str] | None:
    """The model types `AutoModelForCausalLM` builds; None where that cannot be read."""
    root = transformers_root()
    if root is None:
        return None
    try:
        mapping = _module_literals(
            root / "models/auto/modeling_auto.py", {"MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"}
        )["MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"]
    except (OSError, SyntaxError, KeyError):
        return None
    return frozenset(dict(mapping))


@cache
def _auto_config_tables() -> tuple[dict[str, str], dict[str, str], list[str]] | None:
    root = transformers_root()
    if root is None:
        return None
    names = {"CONFIG_MAPPING_NAMES", "SPECIAL_MODEL_TYPE_TO_MODULE_NAME", "DEPRECATED_MODELS"}
    try:
        found = _module_literals(root / "models/auto/configuration_auto.py", names)
        return (
            dict(found["CONFIG_MAPPING_NAMES"]),
            dict(found.get("SPECIAL_MODEL_TYPE_TO_MODULE_NAME", {})),
            list(found.get("DEPRECATED_MODELS", [])),
        )
    except (OSError, SyntaxError, KeyError):
        return None


def _module_name(model_type: str, special: dict[str, str], deprecated: list[str]) -> str:
    # As transformers' own model_type_to_module_name.
    key = special.get(model_type, model_type.replace("-", "_"))
    return f"deprecated.{key}" if key in deprecated else key


@cache
def config_signature(model_type: str) -> ConfigSignature | None:
    """The `__init__` of `model_type`'s config class; None where it cannot be read."""
    tables, root = _auto_config_tables(), transformers_root()
    if tables is None or root is None or model_type not in tables[0]:
        return None
    class_name = tables[0][model_type]
    module = _module_name(model_type, tables[1], tables[2])
    path = root / "models" / Path(*module.split(".")) / f"configuration_{module.split('.')[-1]}.py"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    return ConfigSignature(class_name, _defaults(item.args))
    return None


def _defaults(args: ast.arguments) -> dict[str, Any]:
    positional = args.args[1:]  # not self
    padded: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults))
    pairs = list(zip(positional, padded + list(args.defaults), strict=True))
    pairs += list(zip(args.kwonlyargs, args.kw_defaults, strict=True))
    defaults: dict[str, Any] = {}
    for arg, default in pairs:
        try:
            defaults[arg.arg] = MISSING if default is None else ast.literal_eval(default)
        except ValueError:
            defaults[arg.arg] = MISSING
    return defaults

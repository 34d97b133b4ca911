"""What transformers ships, read from its source without importing it (docs/models.md).

Importing transformers imports torch, which the service never does (docs/architecture.md,
"Rooms"). The facts submit needs are literals in transformers' own files: the causal-LM
model types (`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`), each one's config class
(`CONFIG_MAPPING_NAMES`) and module, and the arguments of that class's `__init__` with their
defaults, and the config attributes the architecture's modeling code reads (a field such as
Qwen3-MoE's `head_dim`, which the class takes through `**kwargs` and the model reads with
`getattr(config, "head_dim", ...)`). `ast` reads them; nothing of transformers is executed.
Where transformers is not installed beside the service, or a file does not read as expected,
the answer is None and the worker, which imports transformers to build the model, checks at
claim instead.
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
    computed: frozenset[str] = frozenset()
    """What `__init__` sets on `self` from the arguments (DeepSeek-V3's `qk_head_dim`): a
    request setting it would contradict what it is computed from."""


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


SUPPORTED_MODEL_TYPES = frozenset(
    {
        "deepseek_v3",
        "falcon",
        "gemma",
        "gemma2",
        "gemma3_text",
        "gpt2",
        "gpt_neox",
        "granite",
        "llama",
        "mamba",
        "mistral",
        "mixtral",
        "olmo",
        "olmo2",
        "olmo3",
        "olmoe",
        "phi",
        "phi3",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "qwen3_next",
        "rwkv",
        "stablelm",
        "starcoder2",
    }
)
"""The decoder-only causal LMs trainctl trains: each one's tiny config trains a step in the
tests (tests/support/hf_archs.py). `AutoModelForCausalLM` takes many more (encoders used as
decoders, the decoders of speech and vision models, types that need kernels or a second
config), which build badly or not at all from a request's fields; GET /models lists only
these, so that every type it lists trains."""


def supported_model_types() -> frozenset[str]:
    """The model types a request may name: those trainctl trains that the transformers
    installed here ships (all of them where it cannot be read: the worker checks)."""
    shipped = causal_lm_types()
    return SUPPORTED_MODEL_TYPES if shipped is None else SUPPORTED_MODEL_TYPES & shipped


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


def _model_file(model_type: str, prefix: str) -> Path | None:
    """`models/<module>/<prefix>_<module>.py` of `model_type`; None where it is unknown."""
    tables, root = _auto_config_tables(), transformers_root()
    if tables is None or root is None or model_type not in tables[0]:
        return None
    module = _module_name(model_type, tables[1], tables[2])
    return root / "models" / Path(*module.split(".")) / f"{prefix}_{module.split('.')[-1]}.py"


@cache
def config_signature(model_type: str) -> ConfigSignature | None:
    """The `__init__` of `model_type`'s config class; None where it cannot be read."""
    tables, path = _auto_config_tables(), _model_file(model_type, "configuration")
    if tables is None or path is None:
        return None
    class_name = tables[0][model_type]
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    defaults = _defaults(item.args)
                    computed = _self_assigned(item) - set(defaults)
                    return ConfigSignature(class_name, defaults, frozenset(computed))
    return None


@cache
def attribute_map(model_type: str) -> dict[str, str]:
    """The config class's `attribute_map`: a common name (`max_position_embeddings`,
    `hidden_size`) to the field that holds it in this class (RWKV's `context_length`, GPT-2's
    `n_embd`). Empty where there is none or it cannot be read."""
    tables, path = _auto_config_tables(), _model_file(model_type, "configuration")
    if tables is None or path is None:
        return {}
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == tables[0][model_type]:
            for item in node.body:
                if (
                    isinstance(item, ast.Assign)
                    and isinstance(item.targets[0], ast.Name)
                    and item.targets[0].id == "attribute_map"
                ):
                    try:
                        found = ast.literal_eval(item.value)
                    except ValueError:
                        return {}
                    return {str(k): str(v) for k, v in dict(found).items()}
    return {}


def _self_assigned(function: ast.FunctionDef) -> set[str]:
    """The names `function` assigns as `self.<name> = ...`."""
    return {
        target.attr
        for node in ast.walk(function)
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Name)
        and target.value.id == "self"
    }


@cache
def _base_config_names() -> frozenset[str]:
    """What `PretrainedConfig` itself defines: its methods and properties (`use_return_dict`,
    `get_text_config`) and the attributes its `__init__` sets. Modeling code reads them, but
    they are not the architecture's fields (store.models.hf accepts the few of them a request may
    set, such as the token ids, by name)."""
    root = transformers_root()
    if root is None:
        return frozenset()
    try:
        tree = ast.parse((root / "configuration_utils.py").read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return frozenset()
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "PretrainedConfig":
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    names.add(item.name)
                    if item.name == "__init__":
                        names |= _self_assigned(item) | set(_defaults(item.args))
                elif isinstance(item, ast.Assign | ast.AnnAssign):
                    targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                    names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return frozenset(names)


@cache
def config_fields(model_type: str) -> frozenset[str] | None:
    """The fields a request may set for `model_type`: its config class's `__init__`
    arguments, and the attributes its modeling code reads that neither the class computes
    nor `PretrainedConfig` defines. None where the config class cannot be read."""
    signature = config_signature(model_type)
    if signature is None:
        return None
    read = modeling_reads(model_type) - signature.computed - _base_config_names()
    return frozenset(signature.defaults) | read


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


@cache
def modeling_reads(model_type: str) -> frozenset[str]:
    """The config attributes `model_type`'s modeling code reads: `config.<name>` (also
    `self.config.<name>`) and `getattr(config, "<name>", ...)`. A field the config class
    takes only through `**kwargs` is still one the model uses when its code reads it. Empty
    where the file cannot be read (the class's own arguments are then all that is known)."""
    path = _model_file(model_type, "modeling")
    if path is None:
        return frozenset()
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return frozenset()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_config(node.value):
            names.add(node.attr)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and _is_config(node.args[0])
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            names.add(node.args[1].value)
    return frozenset(n for n in names if not n.startswith("_"))


def _is_config(node: ast.expr) -> bool:
    """`config` or `<anything>.config`: the model's config object, as modeling code names it."""
    if isinstance(node, ast.Name):
        return node.id == "config"
    return isinstance(node, ast.Attribute) and node.attr == "config"

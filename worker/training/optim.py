"""Optimizers as a named container, built from an optimizer kind's parameter-group rule.

A kind (`store.training.optim`: a request's `optimizer.kind`) has a builder here, registered under
the same name: a rule saying which parameters each of its named optimizers gets, and a
function building those optimizers from the kind's own settings (its record's `settings`
model, which `OptimizerSpec.settings()` gives, typed). What the training loop,
the schedule, the checkpoints and the metrics see is the container, `Optimizers`: an ordered
mapping name -> torch optimizer with one `step`, one `zero_grad` and one state dict keyed by
name (torchtitan's `OptimizersContainer`). The names are the checkpoint's keys
(`optimizer.pt` = `{"muon": ..., "adamw": ...}`) and the metrics' (`lr/muon`, `lr/adamw`).

`muon_adamw` (the default): Muon for the hidden 2-D matrices, AdamW for everything else.
Muon orthogonalises each update of a weight matrix, which only makes sense for matrices that
map activations to activations inside the blocks. The embedding (which is also the tied head)
is a lookup table, and gains/biases are vectors: those go to AdamW, as in modded-nanogpt.
`adamw`: AdamW for every parameter, the baseline Muon is compared against.

A kind of a plug-in declares its builder under the entry-point group `trainctl.optimizers`,
and its record (`store.training.optim.OptimizerKind`, naming its settings model) under
`trainctl.optimizer_kinds` (tests/plugins/trainctl_rmsprop is one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch
from torch import nn

from trainctl.store.registry import Registry
from trainctl.store.training.choice import KindSettings
from trainctl.store.training.optim import (
    AdamWSettings,
    MuonAdamWSettings,
    MuonSettings,
    OptimizerSpec,
    lr_metric,
)
from trainctl.worker.exceptions import CheckpointMismatch
from trainctl.worker.training.sharded_muon import ShardedMuon, is_sharded

Groups = dict[str, list[nn.Parameter]]
"""Parameters by the name of the optimizer that gets them."""
S = TypeVar("S", bound=KindSettings)


class Optimizers(Mapping[str, torch.optim.Optimizer]):
    """Named optimizers that step together; what a run's optimizer is to the rest of it."""

    def __init__(self, kind: str, optimizers: Mapping[str, torch.optim.Optimizer]) -> None:
        if not optimizers:
            raise ValueError(f"optimizer kind {kind!r} built no optimizer")
        self.kind = kind
        self._optimizers = dict(optimizers)

    def __getitem__(self, name: str) -> torch.optim.Optimizer:
        return self._optimizers[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._optimizers)

    def __len__(self) -> int:
        return len(self._optimizers)

    def step(self) -> None:
        for optimizer in self.values():
            optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.values():
            optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """Each optimizer's state dict, under its name: what `optimizer.pt` holds."""
        return {name: optimizer.state_dict() for name, optimizer in self.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore every optimizer from `state` (a `state_dict()`); CheckpointMismatch when
        it holds other optimizers than these, saying which."""
        if set(state) != set(self):
            raise CheckpointMismatch(
                f"its optimizer state is of {', '.join(sorted(state)) or 'no optimizer'}, but "
                f"this run's optimizer kind {self.kind!r} trains with "
                f"{', '.join(sorted(self))}; resume with the optimizer kind the checkpoint was "
                "saved with, or train from scratch"
            )
        for name, optimizer in self.items():
            optimizer.load_state_dict(state[name])

    def lrs(self) -> dict[str, float]:
        """Each optimizer's current learning rate (of its first param group), by name."""
        return {name: optimizer.param_groups[0]["lr"] for name, optimizer in self.items()}

    def lr_metrics(self) -> dict[str, float]:
        """The learning rates as a train metrics event names them: `lr/<name>`."""
        return {lr_metric(name): lr for name, lr in self.lrs().items()}


@dataclass(frozen=True)
class OptimizerBuilder(Generic[S]):
    """How the worker builds one optimizer kind, from its settings (`S`, the model its record
    names)."""

    groups: Callable[[nn.Module], Groups]
    """The parameter-group rule: which trainable parameters each named optimizer gets; each
    one exactly once (`build_optimizers` checks)."""
    build: Callable[[Groups, S], dict[str, torch.optim.Optimizer]]
    """The optimizers over those groups, by the same names, with the kind's settings."""


OPTIMIZER_BUILDERS: Registry[OptimizerBuilder[Any]] = Registry(
    "optimizer builder", group="trainctl.optimizers"
)


def build_optimizers(model: nn.Module, spec: OptimizerSpec | None = None) -> Optimizers:
    """The optimizers of `spec.kind` over `model`'s trainable parameters."""
    spec = spec or OptimizerSpec()
    builder = OPTIMIZER_BUILDERS.get(spec.kind)
    groups = builder.groups(model)
    check_partition(model, groups, spec.kind)
    optimizers = builder.build(groups, spec.settings())
    if optimizers.keys() != groups.keys():
        raise ValueError(
            f"optimizer kind {spec.kind!r} built {', '.join(optimizers)} for the parameter "
            f"groups {', '.join(groups)}"
        )
    return Optimizers(spec.kind, optimizers)


def check_partition(model: nn.Module, groups: Groups, kind: str) -> None:
    """ValueError unless every trainable parameter is in exactly one group: one left out
    would never train, one in two groups would be updated twice."""
    names = {id(p): name for name, p in trainable(model)}
    owner: dict[int, str] = {}
    for group, params in groups.items():
        for p in params:
            if id(p) not in names:
                raise ValueError(f"optimizer kind {kind!r} gives {group} a parameter not trained")
            if id(p) in owner:
                raise ValueError(
                    f"optimizer kind {kind!r} gives {names[id(p)]} to {owner[id(p)]} and {group}"
                )
            owner[id(p)] = group
    missing = [name for i, name in names.items() if i not in owner]
    if missing:
        raise ValueError(f"optimizer kind {kind!r} gives no optimizer {', '.join(missing)}")


def trainable(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """`named_parameters` yields a shared (tied) tensor once, so the tied head counts once."""
    return [(name, p) for name, p in model.named_parameters() if p.requires_grad]


# --- muon_adamw -----------------------------------------------------------------------------


# Module names of MoE routers and gates, as transformers names them (`mlp.gate` of Qwen3-MoE
# and DeepSeek-V3, `router`, Qwen3-Next's `shared_expert_gate`): their 2-D weight maps the
# hidden state to one score per expert, a classifier, not a hidden transformation.
ROUTER_NAMES = frozenset({"gate", "router", "shared_expert_gate"})


def adamw_only(model: nn.Module) -> set[int]:
    """The parameters that are not hidden matrices, whatever their shape: embeddings (and
    whatever is tied to them), output heads, and MoE routers (ids)."""
    modules = [m for name, m in model.named_modules() if _is_table_or_router(name, m)]
    heads = getattr(model, "output_heads", None)
    modules += list(heads()) if heads is not None else []
    return {id(p) for m in modules for p in m.parameters()}


def _is_table_or_router(name: str, module: nn.Module) -> bool:
    return isinstance(module, nn.Embedding) or name.rsplit(".", 1)[-1] in ROUTER_NAMES


def muon_params(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """Muon's parameters, for every model: the hidden 2-D weight matrices. Muon
    orthogonalises each update of a matrix, which fits matrices that map activations to
    activations inside the blocks; a lookup table (an embedding, a tied head), an output
    head, a router, a vector (norms, gains, biases) or a kernel of another rank (a conv1d's)
    goes to AdamW. A plug-in model that declares its own rule gets that instead
    (worker/models/plugin.py)."""
    own = getattr(model, "muon_param_names", None)
    names = own() if own is not None else None
    if names is not None:
        return [(n, p) for n, p in trainable(model) if n in names]
    others = adamw_only(model)
    return [(n, p) for n, p in trainable(model) if p.dim() == 2 and id(p) not in others]


def muon_adamw_groups(model: nn.Module) -> Groups:
    muon = {id(p) for _, p in muon_params(model)}
    params = trainable(model)
    return {
        "muon": [p for _, p in params if id(p) in muon],
        "adamw": [p for _, p in params if id(p) not in muon],
    }


def build_muon_adamw(
    groups: Groups, settings: MuonAdamWSettings
) -> dict[str, torch.optim.Optimizer]:
    """On FSDP2's sharded parameters (DTensors) Muon is `ShardedMuon`, which orthogonalises each
    matrix once on an owner rank; on whole ones (one process, DDP) it is torch's own."""
    muon_class = ShardedMuon if is_sharded(groups["muon"]) else torch.optim.Muon
    muon = muon_class(groups["muon"], **muon_settings(settings))
    return {"muon": muon, "adamw": build_adamw(groups["adamw"], settings)}


def muon_settings(settings: MuonSettings) -> dict[str, Any]:
    """Muon's settings, as `torch.optim.Muon` (and `ShardedMuon`) take them."""
    return dict(
        lr=settings.muon_lr,
        momentum=settings.muon_momentum,
        weight_decay=settings.muon_weight_decay,
        nesterov=True,
        adjust_lr_fn=settings.muon_adjust_lr_fn,
    )


# --- adamw ----------------------------------------------------------------------------------


def adamw_groups(model: nn.Module) -> Groups:
    return {"adamw": [p for _, p in trainable(model)]}


def build_adamw_only(groups: Groups, settings: AdamWSettings) -> dict[str, torch.optim.Optimizer]:
    return {"adamw": build_adamw(groups["adamw"], settings)}


def build_adamw(params: list[nn.Parameter], settings: AdamWSettings) -> torch.optim.AdamW:
    """AdamW with weight decay on the matrices of `params` only: vectors (norms, gains,
    biases) are never decayed.

    Fused on every device: torch has a fused AdamW kernel for CPU as well as CUDA, and on CPU
    it is about 9x faster than the default per-tensor loop (one pass over each parameter
    instead of a dozen; docs/performance.md).
    """
    matrices = [p for p in params if p.dim() >= 2]
    vectors = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW(
        [
            {"params": matrices, "weight_decay": settings.adamw_weight_decay},
            {"params": vectors, "weight_decay": 0.0},
        ],
        lr=settings.adamw_lr,
        betas=(settings.adamw_beta1, settings.adamw_beta2),
        eps=settings.adamw_eps,
        fused=True,
    )


OPTIMIZER_BUILDERS.register("muon_adamw", OptimizerBuilder(muon_adamw_groups, build_muon_adamw))
OPTIMIZER_BUILDERS.register("adamw", OptimizerBuilder(adamw_groups, build_adamw_only))

"""The ranks of a sharded data-parallel run: FSDP2 (`fully_shard`), per transformer block and
the root (docs/design/training.md, "Multi-GPU and multi-node"; store.training.parallelism `fsdp`).

Each of the W ranks keeps 1/W of every parameter (a `DTensor` sharded on dim 0), of its
gradient and so of its optimizer state: the optimizers are built over the sharded parameters
(worker.training.loop.build_training shards before it builds them). A block's forward all-gathers
its full parameters and, with `reshard_after_forward`, frees them after; its backward gathers them
again and reduce-scatters the gradient, so each rank ends the step with the averaged gradient
of its own shard, which AdamW updates as it is and torch.optim.Muon orthogonalises through
DTensor's implicit gathers (correct, but every rank repeats the Newton-Schulz of every matrix).

The order of what wraps a block is torchtitan's: activation checkpointing (the model's own,
`GPT.hidden`, around each block's call), then torch.compile of the block, then `fully_shard`,
so FSDP's all-gather and reduce-scatter stay outside the compiled graph. The whole-model
compile of a replicated run (worker.models.gpt.compile_model) is left out: dynamo would trace into
FSDP's hooks.

A train run's checkpoints are sharded (store.training.parallelism `checkpoint_layout` "dcp"):
every rank writes its own shards (worker.checkpoints.sharded, driven by
worker.training.ranks.RankTrainer), and they load at any world size and strategy, or into one
process for validate, sample and export. A replicated run's full checkpoint resumes here too:
every rank reads the full state and keeps its shard (`load_model_state`,
`load_optimizer_state`). The gathering side of `StateAccess` (`model_state`, `optimizer_state`:
full state dicts on rank 0's CPU) is what a full checkpoint of a sharded model would be
written from.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from itertools import chain
from typing import Any, cast

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor

from trainctl.worker.exceptions import CheckpointMismatch
from trainctl.worker.models import state_module
from trainctl.worker.models.gpt import GPT
from trainctl.worker.training.optim import Optimizers
from trainctl.worker.training.parallel import mean_across_ranks

GATHER = StateDictOptions(full_state_dict=True, cpu_offload=True)
"""Save: every rank takes part in the all-gathers; rank 0 alone keeps the result, on CPU."""
SCATTER = StateDictOptions(full_state_dict=True)
"""Resume: every rank has read the full state from the checkpoint and keeps its shard."""


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks, each one FSDP unit: the built-in GPT's `blocks`, or a
    transformers model's decoder layers (its longest ModuleList)."""
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, nn.ModuleList):
        return list(blocks)
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    if not lists:
        raise ValueError(f"{type(model).__name__} has no blocks to shard")
    return list(max(lists, key=lambda m: len(list(m))))


def shard_model(
    model: nn.Module,
    device: torch.device,
    world: int,
    *,
    reshard_after_forward: bool,
    compile_mode: str | None,
) -> None:
    """`fully_shard` each block and then the root, in place, on an explicit 1-D mesh of the
    `world` ranks (without one, fully_shard picks CUDA whatever the process group: a gloo run
    on a GPU box moved its parameters there, pytorch/pytorch#132471). `compile_mode`: compile
    each block first (None: eager)."""
    mesh = init_device_mesh(device.type, (world,))
    # On CUDA the gathered parameters and the gradients' compute are bf16, the reduce-scatter
    # and the sharded master weights fp32; on a CPU everything stays fp32.
    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if device.type == "cuda"
        else MixedPrecisionPolicy()
    )
    for block in transformer_blocks(model):
        if compile_mode is not None:
            block.compile(mode=None if compile_mode == "default" else compile_mode)
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp)
    if hasattr(model, "loss"):
        # Training calls `loss`, not forward: the root's gather must run around it too.
        register_fsdp_forward_method(model, "loss")


class FSDPShards:
    """`DataParallel` for `worker.training.loop`: one of `world` ranks, each holding 1/world of the
    model's state (see the module's docstring)."""

    def __init__(
        self,
        model: nn.Module,
        device: torch.device,
        world_size: int,
        *,
        reshard_after_forward: bool = True,
        compile_mode: str | None = None,
    ) -> None:
        self.world_size = world_size
        self.model = model
        shard_model(
            model,
            device,
            world_size,
            reshard_after_forward=reshard_after_forward,
            compile_mode=compile_mode,
        )

    def loss(self, model: GPT, tokens: torch.Tensor, targets: torch.Tensor) -> Any:
        return model.loss(tokens, targets)

    @contextlib.contextmanager
    def sync_gradients(self, last: bool) -> Iterator[None]:
        """Accumulate unsharded gradients locally; reduce-scatter once per step, in the last
        micro-batch's backward (as DDPReplica all-reduces once)."""
        cast(Any, self.model).set_requires_gradient_sync(last)
        yield

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        return mean_across_ranks(value, self.world_size)

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        """The global norm over the shards: each rank's norm of its shards is a partial
        DTensor, made whole (an all-reduce) before the clip scales every shard by it."""
        params = [p for p in model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([cast(torch.Tensor, p.grad) for p in params])
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
        return norm

    # ---- StateAccess: full checkpoints, from and to the shards ----------------------------

    def model_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return cast(
            dict[str, torch.Tensor], get_model_state_dict(state_module(model), options=GATHER)
        )

    def optimizer_state(self, model: nn.Module, optimizers: Optimizers) -> dict[str, Any]:
        """Each optimizer's full state as `optimizer.pt` holds it (keyed by parameter index,
        as `torch.optim.Optimizer.state_dict` keys it); {} on the ranks but 0."""
        state = {
            name: get_optimizer_state_dict(state_module(model), optimizer, options=GATHER)
            for name, optimizer in optimizers.items()
        }
        return {name: by_index(s) for name, s in state.items() if s}

    def load_model_state(
        self, model: nn.Module, state: dict[str, torch.Tensor], strict: bool
    ) -> None:
        options = StateDictOptions(full_state_dict=True, strict=strict)
        set_model_state_dict(state_module(model), cast(dict[str, Any], state), options=options)

    def load_optimizer_state(
        self, model: nn.Module, optimizers: Optimizers, state: dict[str, Any]
    ) -> None:
        if set(state) != set(optimizers):
            # The same refusal a replicated run's Optimizers.load_state_dict gives.
            raise CheckpointMismatch(
                f"its optimizer state is of {', '.join(sorted(state)) or 'no optimizer'}, but "
                f"this run's optimizer kind {optimizers.kind!r} trains with "
                f"{', '.join(sorted(optimizers))}"
            )
        names = {id(p): name for name, p in state_module(model).named_parameters()}
        for name, optimizer in optimizers.items():
            fqns = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
            set_optimizer_state_dict(
                state_module(model), optimizer, by_name(state[name], fqns), options=SCATTER
            )


def by_index(state: dict[str, Any]) -> dict[str, Any]:
    """A full optimizer state dict keyed by parameter name (torch.distributed.checkpoint's)
    keyed by index instead, the index counting the parameters through the param groups in
    order, as `Optimizer.state_dict` numbers them."""
    order = list(chain.from_iterable(g["params"] for g in state["param_groups"]))
    index = {fqn: i for i, fqn in enumerate(order)}
    groups = [{**g, "params": [index[f] for f in g["params"]]} for g in state["param_groups"]]
    return {"state": {index[f]: s for f, s in state["state"].items()}, "param_groups": groups}


def by_name(state: dict[str, Any], fqns: list[str]) -> dict[str, Any]:
    """`by_index` undone: `fqns` names the optimizer's parameters in index order."""
    groups = [{**g, "params": [fqns[i] for i in g["params"]]} for g in state["param_groups"]]
    return {"state": {fqns[i]: s for i, s in state["state"].items()}, "param_groups": groups}

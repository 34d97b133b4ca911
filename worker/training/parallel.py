"""How the processes of a train run share its work: one process alone (`SingleProcess`), or
the ranks of a data-parallel run (`DDPReplica`) kept identical by averaging their gradients,
or the ranks of a sharded one (`worker.training.fsdp.FSDPShards`).

The training loop (`worker.training.loop`) sees only the `DataParallel` protocol, so a strategy is
one more implementation of it, registered by name in `worker.training.parallelism`. Which processes
run and how they meet is the launcher's (`worker.launch`).

The global batch is the plan's: `micro_batch_size × grad_accum_steps` sequences per step, the
same as a single-process run. Rank r computes micro-batches r, r + W, r + 2W, ... of it (so
`grad_accum_steps` must be a multiple of the world size W), and since a batch is a pure
function of its position the ranks together read exactly the batches one process would.
At every step the ranks agree whether to stop (`AgreedStop`), so every rank stops at the same
step (docs/design/training.md, "Multi-GPU and multi-node").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainctl.worker.checkpoints.state import LocalState, StateAccess
from trainctl.worker.data.loader import Batch, Sampler
from trainctl.worker.models.gpt import GPT

STOP_CODES = {"grow": 1, "shutdown": 2, "cancel": 3, "lease_lost": 4, "lease_expired": 5}
"""A rank's reason to stop, as the all-reduce (MAX) agrees on one: a lost lease wins, and
one that ran out unconfirmed (worker/context.py) most of all; an elastic gang growing back
(docs/design/placement.md, "Elastic gangs") yields to any other."""


class DataParallel(StateAccess, Protocol):
    """How a step's micro-batches become one gradient: here alone, or across the ranks of a
    multi-GPU run (`DDPReplica`), each running `1 / world_size` of them; and how a checkpoint
    reads and restores the state (`StateAccess`)."""

    world_size: int

    def loss(self, model: GPT, tokens: torch.Tensor, targets: torch.Tensor) -> Any: ...
    def sync_gradients(self, last: bool) -> AbstractContextManager[Any]: ...
    def mean(self, value: torch.Tensor) -> torch.Tensor: ...
    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        """Clip the gradients to a global norm of `max_norm`; return their norm before, on
        the device (the step reads it with its loss: one sync)."""
        ...


def clip_local_grad_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """`clip_grad_norm` of a process that holds whole gradients."""
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


def rank_and_world(group: dist.ProcessGroup | None = None) -> tuple[int, int]:
    """This process's rank in `group` (the default group: the run's) and its size; 0 and 1
    outside a process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def mean_across_ranks(value: torch.Tensor, world_size: int) -> torch.Tensor:
    total = value.detach().clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)  # gloo has no AVG
    return total / world_size


class SingleProcess(LocalState):
    world_size = 1

    def loss(self, model: GPT, tokens: torch.Tensor, targets: torch.Tensor) -> Any:
        return model.loss(tokens, targets)

    def sync_gradients(self, last: bool) -> AbstractContextManager[Any]:
        return nullcontext()

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        return value

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        return clip_local_grad_norm(model, max_norm)


class RankSampler:
    """Rank `rank`'s share of the batches: positions start + rank, + world, + 2·world, ...

    A train step reads `grad_accum_steps` consecutive positions p, p+1, ...; with
    `grad_accum_steps` a multiple of `world`, each rank reads its `grad_accum_steps / world` of
    them, and the next step's share follows on from where this one's ended.
    """

    def __init__(self, base: Sampler, rank: int, world: int) -> None:
        self.base, self.rank, self.world = base, rank, world

    def batch(self, position: int) -> Batch:
        return self.base.batch(position)

    def iterate(self, start: int = 0) -> Iterator[Batch]:
        position = start + self.rank
        while True:
            yield self.base.batch(position)
            position += self.world


class _Loss(nn.Module):
    """Puts `GPT.loss` behind `forward`: DDP only prepares its gradient hooks in forward."""

    def __init__(self, model: GPT) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> Any:
        return self.model.loss(tokens, targets)


class DDPReplica(LocalState):
    """`DataParallel` for `worker.training.loop`: one of `world` replicas kept in sync by DDP.

    DDP all-reduces (averages) the gradients during the last backward of a step, so when
    `train_step` clips and then steps the optimizers (`Optimizers.step`), every rank holds the
    same averaged gradient. That order is what makes Muon correct here: its update
    orthogonalises the (momentum of the) whole gradient matrix with Newton-Schulz, a non-linear
    map, so it must see the global average (orthogonalise(mean g) ≠ mean(orthogonalise g)),
    and since every rank then applies the same deterministic update to the same weights, the
    replicas stay identical without any further communication. The same holds for AdamW (of
    either optimizer kind) and the clip norm.
    """

    def __init__(self, model: GPT, device: torch.device, world_size: int) -> None:
        self.world_size = world_size
        ids = [torch.cuda.current_device()] if device.type == "cuda" else None
        # No buffer broadcast at each forward: the models' buffers (rotary tables) are built
        # alike on every rank and never trained, and that broadcast would make every forward
        # wait for the slowest rank, hiding which one it is (worker.training.hangs.OwnClock).
        self.ddp = DistributedDataParallel(_Loss(model), device_ids=ids, broadcast_buffers=False)

    def loss(self, model: GPT, tokens: torch.Tensor, targets: torch.Tensor) -> Any:
        return self.ddp(tokens, targets)  # `model`, wrapped once in __init__

    def sync_gradients(self, last: bool) -> contextlib.AbstractContextManager[Any]:
        """Accumulate locally, all-reduce once per step (in the last micro-batch's backward)."""
        return contextlib.nullcontext() if last else self.ddp.no_sync()

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        return mean_across_ranks(value, self.world_size)

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        return clip_local_grad_norm(model, max_norm)  # every rank holds the averaged whole


class AgreedStop:
    """A stop predicate every rank calls at the same step: any rank's reason stops them all
    (a worker of a gang member shutting down, or losing its lease, reaches only its own
    node's ranks). `reason` is the one agreed on, for rank 0's report; `on_agreed` hears it
    when they stop, on every rank, whichever rank asked."""

    def __init__(
        self,
        local: Callable[[], str | None],
        device: torch.device,
        own_seconds: Callable[[], float] | None = None,
        on_times: Callable[[list[float]], None] | None = None,
        on_agreed: Callable[[str], None] | None = None,
    ) -> None:
        self.local, self.device = local, device
        self.own_seconds, self.on_times, self.on_agreed = own_seconds, on_times, on_agreed
        self.reason: str | None = None

    def __call__(self) -> bool:
        """With `own_seconds`, each rank's own step time rides along in its slot of the same
        all-reduce (MAX: the other slots are 0), and `on_times` hears all of them
        (worker.training.hangs): no collective of their own."""
        mine = self.local()
        code = STOP_CODES[mine] if mine else 0
        if self.own_seconds is None:
            values = torch.tensor([code], device=self.device)
        else:
            rank, world = rank_and_world()
            values = torch.zeros(1 + world, dtype=torch.float64, device=self.device)
            values[0], values[1 + rank] = code, self.own_seconds()
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
        got = values.tolist()
        agreed = int(got[0])
        if self.on_times is not None and len(got) > 1:
            self.on_times(got[1:])
        self.reason = next((r for r, c in STOP_CODES.items() if c == agreed), None)
        if self.reason is not None and self.on_agreed is not None:
            self.on_agreed(self.reason)
        return agreed > 0

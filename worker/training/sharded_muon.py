"""Muon on FSDP2 shards: each hidden matrix orthogonalised once per step, on one owner rank.

`torch.optim.Muon` on `fully_shard` parameters (DTensors, `Shard(0)` over a 1-D mesh) computes
the right update, but DTensor dispatch gathers the matrix again for each Newton-Schulz
iteration and every rank repeats every iteration: 15 all-gathers and 12 all-reduces for two
matrices on two ranks (docs/design/training.md, "Muon on shards"). `ShardedMuon` is the same
optimizer with another step:

1. momentum on the local shard, as it is (the buffer is a DTensor sharded like its parameter);
2. one `all_to_all_single`: each rank sends its rows of matrix i to `owner(i)`, in bfloat16,
   the dtype Newton-Schulz starts with, so the owner sees exactly what one process would;
3. each owner runs Newton-Schulz on its whole matrices, once each;
4. one `all_to_all_single` back: each rank receives its rows of every orthogonalised matrix
   and updates its shard.

Two collectives per parameter group and step, whatever the number of matrices or of
Newton-Schulz iterations. Owners are balanced by Newton-Schulz cost (longest first, to the
least loaded rank), computed from the global shapes, so every rank agrees without talking.

It subclasses `torch.optim.Muon`: the same settings, validation, state (`momentum_buffer`,
shaped and sharded like the parameter) and state dict, so a checkpoint of one loads into the
other and DCP reshards it. A group of plain tensors steps with torch's own code, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor, Shard
from torch.optim._muon import _adjust_lr, _zeropower_via_newtonschulz, muon
from torch.optim.optimizer import _to_scalar

newton_schulz: Callable[[Tensor, tuple[float, float, float], int, float], Tensor] = (
    _zeropower_via_newtonschulz
)
"""torch's own Newton-Schulz (bf16, quintic, the same coefficients and eps). A module name the
step looks up each call, so a test can count the orthogonalisations."""

WIRE_DTYPE = torch.bfloat16
"""What the shards travel as: Newton-Schulz casts its input to bfloat16 first, so sending
bfloat16 halves the bytes and changes nothing; its output is bfloat16 too."""


def is_sharded(params: Iterable[Tensor]) -> bool:
    """Whether these are DTensors (FSDP2's parameters), which `ShardedMuon` is for."""
    return any(isinstance(p, DTensor) for p in params)


class ShardedMuon(torch.optim.Muon):
    """`torch.optim.Muon` whose step on `Shard(0)` DTensors orthogonalises each matrix once,
    on its owner rank, with two collectives per parameter group (module docstring)."""

    def __init__(self, params: Any, **settings: Any) -> None:
        super().__init__(params, **settings)
        for group in self.param_groups:
            check_layout(group["params"])

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params: list[Tensor] = []
            grads: list[Tensor] = []
            bufs: list[Tensor] = []
            has_complex = self._init_group(group, params, grads, bufs)
            if not params:
                continue
            if not is_sharded(params):
                muon(params, grads, bufs, **torch_settings(group), has_complex=has_complex)
                continue
            sharded_step(params, grads, bufs, group)
        return loss


def check_layout(params: Sequence[Tensor]) -> None:
    """ValueError unless the group is all plain tensors, or all DTensors sharded on dim 0 over
    one 1-D mesh: the layout the owner exchange knows how to cut."""
    if not is_sharded(params):
        return
    meshes = {id(p.device_mesh) for p in params if isinstance(p, DTensor)}
    for p in params:
        if not isinstance(p, DTensor):
            raise ValueError(
                f"ShardedMuon got a plain {tuple(p.shape)} tensor in a group of DTensors; "
                "shard every parameter of the group (fully_shard) or none"
            )
        if p.device_mesh.ndim != 1 or tuple(p.placements) != (Shard(0),):
            raise ValueError(
                f"ShardedMuon handles DTensors sharded Shard(0) over a 1-D mesh (FSDP2), not "
                f"placements {p.placements} over a {p.device_mesh.ndim}-D mesh"
            )
    if len(meshes) > 1:
        raise ValueError("ShardedMuon's parameters of one group must share one device mesh")


def torch_settings(group: dict[str, Any]) -> dict[str, Any]:
    """A param group's settings as torch's functional `muon` takes them."""
    names = ["lr", "weight_decay", "momentum", "nesterov", "ns_coefficients", "ns_steps", "eps"]
    return {n: group[n] for n in [*names, "adjust_lr_fn"]}


def sharded_step(
    params: list[Tensor], grads: list[Tensor], bufs: list[Tensor], group: dict[str, Any]
) -> None:
    lr, momentum = _to_scalar(group["lr"]), group["momentum"]
    updates = []
    for g, b in zip(grads, bufs, strict=True):
        grad, buf = g.to_local(), b.to_local()  # type: ignore[attr-defined]
        buf.lerp_(grad, 1 - momentum)  # torch.optim.Muon's momentum, on the local rows
        updates.append(grad.lerp(buf, momentum) if group["nesterov"] else buf)
    layout = Layout.of(params, updates[0].device)
    full = layout.to_owners(updates)
    orthogonal = {
        i: newton_schulz(m, group["ns_coefficients"], group["ns_steps"], group["eps"])
        for i, m in full.items()
    }
    for p, update in zip(params, layout.from_owners(orthogonal), strict=True):
        shard = p.to_local()  # type: ignore[attr-defined]
        shard.mul_(1 - lr * group["weight_decay"])
        shard.add_(update, alpha=-_adjust_lr(lr, group["adjust_lr_fn"], p.shape))


def shard_rows(rows: int, world: int) -> list[int]:
    """How many rows of a matrix each rank holds under Shard(0): DTensor's (torch.chunk's)
    split, uneven at the end and possibly empty, as FSDP2 cuts it."""
    return [Shard.local_shard_size_and_offset(rows, world, r)[0] for r in range(world)]


def assign_owners(shapes: Sequence[tuple[int, ...]], world: int) -> list[int]:
    """The rank that orthogonalises each matrix: longest Newton-Schulz first, to the least
    loaded rank (ties to the lowest), so the ranks finish together. Pure in the shapes, so
    every rank computes the same answer."""
    load = [0] * world
    owners = [0] * len(shapes)
    cost = [r * c * min(r, c) for r, c in shapes]  # the Gram products' flops, up to a constant
    for i in sorted(range(len(shapes)), key=lambda i: (-cost[i], i)):
        owner = min(range(world), key=lambda r: (load[r], r))
        owners[i] = owner
        load[owner] += cost[i]
    return owners


@dataclass(frozen=True)
class Layout:
    """Who holds which rows of a group's matrices, and who orthogonalises each."""

    shapes: list[tuple[int, int]]
    """Each matrix's global (rows, cols)."""
    rows: list[list[int]]
    """rows[i][r]: how many rows of matrix i rank r holds."""
    owners: list[int]
    rank: int
    device: torch.device
    pg: dist.ProcessGroup

    @classmethod
    def of(cls, params: list[Tensor], device: torch.device) -> Layout:
        mesh = params[0].device_mesh  # type: ignore[attr-defined]
        world = mesh.size()
        shapes = [(int(p.shape[0]), int(p.shape[1])) for p in params]
        rows = [shard_rows(r, world) for r, _ in shapes]
        for p, r in zip(params, rows, strict=True):
            local = p.to_local().shape[0]  # type: ignore[attr-defined]
            assert local == r[mesh.get_local_rank()], f"shard of {local} rows, expected {r}"
        owners = assign_owners(shapes, world)
        return cls(shapes, rows, owners, mesh.get_local_rank(), device, mesh.get_group())

    @property
    def world(self) -> int:
        return len(self.rows[0])

    def owned_by(self, rank: int) -> list[int]:
        return [i for i, o in enumerate(self.owners) if o == rank]

    def to_owners(self, updates: list[Tensor]) -> dict[int, Tensor]:
        """Every rank's rows of the matrices this rank owns, assembled: {index: (rows, cols)},
        in bfloat16 (WIRE_DTYPE)."""
        send = [
            [updates[i].to(WIRE_DTYPE).reshape(-1) for i in self.owned_by(dst)]
            for dst in range(self.world)
        ]
        mine = self.owned_by(self.rank)
        sizes = [[self.rows[i][src] * self.shapes[i][1] for i in mine] for src in range(self.world)]
        received = self.exchange(send, sizes)
        return {
            i: torch.cat(
                [
                    received[src][k].view(self.rows[i][src], self.shapes[i][1])
                    for src in range(self.world)
                ]
            )
            for k, i in enumerate(mine)
        }

    def from_owners(self, orthogonal: dict[int, Tensor]) -> list[Tensor]:
        """This rank's rows of every orthogonalised matrix, from their owners."""
        mine = self.owned_by(self.rank)
        starts = [[sum(r[:k]) for k in range(self.world)] for r in self.rows]
        send = [
            [
                orthogonal[i][starts[i][dst] : starts[i][dst] + self.rows[i][dst]].reshape(-1)
                for i in mine
            ]
            for dst in range(self.world)
        ]
        theirs = [self.owned_by(src) for src in range(self.world)]
        sizes = [
            [self.rows[i][self.rank] * self.shapes[i][1] for i in theirs[src]]
            for src in range(self.world)
        ]
        received = self.exchange(send, sizes)
        local: list[Tensor] = [torch.empty(0)] * len(self.shapes)
        for src in range(self.world):
            for k, i in enumerate(theirs[src]):
                local[i] = received[src][k].view(self.rows[i][self.rank], self.shapes[i][1])
        return local

    def exchange(self, send: list[list[Tensor]], sizes: list[list[int]]) -> list[list[Tensor]]:
        """One `all_to_all_single`: the flat tensors `send[dst]` to each rank; from each rank
        `src`, tensors of `sizes[src]` elements, returned as views `[src][k]`."""
        in_splits = [sum(t.numel() for t in ts) for ts in send]
        out_splits = [sum(s) for s in sizes]
        flat = [t for ts in send for t in ts]
        inp = torch.cat(flat) if flat else torch.empty(0, dtype=WIRE_DTYPE, device=self.device)
        out = torch.empty(sum(out_splits), dtype=WIRE_DTYPE, device=self.device)
        dist.all_to_all_single(out, inp, out_splits, in_splits, group=self.pg)
        return [list(chunk.split(s)) for chunk, s in zip(out.split(out_splits), sizes, strict=True)]

"""Placement: what a run needs of the workers that take it, and which workers can give it.

A run asks for `nnodes` workers ("nodes"), each with `gpus_per_node` GPUs (0: the run is on the
CPU, and then each of its `procs_per_node` processes wants a core). A worker advertises what it
has when it registers (`Capacity`); it claims only runs it can serve, so a run never fails for
lack of GPUs: it waits, and `why_waiting` says in words what it waits for. A run with
`nnodes > 1` is a gang: N workers claim it together (docs/design/placement.md, "Placement and
gangs"); `spread` says whether they must share a node name, must each be on another node, or
may be anywhere. A run of a plug-in model (store/models/plugin.py) needs workers that have
that plug-in installed, as they report when they register. An elastic gang (`min_nnodes`
below `nnodes`) that has waited `shrink_after_seconds` seconds for all its nodes takes as few as
`min_nnodes` (docs/design/placement.md, "Elastic gangs").

This module is pure (no database, no torch): the run store asks it, and so does the service
when it explains a queued run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

Spread = Literal["any", "same_node", "distinct_nodes"]
SPREADS: tuple[str, ...] = get_args(Spread)


@dataclass(frozen=True)
class Placement:
    """What one run needs: `nnodes` workers, each with this much."""

    nnodes: int = 1
    gpus_per_node: int = 0
    procs_per_node: int = 1
    spread: Spread = "any"
    model_plugin: str | None = None
    """The plug-in model each worker must have; None: a built-in or transformers model."""
    min_nnodes: int | None = None
    """The fewest nodes an elastic gang runs on; None: exactly `nnodes`."""
    shrink_after_seconds: float = 0.0
    """Seconds an elastic gang waits for `nnodes` workers before it takes fewer."""
    avoid_nodes: tuple[str, ...] = ()
    """Nodes (sorted) to keep clear of where enough others can take the run: a run's stragglers'
    (docs/design/hangs.md, "Stragglers")."""

    def fewest(self, waited: float) -> int:
        """The fewest nodes the run may be placed on after `waited` seconds in the queue."""
        if self.min_nnodes is None or waited < self.shrink_after_seconds:
            return self.nnodes
        return self.min_nnodes

    @property
    def is_gang(self) -> bool:
        return self.nnodes > 1

    def describe(self) -> str:
        """'2 nodes of 8 GPUs', '1 node of 2 CPU processes', '2 to 3 nodes of 1 GPU', ..."""
        low = self.min_nnodes if self.min_nnodes is not None else self.nnodes
        count = f"{low} to {self.nnodes}" if low < self.nnodes else str(self.nnodes)
        nodes = f"{count} node{'s' if self.nnodes > 1 else ''}"
        if self.gpus_per_node:
            each = f"{self.gpus_per_node} GPU{'s' if self.gpus_per_node > 1 else ''}"
        else:
            each = f"{self.procs_per_node} CPU process{'es' if self.procs_per_node > 1 else ''}"
        where = {"any": "", "same_node": ", on one node", "distinct_nodes": ", each on its own"}
        plugin = f", with the plug-in model {self.model_plugin!r}" if self.model_plugin else ""
        return f"{nodes} of {each}{where[self.spread]}{plugin}"


ONE_NODE = Placement()
"""What most runs need: one worker, on the CPU or the first GPU it has."""


@dataclass(frozen=True)
class Capacity:
    """What one worker has: it serves a run's node when it has that node's GPUs (or cores)."""

    worker_id: str
    node_name: str
    gpus: int
    cpus: int
    model_plugins: frozenset[str] = frozenset()
    """The plug-in models installed where the worker runs."""

    def serves(self, need: Placement) -> bool:
        if need.model_plugin is not None and need.model_plugin not in self.model_plugins:
            return False
        if need.gpus_per_node:
            return self.gpus >= need.gpus_per_node
        return self.cpus >= need.procs_per_node


def choose_gang(
    me: Capacity, peers: Sequence[Capacity], need: Placement, fewest: int | None = None
) -> list[Capacity] | None:
    """Up to `need.nnodes` workers for a gang, `me` first (it leads: node rank 0, the
    rendezvous host), or None when the idle `peers` cannot give it `fewest` (by default
    `need.nnodes`: all of them). Peers on other nodes come first under "any", so a gang
    spreads its load unless told to stay together."""
    if not me.serves(need):
        return None
    avoid = need.avoid_nodes
    if me.node_name in avoid and clear_gang_exists(peers, need, fewest):
        return None  # an idle worker elsewhere can lead it, away from the nodes to avoid
    able = [p for p in peers if p.worker_id != me.worker_id and p.serves(need)]
    if need.spread == "same_node":
        able = [p for p in able if p.node_name == me.node_name]
    elif need.spread == "distinct_nodes":
        seen = {me.node_name}
        distinct = []
        for peer in able:
            if peer.node_name not in seen:
                seen.add(peer.node_name)
                distinct.append(peer)
        able = distinct
    else:
        able.sort(key=lambda p: p.node_name == me.node_name)  # stable: other nodes first
    able.sort(key=lambda p: p.node_name in avoid)  # stable: the nodes to avoid last of all
    members = [me, *able[: need.nnodes - 1]]
    return members if len(members) >= (fewest or need.nnodes) else None


def clear_gang_exists(peers: Sequence[Capacity], need: Placement, fewest: int | None) -> bool:
    """Whether `peers` alone, off the nodes `need` avoids, could take the run."""
    clear = [p for p in peers if p.node_name not in need.avoid_nodes]
    return any(choose_gang(p, clear, need, fewest) is not None for p in clear)


def could_serve(workers: Sequence[Capacity], need: Placement, fewest: int | None = None) -> bool:
    """Whether these workers, were they all idle, could take the run (on `fewest` nodes or
    more, by default all its `nnodes`)."""
    able = [w for w in workers if w.serves(need)]
    if not able:
        return False
    return any(choose_gang(w, able, need, fewest) is not None for w in able)


def why_waiting(need: Placement, live: Sequence[Capacity]) -> str | None:
    """Why no live worker can take the run, in words; None when some could (it waits only
    for one to be free, or an elastic gang for its grace period to pass)."""
    if could_serve(live, need, need.min_nnodes):
        return None
    prefix = f"waiting: needs {need.describe()}"
    if not live:
        return f"{prefix}; no worker is live"
    if need.model_plugin is not None:
        having = [w for w in live if need.model_plugin in w.model_plugins]
        if not having:
            return (
                f"waiting: needs the plug-in model {need.model_plugin!r}; no live worker has "
                "it installed (GET /models lists the plug-ins of the live workers)"
            )
        live = having
    if need.gpus_per_node:
        largest = max(w.gpus for w in live)
        if largest < need.gpus_per_node:
            plural = "GPU" if need.gpus_per_node == 1 else "GPUs"
            has = "no live worker has a GPU" if largest == 0 else f"largest worker has {largest}"
            return f"waiting: needs {need.gpus_per_node} {plural} per node; {has}"
    elif max(w.cpus for w in live) < need.procs_per_node:
        largest = max(w.cpus for w in live)
        return (
            f"waiting: needs {need.procs_per_node} CPU processes per node; "
            f"largest worker has {largest} cores"
        )
    able = [w for w in live if w.serves(need)]
    nodes = len({w.node_name for w in able})
    return (
        f"{prefix}; {len(able)} live worker{'s' if len(able) != 1 else ''} on "
        f"{nodes} node{'s' if nodes != 1 else ''} can serve it"
    )

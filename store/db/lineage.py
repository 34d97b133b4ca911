"""The lineage of forks: a run's ancestors and its descendants (docs/design/forks.md, "Forks").

A fork's run row records its parent (`Run.parent`: the run that saved the checkpoint it
started from, the checkpoint and its step). The tree is read from those rows: up the parents
one run at a time, down the forks one generation per query (`RunStore.forks_of`, an indexed
lookup).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainctl.store.db.records import Run
from trainctl.store.db.runs import RunStore
from trainctl.store.exceptions import NotFound

MAX_DEPTH = 1000
"""Generations read up or down: a bound, since nothing stops a chain of forks growing."""
MAX_FORKS = 10_000
"""Descendants read in all, for the same reason."""


@dataclass
class LineageNode:
    run: Run
    forks: list[LineageNode] = field(default_factory=list)


@dataclass
class Lineage:
    ancestors: list[Run]
    """From the root down to the run's parent."""
    run: Run
    forks: list[LineageNode]
    """The runs forked from the run's checkpoints, each with its own forks."""


def read_lineage(runs: RunStore, run_id: str) -> Lineage:
    """The tree around `run_id` (a NotFound for an unknown run). A parent run that is gone
    ends the ancestors there."""
    run = runs.get(run_id)
    return Lineage(ancestors=_ancestors(runs, run), run=run, forks=_descendants(runs, run))


def _ancestors(runs: RunStore, run: Run) -> list[Run]:
    found: list[Run] = []
    seen = {run.id}
    current = run
    while current.parent is not None and current.parent.run_id is not None:
        parent_id = current.parent.run_id
        if parent_id in seen or len(found) >= MAX_DEPTH:
            break
        try:
            current = runs.get(parent_id)
        except NotFound:
            break
        seen.add(parent_id)
        found.append(current)
    return found[::-1]


def _descendants(runs: RunStore, run: Run) -> list[LineageNode]:
    root = LineageNode(run)
    nodes, level, count = {run.id: root}, [root], 0
    for _ in range(MAX_DEPTH):
        if not level or count >= MAX_FORKS:
            break
        children = [r for r in runs.forks_of(n.run.id for n in level) if r.id not in nodes]
        level = []
        for child in children[: MAX_FORKS - count]:
            assert child.parent is not None and child.parent.run_id is not None  # forks_of
            node = LineageNode(child)
            nodes[child.parent.run_id].forks.append(node)
            nodes[child.id] = node
            level.append(node)
        count += len(level)
    return root.forks

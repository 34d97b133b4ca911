"""Lineage in the run database (store/db/lineage.py, docs/design/forks.md "Forks"): a fork's
parent is stored with its row and the tree is read back, on SQLite and PostgreSQL."""

from __future__ import annotations

from trainctl.store.db.lineage import read_lineage
from trainctl.store.db.records import RunParent
from trainctl.store.db.runs import RunStore
from trainctl.store.plans import CheckpointRef, ForkPoint


def fork_point(run_id: str | None, experiment: str, step: int) -> ForkPoint:
    ref = CheckpointRef(experiment=experiment, tag=f"step_{step}")
    return ForkPoint(checkpoint=ref, step=step, run_id=run_id)


def test_a_forks_parent_is_stored_and_its_tree_read_back(database_url: str) -> None:
    with RunStore(database_url) as runs:
        runs.create_all()
        root = runs.enqueue("benchmark", "root", {})
        a = runs.enqueue("benchmark", "a", {}, parent=fork_point(root.id, "root", 4))
        b = runs.enqueue("benchmark", "b", {}, parent=fork_point(a.id, "a", 8))
        orphan = runs.enqueue("benchmark", "c", {}, parent=fork_point(None, "gone", 2))

        assert root.parent is None
        assert runs.get(b.id).parent == RunParent(run_id=a.id, experiment="a", tag="step_8", step=8)
        assert [r.id for r in runs.forks_of([root.id, a.id])] == [a.id, b.id]

        tree = read_lineage(runs, root.id)
        assert tree.ancestors == [] and [n.run.id for n in tree.forks] == [a.id]
        assert [n.run.id for n in tree.forks[0].forks] == [b.id]
        assert [r.id for r in read_lineage(runs, b.id).ancestors] == [root.id, a.id]
        lone = read_lineage(runs, orphan.id)
        assert lone.ancestors == [] and lone.forks == [] and lone.run.parent is not None

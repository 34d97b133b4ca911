"""An elastic gang that loses a member for good goes on with fewer (docs/design/placement.md,
"Elastic gangs"), end to end on CPU with real workers on PostgreSQL.

Three worker processes ("nodes", one rank each) take a run with `nnodes: {min: 2, max: 3}`;
once it has a checkpoint one member is killed with SIGKILL and never comes back. The other
two give up their part, the run is requeued, and after its grace period (1 s here) the two
take it: it resumes from its last checkpoint on 2 ranks, each running 3 of the same 6
micro-batches (the global batch is unchanged), and finishes. Its losses after the resume stay
within float tolerance of an uninterrupted 2-node run forked from that same checkpoint, which
reads the same batches from the same data position.

Under `make soak` (about a minute on 2 cores; the claim's rule is tested without training in
tests/store/db/test_placement.py): the shrunk gang grows back when a new worker turns up,
after its next checkpoint, and ends on all three nodes.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.workers import Workers, gang_nodes, wait_finished
from tests.support.plans import enqueue, train_plan
from tests.support.polling import poll
from tests.support.stores import posix_store
from trainctl.store.db.runs import RunStore
from trainctl.store.vocabulary import TERMINAL_STATES

STEPS, CHECKPOINT_EVERY, ACCUM = 6, 2, 6
LOSS_RTOL = 1e-4
REQUEST: dict[str, Any] = {
    "steps": STEPS,
    "model": {"preset": "tiny"},
    "data": {"source": "synthetic"},
    "batch": {"micro_batch_size": 1, "seq_len": 16, "grad_accum_steps": ACCUM},
    "checkpoint_every": CHECKPOINT_EVERY,
    "val_every": STEPS,
    "val_batches": 1,
    "max_keep": 10,  # the reference forks from the checkpoint the resume read
    "device": "cpu",
}


@pytest.fixture
def nodes(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Workers, RunStore]]:
    with gang_nodes(request, tmp_path) as nodes:
        yield nodes


def losses_after(runs: RunStore, run_id: str, after_event: int = 0) -> dict[int, float]:
    """Step -> train loss of the metrics events after `after_event` (one attempt's)."""
    events = runs.events(run_id, limit=100_000, type="metrics")
    return {
        e.data["step"]: e.data["loss"]
        for e in events
        if e.id > after_event and e.data.get("kind") == "train"
    }


def test_a_three_node_gang_that_loses_a_member_for_good_finishes_on_two(
    nodes: tuple[Workers, RunStore], tmp_path: Path
) -> None:
    pool, runs = nodes
    store = posix_store(tmp_path / "checkpoints")
    elastic = {"min": 2, "max": 3, "shrink_after_seconds": 1.0}
    run = enqueue(runs, train_plan(experiment="elastic", nnodes=elastic, **REQUEST), max_attempts=3)
    poll(lambda: store.latest_or_none("elastic"), timeout=120, what="a first checkpoint")
    members = runs.gang_members(run.id)
    assert len(members) == 3 and runs.get(run.id).gang_nnodes == 3
    victim = pool.procs[members[1]]  # killed for good: never restarted
    victim.send_signal(signal.SIGKILL)
    victim.wait()

    done = wait_finished(runs, run)
    assert (done.state, done.attempt, done.gang_nnodes) == ("succeeded", 2, 2), pool.logs()
    (resize,) = [e for e in runs.events(run.id, type="log") if "resize" in e.data]
    step = resize.data["resize"]["step"]
    assert resize.data["resize"] == {"from": 3, "to": 2, "step": step} and 0 < step < STEPS
    logs = [e.data["message"] for e in runs.events(run.id, type="log")]
    assert f"attempt 2: resuming from step_{step} of this run" in logs
    assert sum("joining the gang as node" in m and "of 2 with" in m for m in logs) == 2
    # The same global batch: the plan keeps its 6 micro-batches, 3 on each of the two ranks.
    assert done.spec["batch"]["grad_accum_steps"] == ACCUM
    shrunk = losses_after(runs, run.id, resize.id)
    assert sorted(shrunk) == list(range(step + 1, STEPS + 1))

    # The reference: 2 nodes from that same checkpoint, uninterrupted.
    fork = train_plan(
        tmp_path / "checkpoints", experiment="reference", nnodes=2, **REQUEST,
        fork_from=f"elastic/step_{step}",
    )  # fmt: skip
    reference = wait_finished(runs, enqueue(runs, fork))
    assert reference.state == "succeeded", pool.logs()
    expected = losses_after(runs, reference.id)
    assert shrunk.keys() == expected.keys()
    assert list(shrunk.values()) == pytest.approx(list(expected.values()), rel=LOSS_RTOL)


def resizes(runs: RunStore, run_id: str) -> list[dict[str, int]]:
    return [e.data["resize"] for e in runs.events(run_id, type="log") if "resize" in e.data]


@pytest.mark.soak
def test_a_shrunk_gang_grows_back_at_a_checkpoint_when_a_worker_returns(
    nodes: tuple[Workers, RunStore], tmp_path: Path
) -> None:
    pool, runs = nodes
    elastic = {"min": 2, "max": 3, "shrink_after_seconds": 1.0}
    longer = REQUEST | {"steps": 60, "max_keep": 3}
    run = enqueue(runs, train_plan(experiment="grows", nnodes=elastic, **longer), max_attempts=3)
    store = posix_store(tmp_path / "checkpoints")
    poll(lambda: store.latest_or_none("grows"), timeout=120, what="a first checkpoint")
    victim = pool.procs[runs.gang_members(run.id)[1]]
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    poll(lambda: resizes(runs, run.id), timeout=120, what=f"the shrink; {pool.logs()}")
    pool.start_node("worker-d", "node-d", runs)  # a new node: the gang may have all three

    done = poll(
        lambda: (r := runs.get(run.id)).state in TERMINAL_STATES and r,
        timeout=300,
        what=f"the run to end; {pool.logs()}",
    )
    assert (done.state, done.gang_nnodes) == ("succeeded", 3), pool.logs()
    (shrank, grew) = resizes(runs, run.id)
    assert (shrank["from"], shrank["to"], grew["from"], grew["to"]) == (3, 2, 2, 3)
    assert shrank["step"] < grew["step"] < 60
    reasons = [e.data["reason"] for e in runs.events(run.id, type="state")]
    assert any("growing back" in r for r in reasons), reasons
    assert done.max_attempts == 4  # handing back to grow costs no attempt

"""Faults of a gang member, round after round: the run always ends with the parameters of an
uninterrupted run (docs/design/placement.md, "Placement and gangs").

Each round submits a 2-node run to three worker processes (three "nodes", one PostgreSQL
database) and, once the run has a checkpoint, hits one member with one of the faults below;
the run must then succeed, bit-identical to the uninterrupted reference:

- `kill`: SIGKILL a member; the others lose their peer, give up their part, and the run is
  requeued as a new attempt that resumes from its checkpoint on any two workers.
- `stall`: SIGSTOP a worker past its lease (its ranks, other processes, go on); its place
  expires, the other member reaps the gang from its heartbeat, the ranks agree to stop at the
  next step, and the worker, continued, finds itself fenced out.
- `drain`: SIGTERM a member; the ranks stop together at a step, checkpoint, and the run is
  requeued under a new attempt that does not count against max_attempts.

The rounds run under `make soak` (TRAINCTL_SOAK_ROUNDS=300: six rounds, two of each); `make
test` keeps to tests/e2e/test_multinode.py's one kill.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.reliability.workers import Workers, drain_reports, gang_nodes, wait_finished
from tests.support.plans import enqueue, train_plan
from tests.support.polling import poll
from tests.support.soak import rounds
from tests.support.stores import folder, posix_store
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.db.records import Run
from trainctl.store.db.runs import RunStore

ROUNDS = rounds(20) // 50
STEPS, CHECKPOINT_EVERY = 40, 10
FAULTS = ("kill", "stall", "drain")
pytestmark = pytest.mark.skipif(ROUNDS == 0, reason="soak rounds: make soak")


def gang_run(runs: RunStore, experiment: str) -> Run:
    plan = train_plan(
        experiment=experiment,
        steps=STEPS,
        nnodes=2,
        model={"preset": "tiny"},
        data={"source": "synthetic"},
        batch={"micro_batch_size": 2, "seq_len": 32, "grad_accum_steps": 4},
        checkpoint_every=CHECKPOINT_EVERY,
        val_every=STEPS,
        val_batches=1,
    )
    return enqueue(runs, plan, max_attempts=2)


def final_parameters(store: CheckpointStore, experiment: str) -> dict[str, torch.Tensor]:
    latest = store.latest_or_none(experiment)
    assert latest is not None and latest.step == STEPS
    return load_file(folder(store, experiment, latest.tag) / "model.safetensors")


@pytest.fixture
def nodes(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Workers, RunStore]]:
    with gang_nodes(request, tmp_path) as nodes:
        yield nodes


def test_a_gang_survives_every_member_fault_with_unchanged_parameters(
    nodes: tuple[Workers, RunStore], tmp_path: Path
) -> None:
    pool, runs = nodes
    store = posix_store(tmp_path / "checkpoints")
    reference = wait_finished(runs, gang_run(runs, "reference"))
    assert reference.state == "succeeded", pool.logs()
    want = final_parameters(store, "reference")
    for round_, fault in zip(range(ROUNDS), itertools.cycle(FAULTS), strict=False):
        experiment = f"round-{round_}-{fault}"
        run = fault_round(pool, runs, store, experiment, fault, round_)
        got = final_parameters(store, experiment)
        assert got.keys() == want.keys()
        for name, tensor in want.items():
            assert torch.equal(got[name], tensor), f"{fault}: {name} differs after the fault"
        if fault == "drain":
            assert run.max_attempts == 3  # a graceful stop uses up no attempt
            # The leader's run drains whichever member was signalled: the stop's save within
            # the deadline, and its report (worker.training.ranks.drain_when_agreed).
            (report,) = drain_reports(runs, run)
            assert report["abandoned"] is None and report["committed_seconds"] is not None


def fault_round(
    pool: Workers, runs: RunStore, store: CheckpointStore, experiment: str, fault: str, i: int
) -> Run:
    """Run a gang, hit member `i % 2` with `fault` after its first checkpoint; the run."""
    run = gang_run(runs, experiment)
    first = poll(lambda: store.latest_or_none(experiment), timeout=180, what="a checkpoint")
    assert first.step < STEPS, "the run ended before the fault"
    members = runs.gang_members(run.id)
    victim = members[i % len(members)]
    proc = pool.procs[victim]
    if fault == "kill":
        proc.kill()
        proc.wait()
    elif fault == "stall":
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            poll(lambda: runs.get(run.id).attempt == 2, timeout=60, what="the gang reaped")
        except AssertionError as exc:
            states = [e.data for e in runs.events(run.id, type="state")]
            raise AssertionError(f"{exc}: {runs.get(run.id)}\n{states}\n{pool.logs()}") from None
        os.kill(proc.pid, signal.SIGCONT)
    else:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    if proc.poll() is not None:
        time.sleep(0.1)
        pool.start_node(victim, f"node-{victim}-again", runs)  # the gang needs two
    done = wait_finished(runs, run)
    states = [e.data for e in runs.events(run.id, type="state")]
    assert done.state == "succeeded", (fault, done.error, pool.logs())
    assert done.attempt == 2, (fault, states)
    return done

"""Many workers, one database, one checkpoint storage: four `python -m trainctl.worker` processes,
as on four hosts, share 200 runs. Every run is claimed exactly once and none is lost; a worker
killed with SIGKILL loses its run to another worker through lease expiry and reaping (the
workers reap each other; no service runs here).

The fleet is shared by the tests of a module (starting four workers costs seconds); the
kill test comes last.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.reliability.workers import Workers, enqueue_tiny_train, wait_finished
from tests.support.databases import BACKENDS, fresh_database
from tests.support.plans import benchmark_plan
from tests.support.polling import poll
from trainctl.store.db.records import Run
from trainctl.store.db.runs import RunStore

WORKERS = 4
RUNS = 200
LEASE_SECONDS = 5  # short, so a killed worker's run moves on quickly; long next to a cheap run


@dataclass
class Fleet:
    runs: RunStore
    workers: Workers

    @property
    def ids(self) -> list[str]:
        return sorted(self.workers.procs)


# make test: PostgreSQL, the database of many nodes; make soak: SQLite too.
@pytest.fixture(
    scope="module", params=[pytest.param(BACKENDS[0], marks=pytest.mark.soak), BACKENDS[1]]
)
def fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    data_dir = tmp_path_factory.mktemp(f"fleet-{request.param}")
    with fresh_database(request, request.param, data_dir) as url, RunStore(url) as runs:
        runs.create_all()
        workers = Workers(data_dir, database_url=url)
        # One thread each: four workers share two cores here, as they would share nothing
        # on four hosts.
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        try:
            for n in range(WORKERS):
                workers.start(f"host{n}", env, ["--lease-seconds", str(LEASE_SECONDS)])
            poll(
                lambda: len(runs.workers.list_workers()) == WORKERS, what="four workers to register"
            )
            yield Fleet(runs, workers)
        finally:
            workers.close()


def enqueue_cheap_benchmark(runs: RunStore, n: int) -> Run:
    """A real benchmark run, as small as it gets: one step of one 16-token sequence."""
    plan = benchmark_plan(
        steps=1,
        warmup_steps=0,
        model={"preset": "tiny"},
        batch={"micro_batch_size": 1, "seq_len": 16, "grad_accum_steps": 1},
        seed=n,
    )
    return runs.enqueue("benchmark", f"many-{n}", plan.model_dump(mode="json"))


def claims(runs: RunStore, run: Run) -> list[str]:
    """Who claimed the run, once per claim, from its event log."""
    return [
        e.data["worker_id"]
        for e in runs.events(run.id, type="state")
        if (e.data["previous"], e.data["state"]) == ("queued", "running")
    ]


def test_four_workers_run_200_runs_each_claimed_exactly_once_and_share_them(
    fleet: Fleet,
) -> None:
    enqueued = [enqueue_cheap_benchmark(fleet.runs, n) for n in range(RUNS)]

    finished = [wait_finished(fleet.runs, run) for run in enqueued]

    assert Counter(run.state for run in finished) == {"succeeded": RUNS}
    assert all(run.attempt == 1 for run in finished)
    claimed_by = [claims(fleet.runs, run) for run in enqueued]
    assert all(len(who) == 1 for who in claimed_by), "a run was claimed more than once"
    assert [who[0] for who in claimed_by] == [run.worker_id for run in finished]
    per_worker = Counter(run.worker_id for run in finished)
    print(f"runs per worker: {dict(sorted(per_worker.items()))}")
    assert set(per_worker) == set(fleet.ids)
    assert min(per_worker.values()) >= RUNS // WORKERS // 4, per_worker


# The run is killed just past its first checkpoint (step 5) and resumes from an early one on
# another worker; 200 steps leave it far from done at the kill, and the steps after the
# resume are what 600 repeated.
STEPS_TO_MOVE = 200


def test_a_killed_workers_run_moves_to_another_worker_and_resumes(fleet: Fleet) -> None:
    # Long enough that the run is still going when the poll sees it: progress is written at
    # most twice a second, and 40 tiny steps can finish in less than that.
    run = enqueue_tiny_train(fleet.runs, "moved", STEPS_TO_MOVE, checkpoint_every=5)

    def past_first_checkpoint() -> Run | None:
        r = fleet.runs.get(run.id)
        return r if r.state == "running" and (r.progress["step"] or 0) > 5 else None

    first = poll(past_first_checkpoint, what="the train run to pass its first checkpoint")
    victim = first.worker_id
    assert victim is not None

    os.kill(fleet.workers.procs[victim].pid, signal.SIGKILL)
    done = wait_finished(fleet.runs, run)

    assert (done.state, done.attempt) == ("succeeded", 2), done.error
    assert done.worker_id != victim and done.worker_id in fleet.ids
    assert claims(fleet.runs, run) == [victim, done.worker_id]
    reasons = [e.data["reason"] for e in fleet.runs.events(run.id, type="state")]
    assert any(f"lease expired (worker {victim}" in reason for reason in reasons), reasons
    logs = [e.data["message"] for e in fleet.runs.events(run.id, type="log")]
    assert any("resuming from step_" in line for line in logs), logs
    assert done.progress["step"] == STEPS_TO_MOVE

"""Hangs and stragglers in a real two-rank gloo run (worker.training.hangs, worker.launch):
a rank slowed on purpose is reported as a straggler within its window; stopped with SIGSTOP,
it is declared hung within its learned timeout, every rank's stacks reach the run's events,
and the run goes on from its checkpoint in a new attempt. The faults come from
TRAINCTL_TEST_RANK_FAULT (`RankFault`), which only these tests set."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.plans import enqueue
from tests.support.ranks import tiny_plan
from trainctl.store.db.runs import RunStore
from trainctl.store.training.hangs import HangOptions, StragglerOptions
from trainctl.store.worker_settings import WorkerSettings
from trainctl.worker.runner import Worker
from trainctl.worker.training.hangs import (
    FAULT_VARIABLE,
    ProgressBoard,
    RankFault,
    RankPulse,
    StragglerWatch,
    dump_complete,
    overdue,
)

# Small enough for a test, large enough that two shared cores under a CI run never miss a
# deadline by slowness alone: a tiny step takes about 0.05 s here, 0.25 s with the slow rank.
HANG = {"floor_seconds": 5.0, "multiplier": 10.0, "allowance_seconds": 20.0, "warmup_steps": 2}
GLOO_TIMEOUT_SECONDS = 30 * 60  # torch's default for gloo groups: what a hang would wait for


@pytest.mark.slow  # one run for both watches: each torchrun launch costs seconds here
def test_a_slow_rank_is_a_straggler_and_a_stopped_rank_is_hung_and_the_run_resumes(
    runs: RunStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rank 1 is slow at every step, and stops after step 3, whose checkpoint it saved.
    monkeypatch.setenv(FAULT_VARIABLE, "1:slow:0.2,1:stop:3")
    url = runs.engine.url.render_as_string()
    settings = WorkerSettings(
        database_url=url, data_dir=tmp_path, worker_id="w1", heartbeat_seconds=0.2
    )
    worker = Worker(settings, runs)
    worker.register()
    plan = tiny_plan(nproc_per_node=2, hang=HANG, stragglers={"window": 3, "avoid": True})
    run = enqueue(runs, plan)
    started = time.monotonic()

    first = runs.claim("w1", lease_seconds=60)
    assert first is not None
    worker.run_one(first)

    requeued = runs.get(run.id)
    assert requeued.state == "queued", requeued.error
    logs = [e.data for e in runs.events(run.id, type="log")]
    slow = next(d["straggler"] for d in logs if "straggler" in d)
    assert slow["step"] <= 3, slow  # as soon as the window holds three steps
    assert list(slow["slowdowns"]) == ["1"] and slow["slowdowns"]["1"] > 0.2, slow
    # Its node is named, and recorded on the run for the next placement, which takes it
    # anyway: this worker is the only one (avoiding a node never leaves a run waiting).
    node = settings.node
    assert slow["nodes"] == {"1": node} and slow["avoid_nodes"] == [node], slow
    assert requeued.placement.avoid_nodes == (node,)
    hang = next(d["hang"] for d in logs if "hang" in d)
    assert hang["step"] == 3 and 1 in hang["ranks"], hang
    assert hang["late_seconds"] < 2.0, hang  # declared one poll after the deadline
    stacks = [d["message"] for d in logs if "Python stacks" in d["message"]]
    assert len(stacks) == 2, logs  # both ranks': the stopped one, and the one waiting on it
    assert all("File " in s and "trainctl" in s for s in stacks), stacks
    assert any("maybe_stop" in s for s in stacks), stacks  # where rank 1 stopped

    second = runs.claim("w1", lease_seconds=60)
    assert second is not None and second.attempt == 2
    worker.run_one(second)

    done = runs.get(run.id)
    assert done.state == "succeeded", done.error
    assert done.result is not None and done.result["step"] == 6
    messages = [e.data["message"] for e in runs.events(run.id, type="log")]
    assert any("resuming from step_3" in m for m in messages)
    assert time.monotonic() - started < GLOO_TIMEOUT_SECONDS / 10


def test_a_rank_past_its_deadline_on_the_board_is_overdue(tmp_path: Path) -> None:
    board = ProgressBoard.create(tmp_path, 2)
    options = HangOptions(floor_seconds=1, multiplier=2, allowance_seconds=10, warmup_steps=1)
    pulses = [RankPulse(board, local, rank, options) for local, rank in ((0, 4), (1, 5))]
    assert overdue(board) is None  # nobody has written: not watched
    for pulse in pulses:
        pulse.stepped(0.1)  # learned: max(1, 2 x 0.1)
        pulse.start_step(7)
    now = time.monotonic()
    assert overdue(board, now) is None
    pulses[0].section(8)  # a save: the allowance too
    hang = overdue(board, now + 2)
    assert hang is not None and [r for r, *_ in hang.overdue] == [5]
    assert hang.overdue[0][:3] == (5, 7, "a training step")
    assert set(hang.pids) == {4, 5}
    pulses[1].done()
    assert overdue(board, now + 2) is None  # done: no longer watched


def test_a_dump_is_complete_only_once_the_main_threads_outermost_frame_is_written() -> None:
    # As a rank writes it: started by the `-c` boot, a second thread alive, all threads.
    boot = (
        "import faulthandler, threading, time; "
        "threading.Thread(target=time.sleep, args=(2,), daemon=True).start(); "
        "faulthandler.dump_traceback(all_threads=True)"
    )
    dump = subprocess.run([sys.executable, "-I", "-c", boot], capture_output=True, text=True)
    assert dump.stderr.count("hread 0x") == 2, dump.stderr  # "Current thread", "Thread"
    assert dump_complete(dump.stderr)
    lines = dump.stderr.splitlines(keepends=True)
    for cut in range(len(lines) - 1):  # every dump cut short, as a paused rank leaves it
        assert not dump_complete("".join(lines[: cut + 1])), cut


def test_the_straggler_watch_reports_when_the_stragglers_change() -> None:
    reports: list[dict[int, float]] = []
    watch = StragglerWatch(StragglerOptions(window=2, min_excess_seconds=0), 3, reports.append)
    watch.observe([0.1, 0.1, 0.3])
    assert reports == []  # the window is not full yet
    watch.observe([0.1, 0.1, 0.3])
    watch.observe([0.1, 0.1, 0.3])  # the same straggler: no new report
    watch.observe([0.1, 0.1, 0.1])
    watch.observe([0.1, 0.1, 0.1])
    assert reports == [{2: pytest.approx(2.0)}, {}]


def test_test_faults_are_read_for_their_rank_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULT_VARIABLE, "1:slow:0.25,1:stop:3,0:slow:1")
    assert RankFault.from_env(1) == RankFault(slow_seconds=0.25, stop_after=3)
    assert RankFault.from_env(0) == RankFault(slow_seconds=1.0)
    assert RankFault.from_env(2) is None
    monkeypatch.delenv(FAULT_VARIABLE)
    assert RankFault.from_env(1) is None

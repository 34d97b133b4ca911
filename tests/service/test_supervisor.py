"""How the supervisor shares a node's GPUs among its local workers, and restarts them.

The restart tests run real child processes (small Python scripts standing in for the worker)
under the supervisor's own watch thread, with a short tick and short backoffs. They assert
only lower bounds on time: these machines are shared and slow at random.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

import trainctl.service.supervisor as supervisor_module
from tests.support.polling import holds_throughout, poll
from tests.support.supervisor import spawned_envs
from trainctl.service.metrics import ServiceMetrics
from trainctl.service.settings import Settings
from trainctl.service.supervisor import Supervisor, gpu_groups, restart_delay
from trainctl.store.db.runs import RunStore
from trainctl.store.processes import DRAINED_EXIT_CODE
from trainctl.store.worker_settings import WorkerSettings

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("workers", "gpus", "per_worker", "expected"),
    [
        (8, 8, 1, [(i,) for i in range(8)]),
        (2, 8, 4, [(0, 1, 2, 3), (4, 5, 6, 7)]),
        (1, 8, 8, [tuple(range(8))]),
        (3, 2, 1, [(0,), (1,), ()]),  # more workers than GPUs: the rest run on the CPU
        (1, 0, 1, [()]),  # a CPU-only node
        (2, 3, 2, [(0, 1), ()]),  # a group is never cut short
    ],
)
def test_gpu_groups(
    workers: int, gpus: int, per_worker: int, expected: list[tuple[int, ...]]
) -> None:
    assert gpu_groups(workers, gpus, per_worker) == expected


def test_each_worker_sees_its_group_of_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    envs = spawned_envs(tmp_path, monkeypatch, gpus=8, gpus_per_worker=4)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0,1,2,3", "4,5,6,7"]


def test_a_worker_beyond_the_gpus_sees_none_rather_than_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    envs = spawned_envs(tmp_path, monkeypatch, gpus=1, workers=2)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", ""]


def test_on_a_cpu_node_the_environment_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    envs = spawned_envs(tmp_path, monkeypatch, gpus=0)
    assert len(envs) == 1 and "CUDA_VISIBLE_DEVICES" not in envs[0]


# --- restarts and backoff -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("quick_crashes", "expected"),
    [(0, 0.0), (1, 2.0), (2, 4.0), (3, 8.0), (4, 16.0), (5, 30.0), (6, 30.0), (500, 30.0)],
)
def test_restart_delay_doubles_from_the_base_up_to_the_cap(
    quick_crashes: int, expected: float
) -> None:
    assert restart_delay(quick_crashes, base=2.0, cap=30.0) == expected


# Each stand-in worker appends its start time (the machine-wide monotonic clock) to the file
# it is given, so a test reads every start even when a poll would have missed one.
CRASHER = """
import sys, time
with open(sys.argv[1], "a") as f:
    f.write(f"{time.monotonic()}\\n")
print("boom: this worker cannot start", file=sys.stderr)
sys.exit(3)
"""

# Exits with its start number (1, 2, ...) at once, except the third, which first lives
# `sys.argv[2]` seconds: a worker that ran fine for a while and then crashed.
LIVES_ONCE = """
import sys, time
with open(sys.argv[1], "a+") as f:
    f.write(f"{time.monotonic()}\\n")
    f.seek(0)
    n = len(f.read().splitlines())
if n == 3:
    time.sleep(float(sys.argv[2]))
sys.exit(n)
"""

# Registers and claims the queued run, as a worker would, then crashes holding it.
CLAIMS_THEN_CRASHES = """
import os, sys
sys.path.insert(0, sys.argv[1])
from trainctl.store.db.runs import RunStore
from trainctl.store.processes import DRAINED_EXIT_CODE
store, worker_id = RunStore(os.environ["TRAINCTL_DATABASE_URL"]), os.environ["TRAINCTL_WORKER_ID"]
store.workers.register(worker_id, host="test", pid=os.getpid(), device="cpu", info={})
run = store.claim(worker_id, lease_seconds=3600)
print("claimed", run and run.id, flush=True)
sys.exit(3)
"""


@pytest.fixture
def crash_settings(tmp_path: Path) -> Settings:
    """One local worker, a 50 ms tick, and backoffs of 0.2, 0.4, then 0.5 s."""
    return Settings(
        data_dir=tmp_path,
        database_url=f"sqlite:///{tmp_path / 'trainctl.db'}",
        workers=1,
        reap_seconds=0.1,
        worker_healthy_seconds=10.0,
        worker_restart_delay_seconds=0.2,
        worker_restart_delay_max_seconds=0.5,
        worker_max_quick_crashes=100,
    )


@pytest.fixture
def store(crash_settings: Settings) -> Iterator[RunStore]:
    runs = RunStore(crash_settings.db_url)
    runs.create_all()
    yield runs
    runs.close()


@contextmanager
def supervising(
    settings: Settings, store: RunStore, script: str, *args: object, **kw: Any
) -> Iterator[Supervisor]:
    """A started supervisor whose worker is `python -c script args...`."""
    command = [sys.executable, "-c", script, *map(str, args)]
    supervisor = Supervisor(settings, store, command=command, **kw)
    supervisor.start()
    try:
        yield supervisor
    finally:
        supervisor.stop(timeout=10)


def start_times(path: Path) -> list[float]:
    return [float(line) for line in path.read_text().splitlines()] if path.exists() else []


def given_up(supervisor: Supervisor) -> dict[str, Any] | None:
    """The status of the one slot once it is given up."""
    status = supervisor.status()[0]
    return status if status["given_up"] else None


@pytest.mark.slow
def test_a_crashing_worker_is_restarted_after_a_growing_delay(
    crash_settings: Settings, store: RunStore, tmp_path: Path
) -> None:
    starts = tmp_path / "starts"
    with supervising(crash_settings, store, CRASHER, starts) as supervisor:
        poll(lambda: len(start_times(starts)) >= 5, timeout=60, what="five worker starts")
        status: dict[str, Any] = supervisor.status()[0]

    times = start_times(starts)
    gaps = [later - earlier for earlier, later in pairwise(times)]
    # After the k-th quick crash the restart waits 0.2 * 2**(k-1) s, capped at 0.5 s; a start
    # comes after its predecessor exited, so each gap is at least that wait.
    for gap, delay in zip(gaps[:4], [0.2, 0.4, 0.5, 0.5], strict=True):
        assert gap >= delay, gaps
    assert status["quick_crashes"] >= 4
    assert status["given_up"] is False and status["given_up_reason"] is None


@pytest.mark.slow
def test_a_worker_that_keeps_crashing_is_given_up_and_reported(
    crash_settings: Settings, store: RunStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    crash_settings.worker_max_quick_crashes = 3
    starts, metrics = tmp_path / "starts", ServiceMetrics()
    with supervising(crash_settings, store, CRASHER, starts, metrics=metrics) as supervisor:
        status = poll(lambda: given_up(supervisor), timeout=60, what="the slot to be given up")
        slot = supervisor.slots[0]
        # Had it not given up, the next start would come within the 0.5 s cap.
        holds_throughout(
            lambda: len(start_times(starts)) == 3 and slot.process is None,
            seconds=2.0,
            what="a slot given up is not restarted",
        )

    assert status["restarts"] == 2 and status["alive"] is False
    assert status["given_up_reason"] == (
        "3 crashes in a row, each within 10 s of its start (exit codes 3, 3, 3)"
    )
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    message = errors[0].getMessage()
    assert errors[0].name == "trainctl.supervisor"
    assert message.startswith("gave up on worker slot 0: 3 crashes in a row")
    assert "(exit codes 3, 3, 3)" in message
    assert slot.worker_id in message and str(slot.log_path) in message
    assert message.endswith("    boom: this worker cannot start")
    sample = metrics.registry.get_sample_value
    assert sample("trainctl_worker_restarts_total", {"slot": "0"}) == 2
    assert sample("trainctl_worker_slots_given_up") == 1


@pytest.mark.slow
def test_a_worker_that_lived_past_the_threshold_resets_the_count(
    crash_settings: Settings, store: RunStore, tmp_path: Path
) -> None:
    crash_settings.worker_max_quick_crashes = 3
    crash_settings.worker_healthy_seconds = 3.0
    starts = tmp_path / "starts"
    # Starts 1 and 2 crash at once, 3 lives 4 s (past the 3 s threshold) then crashes, 4, 5
    # and 6 crash at once. Counted from the start, the third quick crash would be start 4's.
    with supervising(crash_settings, store, LIVES_ONCE, starts, 4.0) as supervisor:
        status = poll(lambda: given_up(supervisor), timeout=60, what="the slot to be given up")

    assert len(start_times(starts)) == 6
    assert status["given_up_reason"].endswith("(exit codes 4, 5, 6)")


@pytest.mark.slow
def test_the_run_a_crashed_worker_held_is_handed_back_even_when_its_slot_is_given_up(
    crash_settings: Settings, store: RunStore
) -> None:
    crash_settings.worker_max_quick_crashes = 1
    run = store.enqueue("benchmark", "exp", {"steps": 1}, max_attempts=1)
    with supervising(crash_settings, store, CLAIMS_THEN_CRASHES, REPO) as supervisor:
        poll(lambda: given_up(supervisor), timeout=60, what="the slot to be given up")
        worker_id = supervisor.slots[0].worker_id

    failed = store.get(run.id)
    assert failed.state == "failed" and failed.error is not None
    assert failed.error.startswith(f"worker process {worker_id} exited with code 3")
    assert store.workers.list_workers() == []


# A worker that claims a run and is then ended the way the kernel's OOM killer ends one: the
# cgroup's oom_kill count goes up, then SIGKILL (here the events file is a test's own).
CLAIMS_THEN_IS_OOM_KILLED = CLAIMS_THEN_CRASHES.replace(
    "sys.exit(3)",
    "import pathlib, signal\n"
    "events = pathlib.Path(sys.argv[2])\n"
    "count = int(events.read_text().split()[1]) + int(sys.argv[3])\n"
    "events.write_text(f'oom_kill {count}\\n')\n"
    "os.kill(os.getpid(), signal.SIGKILL)",
)


@pytest.mark.slow
@pytest.mark.parametrize("oom", [True, False], ids=["oom-killer", "operator-kill-9"])
def test_a_worker_killed_for_memory_fails_its_run_without_retrying_it(
    crash_settings: Settings,
    store: RunStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    oom: bool,
) -> None:
    events = tmp_path / "memory.events"
    events.write_text("oom_kill 0\n")
    monkeypatch.setattr(supervisor_module, "OOM_EVENTS_FILES", (str(events),))
    run = store.enqueue("benchmark", "exp", {"steps": 1}, max_attempts=3)
    script, args = CLAIMS_THEN_IS_OOM_KILLED, (REPO, events, int(oom))
    with supervising(crash_settings, store, script, *args):
        recovered = poll(
            lambda: r if (r := store.get(run.id)).state == "failed" or r.attempt == 2 else None,
            timeout=60,
            what="the killed worker's run to be failed or requeued",
        )

    if oom:
        assert recovered.state == "failed" and recovered.attempt == 1
        assert (recovered.error or "").startswith("out of memory: the kernel's OOM killer")
        assert (recovered.error or "").endswith("not retried")
    else:  # an operator's kill -9: the run goes back to the queue, as any lost worker's
        assert recovered.state == "queued" and recovered.attempt == 2


# Exits as a drained worker does (worker/runner.py), after writing its start time.
DRAINED = CRASHER.replace(
    'print("boom: this worker cannot start", file=sys.stderr)\nsys.exit(3)',
    f"sys.exit({DRAINED_EXIT_CODE})",
)


def test_a_worker_drained_on_purpose_is_not_restarted(
    crash_settings: Settings, store: RunStore, tmp_path: Path
) -> None:
    starts = tmp_path / "starts"
    with supervising(crash_settings, store, DRAINED, starts) as supervisor:
        status = poll(
            lambda: (s := supervisor.status()[0])["drained"] and s, timeout=60, what="drained"
        )
        # A crash would be restarted within the 0.2 s backoff.
        holds_throughout(
            lambda: len(start_times(starts)) == 1 and supervisor.slots[0].process is None,
            seconds=1.0,
            what="a drained worker is not restarted",
        )
    assert status["restarts"] == 0 and status["given_up"] is False


def test_local_workers_open_the_stores_the_service_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bucket, the cache dir and its budget, and the memory a worker may use, reach a
    local worker whatever the service's settings came from (here: arguments, not the
    environment it inherits)."""
    for name in ("STORAGE_URL", "CACHE_DIR", "CACHE_BYTES", "WORKER_MEMORY_BYTES"):
        monkeypatch.delenv(f"TRAINCTL_{name}", raising=False)
    stores: dict[str, Any] = {
        "storage_url": "s3://b/team",
        "cache_dir": tmp_path / "c",
        "cache_bytes": 12345,
    }
    [env] = spawned_envs(tmp_path, monkeypatch, gpus=0, **stores)
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    config = WorkerSettings.from_args([])  # the worker's own reading of them
    assert config.layout == Settings(data_dir=tmp_path, **stores).layout

    [env] = spawned_envs(tmp_path, monkeypatch, gpus=0, worker_memory_bytes=2**30)
    monkeypatch.setenv("TRAINCTL_WORKER_MEMORY_BYTES", env["TRAINCTL_WORKER_MEMORY_BYTES"])
    assert WorkerSettings.from_args([]).worker_memory_bytes == 2**30

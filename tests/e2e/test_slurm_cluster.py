"""The Slurm cluster the tests start (tests/support/slurm.py) behaves as a Slurm backend needs:
real daemons, real jobs, the facts its module docstring records.

- A 2-node job runs one task per node, each seeing its node id and the job's node list, which
  `scontrol` expands into names and resolves to the nodes' addresses.
- `squeue --json` lists a job that waits for nodes as PENDING with a reason, and the name and
  comment it was submitted with.
- A node whose slurmd is killed goes DOWN and its job ends NODE_FAIL; restarted, it returns.
- `scancel` sends SIGTERM to every process of the step and SIGKILL after KillWait; a process
  with SIGTERM blocked (the mask kept across `subprocess.Popen`'s exec) lives until then.
- `--signal=TERM@N` reaches the step's task before the time limit.

One cluster serves the module. The three that wait on Slurm's own clocks (SlurmdTimeout,
KillWait, the 30 s time-limit check) run under `make soak`: tests/e2e/test_slurm_backend.py
meets each of those clocks under a real run in `make test`.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.polling import poll
from tests.support.slurm import SlurmCluster

pytestmark = pytest.mark.slow

BLOCKER = """
import os, signal, subprocess, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
child = subprocess.Popen(["sleep", "300"])
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(child.pid))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
child.wait()
"""


class Jobs:
    """Submits jobs from the test's folder (their default output goes there) and cancels,
    after the test, those still queued or running: one failing test must not leave the
    module's cluster full."""

    def __init__(self, cluster: SlurmCluster, folder: Path) -> None:
        self.cluster, self.folder = cluster, folder
        self.ids: list[str] = []

    def submit(self, *args: str) -> str:
        sbatch = ["sbatch", "--parsable", "--no-requeue", f"--chdir={self.folder}"]
        job_id = self.cluster.run(*sbatch, *args).strip()
        self.ids.append(job_id)
        return job_id

    def wait_state(self, job_id: str, *states: str, timeout: float = 30) -> dict[str, str]:
        def reached() -> dict[str, str] | None:
            job = self.cluster.job(job_id)
            return job if job["JobState"] in states else None

        return poll(reached, timeout=timeout, what=f"job {job_id} to be {' or '.join(states)}")


@pytest.fixture
def jobs(slurm_cluster: SlurmCluster, tmp_path: Path) -> Iterator[Jobs]:
    submitted = Jobs(slurm_cluster, tmp_path)
    yield submitted
    if submitted.ids:
        ids = ",".join(submitted.ids)
        active = slurm_cluster.run("squeue", "-h", "-o", "%i", "-t", "PD,R", "-j", ids).split()
        if active:
            slurm_cluster.run("scancel", *active)


def alive(pid: int) -> bool:
    """Whether `pid` runs: a zombie waiting for its reaper has ended."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def blocked_signals(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return int(next(line.split()[1] for line in status if line.startswith("SigBlk")), 16)


def test_a_two_node_job_runs_a_task_per_node_whose_nodes_resolve_to_addresses(
    slurm_cluster: SlurmCluster, jobs: Jobs, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    # Single quotes: each task expands the variables, not the batch shell once for both.
    task = "srun sh -c 'echo $SLURM_NODEID $SLURM_JOB_NODELIST $SLURMD_NODENAME'"
    job_id = jobs.submit("--nodes=2", "--ntasks-per-node=1", f"--output={out}", "--wrap", task)
    jobs.wait_state(job_id, "COMPLETED")

    rows = sorted(line.split() for line in out.read_text().splitlines())
    assert [row[0] for row in rows] == ["0", "1"]
    node_list = rows[0][1]
    names = slurm_cluster.run("scontrol", "show", "hostnames", node_list).split()
    assert len(names) == 2
    assert sorted(row[2] for row in rows) == names
    assert slurm_cluster.show("node", "n1")["NodeAddr"] == "127.0.0.2"


def test_squeue_json_lists_a_job_waiting_for_nodes_with_its_reason(
    slurm_cluster: SlurmCluster, jobs: Jobs
) -> None:
    running = jobs.submit("--nodes=3", "--ntasks-per-node=2", "--wrap", "sleep 300")
    jobs.wait_state(running, "RUNNING")
    waiting = jobs.submit("--job-name=waits", "--comment=run=abc", "--wrap", "sleep 300")

    def listed() -> dict[str, dict[str, object]] | None:
        listing = json.loads(slurm_cluster.run("squeue", "--json"))["jobs"]
        by_id = {str(job["job_id"]): job for job in listing}
        reason = by_id.get(waiting, {}).get("state_reason")
        return by_id if reason in {"Resources", "Priority"} else None

    by_id = poll(listed, timeout=30, what=f"job {waiting} pending with a reason")
    state = by_id[waiting]["job_state"]
    # a string in 22.05, a list of strings from 23.11 on
    assert (state if isinstance(state, list) else [state]) == ["PENDING"]
    assert (by_id[waiting]["name"], by_id[waiting]["comment"]) == ("waits", "run=abc")
    assert by_id[waiting]["nodes"] == ""
    assert by_id[running]["nodes"] == "n[1-3]"


@pytest.mark.soak  # ~30 s; tests/e2e/test_slurm_backend.py kills a slurmd under a run in make test
def test_a_node_whose_slurmd_is_killed_goes_down_fails_its_job_and_returns(
    slurm_cluster: SlurmCluster, jobs: Jobs, record_property: Callable[[str, object], None]
) -> None:
    job_id = jobs.submit("--nodelist=n3", "--wrap", "sleep 300")
    jobs.wait_state(job_id, "RUNNING")
    started = time.monotonic()
    slurm_cluster.kill_slurmd("n3")
    try:
        # SlurmdTimeout (10 s) and MessageTimeout (10 s) together: about 30 s measured
        job = jobs.wait_state(job_id, "NODE_FAIL", timeout=60)
        record_property("seconds_to_node_fail", round(time.monotonic() - started, 1))
        assert "DOWN" in slurm_cluster.node_state("n3")
        assert job["NodeList"] == "n3"
    finally:
        slurm_cluster.start_slurmd("n3")
    poll(lambda: slurm_cluster.node_state("n3") == "IDLE", timeout=30, what="n3 back to IDLE")


@pytest.mark.soak  # KillWait, 30 s; the backend's scancel test drains a run through the same TERM
def test_scancel_terms_the_step_and_kills_what_blocks_sigterm_after_kill_wait(
    slurm_cluster: SlurmCluster, jobs: Jobs, tmp_path: Path
) -> None:
    """The batch shell traps SIGTERM and carries on; one child has SIGTERM blocked (set in
    Python, inherited through Popen's exec), another, the control, does not."""
    (tmp_path / "blocker.py").write_text(BLOCKER)
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"trap 'touch {tmp_path}/terminated' TERM\n"
        f"echo $$ > {tmp_path}/shell.pid\n"
        f"sleep 300 & echo $! > {tmp_path}/control.pid\n"
        f"{sys.executable} {tmp_path}/blocker.py {tmp_path}/blocked.pid &\n"
        "while :; do sleep 0.2; done\n"
    )
    job_id = jobs.submit(f"--output={tmp_path}/out", str(script))
    names = ("shell", "control", "blocked")
    paths = [tmp_path / f"{name}.pid" for name in names]
    poll(lambda: all(p.exists() and p.read_text().strip() for p in paths), 30, "the pid files")
    shell, control, blocked = (int(p.read_text()) for p in paths)
    assert blocked_signals(blocked) & (1 << (signal.SIGTERM - 1))

    started = time.monotonic()
    slurm_cluster.run("scancel", job_id)
    poll(lambda: (tmp_path / "terminated").exists(), 10, "the shell's SIGTERM trap")
    poll(lambda: not alive(control), 10, "the control child to die of SIGTERM")
    assert alive(shell) and alive(blocked)

    kill_wait = slurm_cluster.kill_wait
    poll(lambda: not alive(blocked), kill_wait + 20, "SIGKILL after KillWait")
    assert time.monotonic() - started >= kill_wait - 1
    assert not alive(shell)


@pytest.mark.soak  # ~25 s; the backend's time-limit test chains jobs on the same --signal
def test_signal_at_n_reaches_the_task_before_the_time_limit(
    jobs: Jobs, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    """slurmctld checks time limits every 30 s and signals at the first check within about
    N + 30 s of the limit: with N = 50 and a 60 s limit, in the first 30 s."""
    task = (
        f"date +%s.%N > {tmp_path}/started; "
        f'trap "date +%s.%N > {tmp_path}/signalled; exit 0" TERM; '
        "while :; do sleep 0.2; done"
    )
    jobs.submit("--time=1", "--signal=TERM@50", f"--output={tmp_path}/out",
                "--wrap", f"srun bash -c '{task}'")  # fmt: skip
    signalled = tmp_path / "signalled"
    poll(lambda: signalled.exists() and signalled.read_text(), 50, "SIGTERM before the limit")
    delay = float(signalled.read_text()) - float((tmp_path / "started").read_text())
    record_property("seconds_to_signal", round(delay, 1))
    assert 0 <= delay <= 40

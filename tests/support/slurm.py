"""A real Slurm cluster on this one machine for the tests: Debian's slurmctld and one slurmd
per node, all on loopback, with a config, state and logs of its own in a temp folder.

Nothing goes to /etc/slurm: every daemon and every command finds the cluster through
`SLURM_CONF` (`SlurmCluster.env`). The nodes are slurmd processes on this host named n1, n2,
n3, told apart by their addresses (127.0.0.2, .3, .4) and ports; `SlurmdParameters=
config_overrides` lets each declare CPUs the machine does not have. cgroup plugins are not
available in a sandbox, so processes are tracked by their parentage (proctrack/linuxproc).

Each cluster runs a munged of its own on a socket of its own (`AuthInfo=socket=`), so that
stopping one cluster never takes authentication away from another (two pytest-xdist workers
may each hold one) or from a munged the machine runs. Ports are picked free at start and the
first job id is random, so two clusters coexist and their job ids differ.

What the backend can count on, measured here with Slurm 22.05.8 (tests/e2e/test_slurm_cluster.py
checks each):
- A killed slurmd's node is DOWN+NOT_RESPONDING and its job NODE_FAIL about 30 s later with
  SlurmdTimeout=10: NOT_RESPONDING after ~17 s, DOWN after ~30 s. MessageTimeout (10 s by
  default) counts as much as SlurmdTimeout: SlurmdTimeout=5 alone gave 25 s, with
  MessageTimeout=4 13 s. A restarted slurmd brings its node back to IDLE within a second
  (ReturnToService=2) and its orphaned job processes are killed.
- A plain `scancel` sends SIGTERM to every process of the step, at once, and SIGKILL KillWait
  seconds later to what is left. A process with SIGTERM blocked survives until that SIGKILL,
  and `subprocess.Popen` keeps a blocked mask across exec (the child's SigBlk has SIGTERM).
- `--signal=TERM@N` goes to the job's steps (srun), not to the batch shell (that needs `B:`).
  slurmctld checks time limits every 30 s and sends the signal at the first check where the
  time left is within about N + 30 s: with `--time=1` and N = 50 it came 1 s after the start.
  The time limit itself is enforced on the same 30 s checks (a `--time=1` job ended at 87 s).
- In `--wrap`, a variable meant for each task must be single-quoted inside srun's command
  (`srun sh -c 'echo $SLURM_NODEID'`): double quotes expand it once, in the batch shell.

`squeue --json` in 22.05 (openapi v0.0.38) prints {"meta": ..., "errors": [], "jobs": [...]};
one job of "jobs", trimmed to the fields a backend reads (a pending one):
    {"job_id": 46300, "name": "second", "job_state": "PENDING", "state_reason": "Resources",
     "state_description": "", "nodes": "", "node_count": 1, "batch_host": "",
     "comment": "hello", "partition": "debug", "user_name": "root", "requeue": true,
     "restart_cnt": 0, "exit_code": 0, "submit_time": 1796624213, "start_time": 0,
     "end_time": 0, "time_limit": null, "current_working_directory": "/tmp/sc1", "flags": []}
A running job has "nodes": "n[1-3]", "batch_host": "n1", "state_reason": "None" and real
start and end times (Unix seconds; end_time is start + time limit while it runs). Slurm 23.11
and later print `job_state` as a list of strings and many numbers as {"set", "infinite",
"number"} objects: parse tolerantly. `sacct` does not work here (no slurmdbd); `squeue`
forgets a finished job after MinJobAge (300 s).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tests.support.ports import free_port

MUNGED = "/usr/sbin/munged"
# Where munged's socket may live: munged wants every folder above its socket executable by
# all, which a pytest tmp_path (under a 0700 folder) is not.
MUNGE_RUN = Path("/run/munge")
START_TIMEOUT = 30.0
INSTALL_HINT = "run `make slurm` (apt-get install slurm-wlm munge)"


class SlurmUnavailable(RuntimeError):
    """Slurm cannot be started here; the message says what to install."""


def unavailable_reason() -> str | None:
    """Why the Slurm tests cannot run here, or None when they can."""
    if shutil.which("slurmctld") and Path(MUNGED).exists():
        return None
    if shutil.which("apt-get"):
        return None  # installable: a missing Slurm is a setup error, not a reason to skip
    return "slurmctld and munged are not installed and there is no apt-get to install them"


class SlurmCluster:
    """slurmctld, one slurmd per node and a munged, under `root`, from `start()` until
    `stop()`. `partitions` maps a partition's name to its nodes, the first the default; by
    default one partition, `debug`, holds them all."""

    def __init__(
        self,
        root: Path,
        nodes: Sequence[str] = ("n1", "n2", "n3"),
        partitions: Mapping[str, Sequence[str]] | None = None,
        *,
        cpus: int = 2,
        slurmd_timeout: int = 10,
        kill_wait: int = 30,
    ) -> None:
        self.root, self.nodes = root, list(nodes)
        self.partitions = dict(partitions or {"debug": self.nodes})
        self.cpus, self.slurmd_timeout, self.kill_wait = cpus, slurmd_timeout, kill_wait
        self.conf = root / "slurm.conf"
        self.log_dir = root / "log"
        self.munge_dir: Path | None = None
        self.munged: subprocess.Popen[bytes] | None = None
        self.slurmctld: subprocess.Popen[bytes] | None = None
        self.slurmds: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def env(self) -> dict[str, str]:
        """What a subprocess needs to drive this cluster: the Slurm commands on PATH and
        SLURM_CONF naming this cluster's config."""
        return {"SLURM_CONF": str(self.conf), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}

    def address(self, node: str) -> str:
        """The loopback address `node`'s slurmd serves on (its NodeAddr)."""
        return f"127.0.0.{self.nodes.index(node) + 2}"

    def start(self) -> SlurmCluster:
        if not shutil.which("slurmctld") or not Path(MUNGED).exists():
            raise SlurmUnavailable(f"slurmctld or munged is not installed: {INSTALL_HINT}")
        for folder in (self.log_dir, self.root / "spool", self.root / "state"):
            folder.mkdir(parents=True, exist_ok=True)
        try:
            self._start_munged()
            self._write_conf()
            self.slurmctld = self._spawn("slurmctld", ["slurmctld", "-D", "-i"])
            for node in self.nodes:
                self.start_slurmd(node)
            self._wait(lambda: self._states() == dict.fromkeys(self.nodes, "idle"), "all idle")
        except BaseException:
            self.stop()
            raise
        return self

    def _start_munged(self) -> None:
        MUNGE_RUN.mkdir(exist_ok=True)
        shutil.chown(MUNGE_RUN, "munge", "munge")
        self.munge_dir = Path(tempfile.mkdtemp(prefix="trainctl-slurm-", dir=MUNGE_RUN))
        self.munge_dir.chmod(0o711)
        shutil.chown(self.munge_dir, "munge", "munge")
        d = self.munge_dir
        command = [MUNGED, "--foreground", f"--socket={d}/munge.socket",
                   f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log",
                   f"--seed-file={d}/munged.seed"]  # fmt: skip
        with (self.log_dir / "munged.out").open("ab") as out:
            self.munged = subprocess.Popen(command, user="munge", group="munge",
                                           stdout=out, stderr=out)  # fmt: skip
        self._wait(lambda: (d / "munge.socket").exists(), "munged's socket")

    def _write_conf(self) -> None:
        r = self.root
        lines = [
            "ClusterName=trainctl",
            f"SlurmctldHost={socket.gethostname()}(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_dir}/munge.socket",
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool/%n",
            f"SlurmctldPidFile={r}/slurmctld.pid",
            f"SlurmdPidFile={r}/slurmd-%n.pid",
            f"SlurmctldLogFile={self.log_dir}/slurmctld.log",
            f"SlurmdLogFile={self.log_dir}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "MpiDefault=none",
            f"SlurmdTimeout={self.slurmd_timeout}",
            f"KillWait={self.kill_wait}",
            "MinJobAge=300",
            f"FirstJobId={random.randrange(1000, 100_000)}",
        ]
        hostname = socket.gethostname()
        for node in self.nodes:
            lines.append(
                f"NodeName={node} NodeHostname={hostname} NodeAddr={self.address(node)} "
                f"Port={free_port()} CPUs={self.cpus} RealMemory=4000 State=UNKNOWN"
            )
        for i, (name, members) in enumerate(self.partitions.items()):
            default = "YES" if i == 0 else "NO"
            lines.append(f"PartitionName={name} Nodes={','.join(members)} Default={default} "
                         "MaxTime=INFINITE State=UP")  # fmt: skip
        self.conf.write_text("\n".join(lines) + "\n")

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen[bytes]:
        """A daemon in the foreground (-D), so that its pid is ours to signal and reap."""
        with (self.log_dir / f"{name}.out").open("ab") as out:
            return subprocess.Popen(command, env={**os.environ, **self.env},
                                    stdout=out, stderr=out)  # fmt: skip

    def start_slurmd(self, node: str) -> None:
        """Start (or start again, after `kill_slurmd`) the slurmd of `node`; a no-op while
        it runs (a node has one slurmd)."""
        running = self.slurmds.get(node)
        if running is None or running.poll() is not None:
            self.slurmds[node] = self._spawn(f"slurmd-{node}", ["slurmd", "-D", "-N", node])

    def kill_slurmd(self, node: str) -> None:
        """SIGKILL `node`'s slurmd, as a node that dies does: its jobs' slurmstepds live on."""
        process = self.slurmds.pop(node)
        process.kill()
        process.wait()

    def run(self, *args: str) -> str:
        """Run a Slurm command against this cluster; its stdout. Fails with its stderr."""
        result = subprocess.run(args, env={**os.environ, **self.env},
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        if result.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {result.returncode}: "
                                 f"{result.stderr.strip()}")  # fmt: skip
        return result.stdout

    def show(self, kind: str, name: str) -> dict[str, str]:
        """`scontrol show <kind> <name>` as a dict of its Key=Value fields."""
        fields: dict[str, str] = {}
        for token in self.run("scontrol", "-o", "show", kind, name).split():
            key, sep, value = token.partition("=")
            if sep:
                fields[key] = value
        return fields

    def node_state(self, node: str) -> str:
        """The node's State, as scontrol prints it: IDLE, ALLOCATED, DOWN+NOT_RESPONDING..."""
        return self.show("node", node)["State"]

    def job(self, job_id: str | int) -> dict[str, str]:
        """`scontrol show job` as a dict: JobState, Reason, NodeList, Restarts, ExitCode..."""
        return self.show("job", str(job_id))

    def _states(self) -> dict[str, str]:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t")
        return dict(line.split() for line in out.splitlines() if line.strip())

    def _wait(self, ready: Callable[[], bool], what: str) -> None:
        """Poll `ready` until true; fail with the daemons' logs when a daemon exits or
        START_TIMEOUT passes first."""
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            dead = [p.args for p in self._daemons() if p.poll() is not None]
            if dead:
                raise SlurmUnavailable(f"{dead} exited while waiting for {what}\n{self.logs()}")
            try:
                if ready():
                    return
            except AssertionError:
                pass  # slurmctld not answering yet
            time.sleep(0.2)
        raise SlurmUnavailable(f"timed out waiting for {what}\n{self.logs()}")

    def _daemons(self) -> list[subprocess.Popen[bytes]]:
        daemons = [self.munged, self.slurmctld, *self.slurmds.values()]
        return [p for p in daemons if p is not None]

    def logs(self, lines: int = 20) -> str:
        """The last lines of every daemon's log, for a failure message."""
        parts = []
        for path in sorted(self.log_dir.glob("*")):
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name}\n" + "\n".join(tail))
        return "\n".join(parts)

    def stop(self) -> None:
        """Stop every daemon, then SIGKILL what the jobs left: slurmstepds and tasks (found
        by this cluster's SLURM_CONF in their environment), so no process outlives it."""
        for process in reversed(self._daemons()):
            if process.poll() is None:
                process.terminate()
        for process in self._daemons():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for pid in self._job_processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.slurmds.clear()
        if self.munge_dir is not None:
            shutil.rmtree(self.munge_dir, ignore_errors=True)

    def _job_processes(self) -> list[int]:
        """This cluster's slurmstepds and job tasks. Not everything with its SLURM_CONF: a
        process a test started with `env` (a service that submits) is the test's to stop."""
        marker = f"SLURM_CONF={self.conf}".encode()
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            variables = environ.split(b"\0")
            in_job = any(v.startswith(b"SLURM_JOB_ID=") for v in variables)
            if marker in variables and (in_job or self._is_slurmstepd(entry)):
                pids.append(int(entry.name))
        return pids

    @staticmethod
    def _is_slurmstepd(proc: Path) -> bool:
        try:
            return (proc / "comm").read_text().strip() == "slurmstepd"
        except OSError:
            return False

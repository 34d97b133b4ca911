"""Real worker processes (`python -m trainctl.worker`) and tiny train runs for the reliability
tests."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.support.databases import fresh_database
from tests.support.plans import enqueue, train_plan
from tests.support.polling import poll
from tests.support.stores import folder, posix_store
from trainctl.store.checkpoints.posix import GUARD_PREFIX, STAGING_PREFIX
from trainctl.store.db.records import Run
from trainctl.store.db.runs import RunStore
from trainctl.store.vocabulary import TERMINAL_STATES

REPO = Path(__file__).resolve().parents[2]


class Workers:
    """Worker processes with fixed ids on one data dir, each logging to its own file.

    Without `database_url` they share the SQLite file in the data dir, as the embedded
    default does; with one they share that database, as workers on several hosts do. `env`:
    what their environment adds to this process's (a bucket's settings and credentials).
    """

    def __init__(
        self, data_dir: Path, database_url: str | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.data_dir, self.database_url = data_dir, database_url
        self.env = {**os.environ, **env} if env is not None else None
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(
        self,
        worker_id: str,
        env: dict[str, str] | None = None,
        extra_args: Sequence[str] = (),
        python: str = sys.executable,
    ) -> subprocess.Popen[bytes]:
        """`python`: another environment's (one with a plug-in installed)."""
        args = ["--data-dir", str(self.data_dir), "--worker-id", worker_id, *extra_args]
        args += ["--heartbeat-seconds", "0.5", "--poll-seconds", "0.1"]
        if self.database_url is not None:
            args += ["--database-url", self.database_url]
        with open(self.log_path(worker_id), "wb") as log:
            proc = subprocess.Popen(
                [python, "-m", "trainctl.worker", *args],
                cwd=REPO,
                env=env if env is not None else self.env,
                stderr=log,
            )
        self.procs[worker_id] = proc
        return proc

    def start_node(self, worker_id: str, node: str, runs: RunStore) -> None:
        """A worker on "node" `node`, once it has registered (`start_nodes`)."""
        self.start_nodes(runs, {worker_id: node})

    def start_nodes(self, runs: RunStore, nodes: Mapping[str, str]) -> None:
        """Workers on "nodes" (worker id -> node name; gang members: loopback address, 5 s
        lease), started together since each takes seconds to import torch, once all have
        registered."""
        for worker_id, node in nodes.items():
            args = ["--node-name", node, "--address", "127.0.0.1", "--lease-seconds", "5"]
            self.start(worker_id, extra_args=args)
        poll(
            lambda: set(nodes) <= {w.id for w in runs.workers.list_workers()},
            timeout=120,
            what=f"{', '.join(nodes)} to register",
        )

    def logs(self) -> str:
        """The tail of every worker's log, for a failing test's message."""
        return "\n".join(f"--- {w}\n{self.log(w)[-3000:]}" for w in self.procs)

    def log_path(self, worker_id: str) -> Path:
        return self.data_dir / f"{worker_id}.log"

    def log(self, worker_id: str) -> str:
        return self.log_path(worker_id).read_text(errors="replace")

    def stall(self, worker_id: str) -> None:
        """SIGSTOP the worker, at a moment it does not hold SQLite's write lock, nor is
        between confirming its lease and publishing a checkpoint or deleting old ones.

        A process stopped inside a write transaction would block every writer, the reaper
        included: a property of SQLite (one writer at a time), not of leases. One stopped in
        a commit (its manifest staged, its lease just confirmed) publishes on resume a
        checkpoint it saved under a live lease, and one stopped in a retention (the
        experiment's guard held, its lease just confirmed) deletes on resume what it listed
        under a live lease; the tests reap at once, without waiting the lease out, which
        would make either look like a fenced worker's write.
        """
        proc = self.procs[worker_id]
        for _ in range(100):
            os.kill(proc.pid, signal.SIGSTOP)
            # kill returns before the stop lands: a thread still running on another core
            # could stage a manifest or take a lock after the checks below.
            poll(lambda: _stopped(proc.pid), 10, f"{worker_id} to stop", interval=0.002)
            if self._write_lock_is_free() and not self._committing() and self._guards_free():
                return
            os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.01)
        raise AssertionError(f"{worker_id} was always in a write, a commit or a retention")

    def _committing(self) -> bool:
        """Whether a checkpoint's manifest is staged and not yet published (posix store)."""
        return any((self.data_dir / "checkpoints").glob(f"*/{STAGING_PREFIX}*/manifest.json"))

    def _guards_free(self) -> bool:
        """Whether no process holds an experiment's guard (posix store): a retention holds
        it from its listing, through its lease check, to its last delete."""
        for guard in (self.data_dir / "checkpoints").glob(f"{GUARD_PREFIX}*"):
            fd = os.open(guard, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            finally:
                os.close(fd)  # releases the lock, if this took it
        return True

    def _write_lock_is_free(self) -> bool:
        conn = sqlite3.connect(self.data_dir / "trainctl.db", timeout=0.2, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            conn.close()

    def resume(self, worker_id: str) -> None:
        os.kill(self.procs[worker_id].pid, signal.SIGCONT)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
            proc.wait()


@contextlib.contextmanager
def gang_nodes(
    request: pytest.FixtureRequest, data_dir: Path, names: Sequence[str] = ("a", "b", "c")
) -> Iterator[tuple[Workers, RunStore]]:
    """Workers `worker-<name>` on nodes `node-<name>`, registered in a fresh PostgreSQL
    database (a gang's members share one as hosts do), and closed afterwards."""
    with fresh_database(request, "postgresql", data_dir) as url, RunStore(url) as runs:
        runs.create_all()
        pool = Workers(data_dir, url)
        try:
            pool.start_nodes(runs, {f"worker-{n}": f"node-{n}" for n in names})
            yield pool, runs
        finally:
            pool.close()


def _stopped(pid: int) -> bool:
    """Whether every thread of `pid` is stopped (state T in /proc)."""
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
    return all(state in ("T", "t") for state in states)


def enqueue_tiny_train(
    runs: RunStore,
    experiment: str,
    steps: int,
    *,
    checkpoint_every: int,
    max_attempts: int = 3,
    nproc_per_node: int = 1,
) -> Run:
    """A CPU train run that takes well under a second per few steps: the tiny preset on
    synthetic tokens, validating (and so saving ``best``) only at the end."""
    plan = train_plan(
        nproc_per_node=nproc_per_node,
        experiment=experiment,
        steps=steps,
        model={"preset": "tiny"},
        data={"source": "synthetic"},
        batch={"micro_batch_size": 2, "seq_len": 32},
        checkpoint_every=checkpoint_every,
        val_every=1_000_000,
        val_batches=1,
    )
    return enqueue(runs, plan, max_attempts=max_attempts)


def wait_finished(runs: RunStore, run: Run) -> Run:
    return poll(
        lambda: (r := runs.get(run.id)).state in TERMINAL_STATES and r, what=f"run {run.id}"
    )


def drain_reports(runs: RunStore, run: Run) -> list[dict[str, Any]]:
    """What each drain's log event says of its save (worker.kinds.train `maybe_log_drain`)."""
    return [e.data["drain"] for e in runs.events(run.id, type="log") if "drain" in e.data]


def checkpoint_manifests(root: Path, experiment: str) -> dict[str, str]:
    """Tag -> manifest text of every complete checkpoint: any new or rewritten one shows."""
    store = posix_store(root)
    return {
        c.tag: (folder(store, experiment, c.tag) / "manifest.json").read_text()
        for c in store.list_checkpoints(experiment)
    }

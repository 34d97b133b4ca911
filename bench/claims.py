"""Claims and gangs (issue 17): how long a claim takes for a 2-node gang against a 1-node run,
and how many runs/s 8 workers claim from a deep queue, on PostgreSQL.

Everything runs against a real PostgreSQL 15 server, started for the measurement by
`tests.support.pg.PostgresServer` (initdb in a temp dir, loopback only, fsync off: the same
throwaway server the tests use; the bench has no server of its own to start). Every worker is a
separate process (`python -m bench.claims worker ...`) with its own `RunStore`, as real workers are;
the parent enqueues, as the service does, and drives the workers over their stdin/stdout.

- Claim latency. Two idle registered workers (`lead`, `member`, on two node names). A round
  enqueues one run, then times, inside the worker, the `RunStore.claim` call that returns it:
  - 1-node run: `lead`'s one claim call.
  - 2-node gang (`Placement(nnodes=2)`): `lead`'s claim, which gathers `member` as its peer
    in the same transaction, then `member`'s next claim, which returns its place (node rank
    1). The gang figure is the sum of the two calls: the database's time to put both
    members in their places. Between the two a real member waits for its next poll
    (`--poll-seconds`, 0.5 s by default), which this leaves out on purpose: it is a setting,
    not the queue's cost.
  The run is queued before the timed call starts (the call never waits for an enqueue).
  Then the leader finishes the run and both workers `workers.release` (untimed). 1-node and
  gang rounds alternate, after one unmeasured round of each; median and p99 (linear
  interpolation, so of 50 samples it lies between the two largest).
- Throughput. N queued 1-node runs (enqueued one by one through `RunStore.enqueue`), then
  8 worker processes, registered and waiting, are told to go at once; each loops claim ->
  finish -> workers.release until a claim finds nothing. runs/s = N / (last worker done - first
  start), on the machine-wide monotonic clock. The bench checks that every run was claimed
  exactly once (ids from every worker, and every run `succeeded` in the database) and fails
  if not. N = 1,000 and 10,000, each in a fresh database; the median claim call is reported
  too (the queue shrinks from N to 0 while it drains).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
import traceback
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import IO, TYPE_CHECKING, Any

import numpy as np
from sqlalchemy import func, select

from bench.common import REPO, Figure, free_port
from trainctl.store.db.placement import Placement
from trainctl.store.db.runs import RunStore
from trainctl.store.db.schema import read_transaction, runs

if TYPE_CHECKING:
    from tests.support.pg import PostgresServer

FULL: dict[str, Any] = dict(rounds=50, depths=(1_000, 10_000), workers=8)
QUICK: dict[str, Any] = dict(rounds=10, depths=(100, 1_000), workers=8)
LEASE = 60.0
GANG = Placement(nnodes=2)


# ---- the worker side: one process, one RunStore ------------------------------------------------


def serve(url: str, worker_id: str, node: str) -> None:
    """A worker answering one JSON command a line on stdin with one JSON line on stdout."""
    replies: IO[str] = sys.stdout
    sys.stdout = sys.stderr  # nothing else may write on the reply channel
    store = RunStore(url)
    store.workers.register(
        worker_id, host=socket.gethostname(), pid=os.getpid(), device="cpu", info={},
        node_name=node, gpus=0, cpus=1, address="127.0.0.1",
    )  # fmt: skip

    def rendezvous() -> str:
        return f"127.0.0.1:{free_port()}"  # as a real leader does: a free port on its node

    def claim() -> dict[str, Any]:
        started = time.perf_counter()
        run = store.claim(worker_id, LEASE, rendezvous=rendezvous)
        seconds = time.perf_counter() - started
        if run is None:
            return {"run": None, "seconds": seconds}
        rank = None if run.gang is None else run.gang.node_rank
        return {"run": run.id, "attempt": run.attempt, "rank": rank, "seconds": seconds}

    def drain() -> dict[str, Any]:
        claimed, seconds, started = [], [], time.monotonic()
        while True:
            got = claim()
            if got["run"] is None:
                break
            seconds.append(got["seconds"])
            claimed.append(got["run"])
            store.finish(got["run"], worker_id, got["attempt"], "succeeded")
            store.workers.release(worker_id)
        return {
            "claimed": claimed,
            "claim_seconds": seconds,
            "start": started,
            "end": time.monotonic(),
        }

    def answer(command: dict[str, Any]) -> dict[str, Any]:
        op = command["op"]
        if op == "claim":
            return claim()
        if op == "finish":
            store.finish(command["run"], worker_id, command["attempt"], "succeeded")
        elif op == "release":
            store.workers.release(worker_id)
        elif op == "heartbeat":
            store.workers.heartbeat(worker_id)
        elif op == "drain":
            return drain()
        else:
            raise ValueError(f"unknown command {op!r}")
        return {}

    print(json.dumps({"ready": True}), file=replies, flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        if command["op"] == "exit":
            break
        try:
            reply = answer(command)
        except Exception as exc:
            traceback.print_exc()
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(reply), file=replies, flush=True)
    store.workers.deregister(worker_id)
    store.close()


# ---- the parent side ------------------------------------------------------------------------


class WorkerProcess:
    """`python -m bench.claims worker URL ID NODE`, spoken to a line at a time."""

    def __init__(self, url: str, worker_id: str, node: str) -> None:
        self.id = worker_id
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.claims", "worker", url, worker_id, node],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def send(self, op: str, **args: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()

    def receive(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.id} exited (code {self.proc.wait()})")
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"worker {self.id}: {reply['error']}")
        return reply

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        self.send(op, **args)
        return self.receive()

    def stop(self) -> None:
        try:
            self.send("exit")
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        finally:
            for pipe in (self.proc.stdin, self.proc.stdout):
                if pipe is not None:
                    with suppress(OSError):  # a dead worker: its pipe is broken
                        pipe.close()


@contextmanager
def worker_processes(url: str, ids: Sequence[str]) -> Iterator[list[WorkerProcess]]:
    """Started together, each registered (on its own node name) before this yields."""
    procs: list[WorkerProcess] = []
    try:
        for worker_id in ids:
            procs.append(WorkerProcess(url, worker_id, node=f"node-{worker_id}"))
        for p in procs:
            p.receive()
        yield procs
    finally:
        for p in procs:
            p.stop()


def p99(values: list[float]) -> float:
    return float(np.percentile(values, 99))


def latency(url: str, rounds: int) -> list[Figure]:
    single: list[float] = []
    leader: list[float] = []
    member: list[float] = []
    with RunStore(url) as store, worker_processes(url, ["lead", "member"]) as (a, b):

        def one_node(record: bool) -> None:
            run = store.enqueue("benchmark", "claims", {})
            got = a.call("claim")
            if got["run"] != run.id:
                raise RuntimeError(f"lead claimed {got['run']}, not the queued run {run.id}")
            a.call("finish", run=run.id, attempt=got["attempt"])
            a.call("release")
            if record:
                single.append(got["seconds"])

        def gang(record: bool) -> None:
            a.call("heartbeat")
            b.call("heartbeat")
            run = store.enqueue("benchmark", "claims", {}, placement=GANG)
            led = a.call("claim")
            placed = b.call("claim")
            if (led["run"], led["rank"], placed["run"], placed["rank"]) != (run.id, 0, run.id, 1):
                raise RuntimeError(f"gang {run.id} not placed as ranks 0 and 1: {led}, {placed}")
            if store.gang_members(run.id) != ["lead", "member"]:
                raise RuntimeError(f"gang {run.id} has members {store.gang_members(run.id)}")
            a.call("finish", run=run.id, attempt=led["attempt"])
            a.call("release")
            b.call("release")
            if record:
                leader.append(led["seconds"])
                member.append(placed["seconds"])

        one_node(record=False)  # warm-up: connections, prepared plans
        gang(record=False)
        for r in range(rounds):
            sides = (one_node, gang) if r % 2 == 0 else (gang, one_node)
            for side in sides:
                side(record=True)

    both = [x + y for x, y in zip(leader, member, strict=True)]
    ms = 1000.0
    note = f"{rounds} runs each; the claim call(s) only, run already queued"
    gang_note = (
        f"leader's claim (gathers the peer) median {statistics.median(leader) * ms:.2f} ms "
        f"+ member's next claim {statistics.median(member) * ms:.2f} ms"
    )
    return [
        Figure("claims: 1-node run, claim median", statistics.median(single) * ms, "ms", note=note),
        Figure("claims: 1-node run, claim p99", p99(single) * ms, "ms"),
        Figure(
            "claims: 2-node gang, both placed median",
            statistics.median(both) * ms,
            "ms",
            note=gang_note,
        ),
        Figure("claims: 2-node gang, both placed p99", p99(both) * ms, "ms"),
        Figure(
            "claims: 2-node gang leader's claim median",
            statistics.median(leader) * ms,
            "ms",
            note=f"p99 {p99(leader) * ms:.2f} ms",
        ),
        Figure(
            "claims: 2-node gang member's claim median",
            statistics.median(member) * ms,
            "ms",
            note=f"p99 {p99(member) * ms:.2f} ms",
        ),
        Figure(
            "claims: gang / 1-node, median",
            statistics.median(both) / statistics.median(single),
            "x",
        ),
        Figure("claims: gang / 1-node, p99", p99(both) / p99(single), "x"),
    ]


def throughput(server: PostgresServer, depth: int, workers: int) -> tuple[float, float, str]:
    """runs/s, median claim seconds and a note, for `workers` draining `depth` queued runs."""
    with server.database() as url, RunStore(url) as store:
        store.create_all()
        started = time.perf_counter()
        queued = {store.enqueue("benchmark", "claims", {}).id for _ in range(depth)}
        enqueue_s = time.perf_counter() - started
        with worker_processes(url, [f"w{i}" for i in range(workers)]) as procs:
            for p in procs:
                p.send("drain")
            replies = [p.receive() for p in procs]
        with read_transaction(store.engine) as conn:
            query = select(runs.c.state, func.count()).group_by(runs.c.state)
            states = {state: int(count) for state, count in conn.execute(query)}
    claimed = [run_id for r in replies for run_id in r["claimed"]]
    twice = sum(1 for n in Counter(claimed).values() if n > 1)
    missed = len(queued - set(claimed))
    if twice or missed or len(claimed) != depth or states != {"succeeded": depth}:
        raise RuntimeError(
            f"{depth} runs queued: {len(claimed)} claims, {twice} runs claimed twice, "
            f"{missed} never claimed; states in the database {states}"
        )
    elapsed = max(r["end"] for r in replies) - min(r["start"] for r in replies)
    per_worker = sorted(len(r["claimed"]) for r in replies)
    claim_s = statistics.median(s for r in replies for s in r["claim_seconds"])
    note = (
        f"every run claimed exactly once ({depth:,} runs, {depth:,} succeeded); "
        f"{elapsed:.1f} s, per worker {per_worker[0]}-{per_worker[-1]} runs; "
        f"enqueue {depth / enqueue_s:,.0f} runs/s"
    )
    return depth / elapsed, claim_s, note


def run(quick: bool) -> list[Figure]:
    from tests.support.pg import PostgresServer  # the tests' throwaway server; see the docstring

    size = QUICK if quick else FULL
    server = PostgresServer().start()
    try:
        with server.database() as url:
            with RunStore(url) as store:
                store.create_all()
            figures = latency(url, size["rounds"])
        rates = []
        for depth in size["depths"]:
            rate, claim_s, note = throughput(server, depth, size["workers"])
            rates.append(rate)
            name = f"claims: throughput, {size['workers']} workers, {depth:,} queued"
            figures.append(Figure(name, rate, "runs/s", note=note))
            figures.append(
                Figure(
                    f"claims: claim call median while draining {depth:,}",
                    claim_s * 1000,
                    "ms",
                    note="each claim call, in loops of claim -> finish -> release_worker",
                )
            )
        first, last = size["depths"][0], size["depths"][-1]
        figures.append(
            Figure(f"claims: throughput {last:,} / {first:,} queued", rates[-1] / rates[0], "x")
        )
    finally:
        server.stop()
    return figures


if __name__ == "__main__":
    if sys.argv[1:2] != ["worker"] or len(sys.argv) != 5:
        sys.exit("usage: python -m bench.claims worker DATABASE_URL WORKER_ID NODE_NAME")
    serve(*sys.argv[2:])

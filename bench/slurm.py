"""Slurm (issue 42): what running each attempt as a Slurm job costs a run, against the embedded
backend (the service's own local worker), measured in the same run.

Everything is real and started for the measurement by the tests' own helpers (the bench has
none of its own to start; bench/claims.py and bench/s3_checkpoint.py import tests/support the
same way): a slurmctld and three slurmd nodes on loopback (`tests.support.slurm.SlurmCluster`),
PostgreSQL 15 (`tests.support.pg.PostgresServer`), and the service as a process
(`tests.support.service_process.Service`), driven over HTTP:
- slurm: TRAINCTL_BACKEND=slurm, no local worker, PostgreSQL, TRAINCTL_SLURM_POLL_SECONDS=1,
  TRAINCTL_DRAIN_SECONDS=15; each attempt is one `sbatch` whose task is a one-shot worker.
- embedded: the service with one local worker and SQLite, its defaults.

1. Submit to first step. The same tiny CPU train run (30 steps) is POSTed to each side in
   turn (rotating order, `alternate`); the figure is from the POST to the run's first train
   metrics event (its `created_at` in the run store, the same machine's clock). Each run is
   waited for to the end before the next. The slurm side is split at its job's `claimed_at`
   (the task's worker has started and claimed the run): submit -> claimed (the backend's poll,
   sbatch, Slurm's scheduling, srun, the worker's Python and torch imports) and claimed ->
   first step (the model built and one step taken), as is the embedded side at its run's
   `started_at`.
2. Job chain (full run only). One run with `slurm: {"time_limit": "2"}`: slurmctld sends
   SIGTERM 60-90 s into each job (`--signal=TERM@30`, checked every 30 s), the worker drains
   (saves, requeues the run at no attempt's cost) and the service submits the next job. Its
   steps are sized from the step rate of part 1 for about 170 s of training: 2-3 jobs. The
   only saves are the drains' (checkpoint_every 100,000). From the run's events, split into
   jobs at its state events (claimed ... requeued), per boundary:
   - steps redone: the last step the ended job reported minus the step of its drain's
     checkpoint (work done past the save, lost and done again); steps skipped: the resumed
     job's first step minus the one after the checkpoint's. Both should be 0; they are
     counted, as are steps reported twice and steps never reported over the whole run.
     Tokens = steps x micro_batch_size x seq_len x grad_accum_steps.
   - seconds from the requeue (the drain's state event) to the next job's claim and to its
     first train step.
"""

from __future__ import annotations

import itertools
import os
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.common import Figure, alternate, median, paired_ratio
from trainctl.store.db.records import Event
from trainctl.store.db.runs import RunStore
from trainctl.store.vocabulary import TERMINAL_STATES

FULL: dict[str, Any] = dict(rounds=3, chain=True)
QUICK: dict[str, Any] = dict(rounds=1, chain=False)
DRAIN_SECONDS = 15
CHAIN_TRAIN_SECONDS = 170.0
"""Training the chained run should take at its measured step rate: 2-3 jobs of 2 minutes."""
TINY: dict[str, Any] = {
    "steps": 30,
    "model": {"preset": "tiny"},
    "data": {"source": "synthetic"},
    "batch": {"micro_batch_size": 2, "seq_len": 32},
    "device": "cpu",
    "val_every": 30,
    "val_batches": 1,
    "log_every": 1,
}


class Side:
    """One service over HTTP, and its run store read directly for the events' times."""

    def __init__(self, name: str, url: str, database_url: str) -> None:
        self.name, self.url = name, url
        self.runs = RunStore(database_url)

    def submit(self, body: dict[str, Any]) -> str:
        r = httpx.post(f"{self.url}/runs/train", json=body, timeout=60)
        if r.status_code != 202:
            raise RuntimeError(f"{self.name}: POST /runs/train -> {r.status_code}: {r.text}")
        run_id: str = r.json()["id"]
        return run_id

    def get(self, run_id: str) -> dict[str, Any]:
        r = httpx.get(f"{self.url}/runs/{run_id}", timeout=60)
        r.raise_for_status()
        run: dict[str, Any] = r.json()
        return run

    def events(self, run_id: str, type: str | None = None) -> list[Event]:
        return self.runs.events(run_id, limit=10_000_000, type=type)

    def train_metrics(self, run_id: str) -> list[Event]:
        return [e for e in self.events(run_id, "metrics") if e.data.get("kind") == "train"]

    def finished(self, run_id: str, timeout: float) -> dict[str, Any]:
        run = wait_for(lambda: (r := self.get(run_id))["state"] in TERMINAL_STATES and r,
                       f"{self.name} run {run_id} to end", timeout, interval=0.5)  # fmt: skip
        if run["state"] != "succeeded":
            raise RuntimeError(f"{self.name} run {run_id} ended {run['state']}: {run['error']}")
        return dict(run)


def wait_for(
    predicate: Callable[[], Any], what: str, timeout: float, interval: float = 0.25
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := predicate():
            return found
        time.sleep(interval)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


def stamp(value: str | datetime) -> float:
    """Unix seconds of an API timestamp (ISO text) or an event's datetime."""
    when = datetime.fromisoformat(value) if isinstance(value, str) else value
    return when.timestamp()


def first_step_round(side: Side, i: int, out: dict[str, list[float]]) -> float:
    """POST one tiny run; seconds to its first train metrics event. The split (to the claim,
    from the claim) and the step times go into `out`."""
    posted = time.time()
    run_id = side.submit({**TINY, "experiment": f"first-step-{side.name}-{i}"})
    first = wait_for(lambda: side.train_metrics(run_id)[:1], f"{side.name}'s first step", 300)
    stepped = stamp(first[0].created_at)
    run = side.finished(run_id, 300)
    if side.name == "slurm":
        claimed = stamp(run["jobs"][0]["claimed_at"])
    else:
        claimed = stamp(run["started_at"])
    out[f"{side.name} to claim"].append(claimed - posted)
    out[f"{side.name} claim to step"].append(stepped - claimed)
    out["step seconds"] += [
        e.data["step_time_sec"] for e in side.train_metrics(run_id) if e.data["step"] > 1
    ]
    return stepped - posted


def chain_jobs(events: list[Event]) -> list[list[Event]]:
    """A run's events (all types, in id order) cut into its jobs: each from its claim (state
    running) to its requeue or end."""
    jobs: list[list[Event]] = []
    current: list[Event] | None = None
    for e in events:
        if e.type == "state" and e.data.get("state") == "running":
            current = [e]
            jobs.append(current)
        elif current is not None:
            current.append(e)
            if e.type == "state":
                current = None
    return jobs


def chain(slurm: Side, steps: int) -> dict[str, Any]:
    body = {**TINY, "experiment": "slurm-chain", "steps": steps, "val_every": steps,
            "checkpoint_every": 100_000, "slurm": {"time_limit": "2"}}  # fmt: skip
    run_id = slurm.submit(body)
    run = slurm.finished(run_id, CHAIN_TRAIN_SECONDS * 4 + 300)
    if run["attempt"] != 1:
        raise RuntimeError(f"the chain cost an attempt: {run['attempt']}")
    batch = run["spec"]["batch"]
    tokens = batch["micro_batch_size"] * batch["seq_len"] * batch["grad_accum_steps"]
    jobs = chain_jobs(slurm.events(run_id))
    if len(jobs) != len(run["jobs"]) or len(jobs) < 2:
        raise RuntimeError(f"{len(jobs)} claims in the events, {len(run['jobs'])} jobs listed")
    boundaries = []
    for k, (ended, resumed) in enumerate(itertools.pairwise(jobs)):
        ended_steps = [e.data["step"] for e in ended
                       if e.type == "metrics" and e.data.get("kind") == "train"]  # fmt: skip
        resumed_steps = [e.data["step"] for e in resumed
                         if e.type == "metrics" and e.data.get("kind") == "train"]  # fmt: skip
        saves = [e.data["checkpoint"]["step"] for e in ended
                 if e.type == "log" and "checkpoint" in e.data]  # fmt: skip
        requeue = ended[-1]
        if requeue.data.get("state") != "queued" or not saves:
            raise RuntimeError(f"job {k + 1} did not end in a drain: {requeue.data}, saves {saves}")
        first = next(e for e in resumed if e.type == "metrics" and e.data.get("kind") == "train")
        boundaries.append(
            {
                "checkpoint step": saves[-1],
                "last step reported": max(ended_steps),
                "redone": max(ended_steps) - saves[-1],
                "skipped": min(resumed_steps) - (saves[-1] + 1),
                "requeue to claim": stamp(run["jobs"][k + 1]["claimed_at"])
                - stamp(requeue.created_at),
                "requeue to step": stamp(first.created_at) - stamp(requeue.created_at),
                "reason": requeue.data.get("reason", ""),
            }
        )
    for k, x in enumerate(boundaries, 1):
        print(f"boundary {k}: {x}", flush=True)
    reported = [e.data["step"] for e in slurm.train_metrics(run_id)]
    return {
        "jobs": len(jobs),
        "steps": steps,
        "tokens per step": tokens,
        "boundaries": boundaries,
        "twice": len(reported) - len(set(reported)),
        "missing": len(set(range(1, steps + 1)) - set(reported)),
    }


def run(quick: bool = False) -> list[Figure]:
    # The tests' own servers (see the docstring); imported here, as bench/claims.py does.
    from tests.support.pg import PostgresServer
    from tests.support.service_process import Service
    from tests.support.slurm import SlurmCluster

    size = QUICK if quick else FULL
    with (
        tempfile.TemporaryDirectory(dir=os.environ.get("TRAINCTL_BENCH_TMP")) as tmp,
        ExitStack() as stack,
    ):
        root = Path(tmp)
        for d in ("slurm", "slurm-data", "embedded-data"):
            (root / d).mkdir()
        pg = PostgresServer()
        stack.callback(pg.stop)
        pg.start()
        cluster = SlurmCluster(root / "slurm")
        stack.callback(cluster.stop)
        cluster.start()
        database_url = stack.enter_context(pg.database())
        env = {**cluster.env, "TRAINCTL_BACKEND": "slurm", "TRAINCTL_DATABASE_URL": database_url,
               "TRAINCTL_SLURM_POLL_SECONDS": "1", "TRAINCTL_DRAIN_SECONDS": str(DRAIN_SECONDS),
               "TRAINCTL_WORKERS": ""}  # fmt: skip
        slurm_service = Service(root / "slurm-data", workers=0, extra_env=env)
        stack.callback(stop, slurm_service)
        slurm_service.start()
        embedded_service = Service(root / "embedded-data", workers=1)
        stack.callback(stop, embedded_service)
        embedded_service.start()
        slurm = Side("slurm", slurm_service.url, database_url)
        stack.callback(slurm.runs.close)
        embedded = Side("embedded", embedded_service.url,
                        f"sqlite:///{root / 'embedded-data' / 'trainctl.db'}")  # fmt: skip
        stack.callback(embedded.runs.close)

        split: dict[str, list[float]] = {k: [] for k in (
            "slurm to claim", "slurm claim to step", "embedded to claim",
            "embedded claim to step", "step seconds")}  # fmt: skip
        rounds = iter(range(1_000))
        times = alternate(
            {s.name: (lambda s=s: first_step_round(s, next(rounds), split))  # type: ignore[misc]
             for s in (slurm, embedded)},
            size["rounds"],
        )  # fmt: skip
        stop(embedded_service)  # the chain runs alone
        step_seconds = median(split["step seconds"])
        chained = None
        if size["chain"]:
            chained = chain(slurm, max(500, int(CHAIN_TRAIN_SECONDS / step_seconds)))
    return figures(size, times, split, step_seconds, chained)


def stop(service: Any) -> None:
    if service.process is not None and service.process.poll() is None:
        service.stop()


def figures(
    size: dict[str, Any],
    times: dict[str, list[float]],
    split: dict[str, list[float]],
    step_seconds: float,
    chained: dict[str, Any] | None,
) -> list[Figure]:
    note = f"tiny preset, CPU, 30 steps, {size['rounds']} round(s) each"
    out = [
        Figure("slurm: submit -> first step, slurm", median(times["slurm"]), "s", note=note),
        Figure("slurm: submit -> first step, embedded", median(times["embedded"]), "s"),
        Figure(
            "slurm: submit -> first step, slurm / embedded",
            paired_ratio(times["slurm"], times["embedded"]),
            "x",
            lower_is_better=True,
        ),
        Figure("slurm: slurm, submit -> job claimed", median(split["slurm to claim"]), "s"),
        Figure("slurm: slurm, claimed -> first step", median(split["slurm claim to step"]), "s"),
        Figure("slurm: embedded, submit -> run started", median(split["embedded to claim"]), "s"),
        Figure(
            "slurm: embedded, started -> first step", median(split["embedded claim to step"]), "s"
        ),
        Figure("slurm: tiny CPU step (median, both sides)", step_seconds * 1e3, "ms"),
    ]
    if chained is None:
        out.append(Figure("slurm: job chain", float("nan"), "", note="skipped in --quick"))
        return out
    b = chained["boundaries"]
    tokens = chained["tokens per step"]
    redone = [x["redone"] for x in b]
    boundaries = "; ".join(
        f"ckpt {x['checkpoint step']}, last reported {x['last step reported']}" for x in b
    )
    out += [
        Figure(
            "slurm: chain, jobs",
            chained["jobs"],
            "",
            note=f"{chained['steps']} steps, time limit 2 min, drain 15 s",
        ),
        Figure(
            "slurm: chain, steps redone per boundary (max)", max(redone), "steps", note=boundaries
        ),
        Figure(
            "slurm: chain, tokens lost per boundary (max)",
            max(redone) * tokens,
            "tokens",
            note=f"{tokens} tokens a step",
        ),
        Figure(
            "slurm: chain, steps skipped per boundary (max)", max(x["skipped"] for x in b), "steps"
        ),
        Figure(
            "slurm: chain, steps reported twice / never",
            chained["twice"],
            "steps",
            note=f"never: {chained['missing']}",
        ),
        Figure(
            "slurm: chain, requeue -> next job claimed (median)",
            median([x["requeue to claim"] for x in b]),
            "s",
            note=", ".join(f"{x['requeue to claim']:.1f}" for x in b),
        ),
        Figure(
            "slurm: chain, requeue -> next job's first step (median)",
            median([x["requeue to step"] for x in b]),
            "s",
            note=", ".join(f"{x['requeue to step']:.1f}" for x in b),
        ),
    ]
    return out

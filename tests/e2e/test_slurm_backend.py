"""Runs on Slurm, end to end (docs/design/backends.md, "Slurm"; docs/scaling.md, "Running on
Slurm"): a real slurmctld and three slurmd nodes on this machine (tests/support/slurm.py), the
real service with TRAINCTL_BACKEND=slurm and PostgreSQL, driven over HTTP, and Slurm's own
commands (squeue, scontrol, scancel) to check what it did.

- A 2-node FSDP run is one job across two slurmd nodes and succeeds; its checkpoint resumes
  on one node.
- A run pending for resources shows Slurm's reason and starts once a node frees.
- kill -9 of the slurmd of the node a run is on: Slurm ends the job (NODE_FAIL), the run is
  a new attempt in a new job on the other nodes, resuming from its last checkpoint.
- A time limit shorter than the run: the run chains jobs, drained before each limit, and
  costs no attempt; its losses are bit-exact those of a run in one job.
- scancel from outside drains the run and requeues it without costing an attempt, in a job
  kept off the node its stragglers were reported on (sbatch --exclude); a cancel through the
  API ends the run and its job.
- Options outside the allow-list, or shell metacharacters in a name, are a 422.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.service.dashboard.pages import CHROMIUM, CHROMIUM_ARGS
from tests.support.databases import fresh_database
from tests.support.polling import poll
from tests.support.service_process import Service
from tests.support.slurm import SlurmCluster
from trainctl.store.db.runs import RunStore
from trainctl.store.vocabulary import TERMINAL_STATES

pytestmark = pytest.mark.slow
DRAIN_SECONDS = 15
TINY: dict[str, Any] = {
    "model": {"preset": "tiny"},
    "data": {"source": "synthetic"},
    "batch": {"micro_batch_size": 2, "seq_len": 32},
    "val_batches": 1,
    "log_every": 1,
    "device": "cpu",
}


class SlurmService:
    """The service on a "login node" of the cluster: no local worker, runs as Slurm jobs."""

    def __init__(self, cluster: SlurmCluster, data_dir: Path, database_url: str) -> None:
        self.cluster = cluster
        self.service = Service(data_dir, workers=0)
        self.service.extra_env.update(
            {
                **cluster.env,
                "TRAINCTL_BACKEND": "slurm",
                "TRAINCTL_DATABASE_URL": database_url,
                "TRAINCTL_SLURM_POLL_SECONDS": "1",
                "TRAINCTL_DRAIN_SECONDS": str(DRAIN_SECONDS),
                "TRAINCTL_WORKERS": "",
                # Not the other end-to-end tests' 5 s: no test here waits for a lease to run
                # out (Slurm ends a lost node's job), and on 2 loaded cores PostgreSQL once
                # took 4.7 s to answer a job's heartbeat, which requeued a healthy run.
                "TRAINCTL_LEASE_SECONDS": "15",
            }
        )
        self.runs = RunStore(database_url)

    @property
    def url(self) -> str:
        return self.service.url

    def submit(self, kind: str = "train", **body: Any) -> dict[str, Any]:
        r = httpx.post(f"{self.url}/runs/{kind}", json=body, timeout=60)
        assert r.status_code == 202, r.text
        run: dict[str, Any] = r.json()
        return run

    def get(self, run_id: str) -> dict[str, Any]:
        r = httpx.get(f"{self.url}/runs/{run_id}", timeout=60)
        assert r.status_code == 200, r.text
        run: dict[str, Any] = r.json()
        return run

    def wait(self, run_id: str, what: str, until: Any, timeout: float = 300) -> dict[str, Any]:
        found = poll(
            lambda: r if until(r := self.get(run_id)) else None,
            timeout=timeout,
            what=f"run {run_id}: {what}\n{self.logs()}",
            interval=0.5,
        )
        assert isinstance(found, dict)
        return found

    def resizes(self, run_id: str, count: int) -> list[tuple[int, int, int | None]]:
        """The run's resizes (from, to, step), once there are `count`: the leader's worker
        logs each before its ranks start, but the ranks report progress on connections of
        their own, so a step may be seen before the log line is written."""
        found = poll(
            lambda: len(r := self._resizes(run_id)) >= count and r,
            timeout=60,
            what=f"run {run_id}: {count} resize log lines",
        )
        return list(found)

    def _resizes(self, run_id: str) -> list[tuple[int, int, int | None]]:
        events = self.runs.events(run_id, type="log")
        return [(r["from"], r["to"], r["step"]) for e in events if (r := e.data.get("resize"))]

    def finished(self, run_id: str, timeout: float = 300) -> dict[str, Any]:
        return self.wait(run_id, "to end", lambda r: r["state"] in TERMINAL_STATES, timeout)

    @contextlib.contextmanager
    def node_lost(self, node: str, run_id: str) -> Iterator[None]:
        """Kill `node`'s slurmd under the open-ended run `run_id`; afterwards cancel the run
        and bring the node back into service, for the tests after this one."""
        self.cluster.kill_slurmd(node)
        try:
            yield
        finally:
            httpx.post(f"{self.url}/runs/{run_id}/cancel", timeout=30)
            self.cluster.start_slurmd(node)
        assert self.finished(run_id)["state"] == "cancelled"
        poll(
            lambda: "idle" in self.cluster.node_state(node).lower(),
            timeout=60,
            what=f"{node} back in service",
        )

    def logs(self) -> str:
        jobs = "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted((self.service.data_dir / "logs").glob("slurm-*.out"))[-4:]
        )
        return f"{self.service.log_tail()}\n{jobs}\n{self.cluster.logs(10)}"

    def train_losses(self, run_id: str) -> list[float]:
        events = self.runs.events(run_id, limit=100_000, type="metrics")
        train = [e.data for e in events if e.data.get("kind") == "train"]
        assert [m["step"] for m in train] == sorted({m["step"] for m in train}), "a step twice"
        return [m["loss"] for m in train]

    def close(self) -> None:
        if self.service.process is not None and self.service.process.poll() is None:
            self.service.stop()
        self.runs.close()


@pytest.fixture(scope="module")
def slurm(
    request: pytest.FixtureRequest,
    slurm_cluster: SlurmCluster,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SlurmService]:
    root = tmp_path_factory.mktemp("slurm-service")
    with fresh_database(request, "postgresql", root) as url:
        (root / "data").mkdir()
        service = SlurmService(slurm_cluster, root / "data", url)
        try:
            service.service.start()
            yield service
        finally:
            service.close()


def dashboard_text(url: str, run_id: str) -> dict[str, str]:
    """What the dashboard's run page shows of a run's jobs and wait, in Chromium."""
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(f"{url}/#/runs/{run_id}")
            page.wait_for_selector("#run-waiting")
            return {
                "waiting": page.text_content("#run-waiting") or "",
                "jobs": page.text_content("#run-jobs") or "",
            }
        finally:
            browser.close()


def job_of(run: dict[str, Any], index: int = -1) -> dict[str, Any]:
    assert run["jobs"], f"run {run['id']} has no job: {run}"
    job: dict[str, Any] = run["jobs"][index]
    return job


def running_past(step: int) -> Any:
    return lambda r: r["state"] == "running" and (r["progress"]["step"] or 0) > step


def test_a_two_node_fsdp_run_is_one_slurm_job_across_two_nodes(slurm: SlurmService) -> None:
    body = {
        **TINY,
        "experiment": "slurm-fsdp",
        "steps": 20,
        "checkpoint_every": 10,
        "val_every": 20,
        "nnodes": 2,
        "parallelism": {"strategy": "fsdp"},
    }
    body["batch"] = {**TINY["batch"], "grad_accum_steps": 2}
    run = slurm.finished(slurm.submit(**body)["id"])
    assert run["state"] == "succeeded", run["error"]
    assert run["attempt"] == 1 and len(run["jobs"]) == 1
    job = job_of(run)
    assert job["backend"] == "slurm" and job["claimed_at"] is not None
    shown = slurm.cluster.job(job["job_id"])  # Slurm's own record of it
    assert shown["NumNodes"] == "2" and shown["JobName"] == f"trainctl-{run['id']}"
    assert len(slurm.cluster.run("scontrol", "show", "hostnames", shown["NodeList"]).split()) == 2
    reasons = [e.data["reason"] for e in slurm.runs.events(run["id"], type="state")]
    claimed = next(r for r in reasons if r.startswith("claimed by"))
    assert f"slurm job {job['job_id']} on n" in claimed and "gang of 2" in claimed, claimed

    # Its sharded checkpoint resumes at another world size: one node, one process.
    more = {
        **TINY,
        "experiment": "slurm-fsdp",
        "steps": 30,
        "checkpoint_every": 10,
        "val_every": 30,
        "resume_from": "latest",
    }
    resumed = slurm.finished(slurm.submit(**more)["id"])
    assert resumed["state"] == "succeeded", resumed["error"]
    assert resumed["progress"]["step"] == 30 and len(resumed["jobs"]) == 1


def test_a_run_pending_for_resources_shows_slurms_reason_and_starts_when_a_node_frees(
    slurm: SlurmService,
) -> None:
    blockers = [
        slurm.cluster.run(
            "sbatch",
            "--parsable",
            "--exclusive",
            f"--nodelist={node}",
            "--output=/dev/null",
            "--wrap",
            "sleep 600",
        ).strip()
        for node in slurm.cluster.nodes
    ]
    try:
        poll(lambda: all(slurm.cluster.job(b)["JobState"] == "RUNNING" for b in blockers))
        body = {**TINY, "experiment": "slurm-pending", "steps": 5, "val_every": 5}
        run_id = slurm.submit(**body)["id"]
        waiting = slurm.wait(
            run_id,
            "to wait with Slurm's reason",
            lambda r: re.search(
                r"slurm job \d+ pending \((Resources|Priority)\)", r["waiting_reason"] or ""
            ),
            timeout=60,
        )
        assert waiting["state"] == "queued"
        cli = slurm.cluster.run("squeue", "-h", "-o", "%i %T %r", "-j", job_of(waiting)["job_id"])
        assert "PENDING" in cli
        shown = dashboard_text(slurm.url, run_id)
        assert re.search(r"slurm job \d+ pending \((Resources|Priority)\)", shown["waiting"])
        assert shown["jobs"].endswith(f"slurm {job_of(waiting)['job_id']} pending"), shown
    finally:
        slurm.cluster.run("scancel", *blockers)
    run = slurm.finished(run_id)
    assert run["state"] == "succeeded" and run["attempt"] == 1, run["error"]


@pytest.mark.soak  # ~40 s; the elastic test below loses a node's slurmd under a run in make test
def test_kill_9_of_a_nodes_slurmd_mid_run_resumes_in_a_new_job_and_attempt(
    slurm: SlurmService,
) -> None:
    body = {
        **TINY,
        "experiment": "slurm-nodefail",
        "steps": 100_000,
        "checkpoint_every": 5,
        "val_every": 100_000,
    }
    run_id = slurm.submit(**body)["id"]
    run = slurm.wait(run_id, "to train past a checkpoint", running_past(6), timeout=120)
    node = job_of(run)["nodes"]
    assert node in slurm.cluster.nodes, run["jobs"]
    with slurm.node_lost(node, run_id):
        again = slurm.wait(
            run_id,
            "a new attempt in a new job",
            lambda r: r["attempt"] == 2 and r["state"] == "running" and len(r["jobs"]) == 2,
            timeout=120,
        )
        assert job_of(again, 0)["state"] in ("NODE_FAIL", "GONE"), again["jobs"]
        assert job_of(again)["nodes"] != node
        requeue = slurm.runs.events(run_id, type="state")
        assert any(
            "ended (NODE_FAIL" in e.data["reason"] or "no longer listed" in e.data["reason"]
            for e in requeue
        ), [e.data for e in requeue]
        # It resumed from the last checkpoint of attempt 1, and lists only whole checkpoints.
        listed = httpx.get(f"{slurm.url}/checkpoints?experiment=slurm-nodefail", timeout=30).json()
        assert all(c["step"] % 5 == 0 for c in listed["items"])
        # Its worker logs the resume once it has the run, which the claim shows first.
        poll(
            lambda: any("resuming from step_" in e.data.get("message", "")
                        for e in slurm.runs.events(run_id, type="log")),
            timeout=60,
            what="the second attempt's resume",
        )  # fmt: skip


def test_an_elastic_gang_goes_on_in_a_job_on_fewer_nodes_and_grows_back_when_one_returns(
    slurm: SlurmService,
) -> None:
    # The first job has all three nodes; once one is lost (down in sinfo) and the gang's
    # grace has passed, the next job asks for the two that are up, where the run resumes
    # resharded with the same global batch (docs/design/placement.md, "Elastic gangs").
    # Once the node is back (idle), the service has that job hand the run back at a step,
    # and the third job has all three nodes again.
    elastic = {"min": 2, "max": 3, "shrink_after_seconds": 1}
    body = {**TINY, "experiment": "slurm-elastic", "steps": 100_000, "checkpoint_every": 5,
            "val_every": 100_000, "nnodes": elastic}  # fmt: skip
    body["batch"] = {**TINY["batch"], "grad_accum_steps": 6}
    run_id = slurm.submit(**body)["id"]
    run = slurm.wait(run_id, "to train past a checkpoint", running_past(6), timeout=180)
    first = slurm.cluster.job(job_of(run)["job_id"])
    assert first["NumNodes"] == "3" and run["gang_nnodes"] == 3, first
    lost = slurm.cluster.run("scontrol", "show", "hostnames", first["NodeList"]).split()[-1]
    with slurm.node_lost(lost, run_id):
        again = slurm.wait(
            run_id,
            "to go on in a job on two nodes",
            lambda r: r["attempt"] == 2 and len(r["jobs"]) == 2 and running_past(1)(r),
            timeout=180,
        )
        second = slurm.cluster.job(job_of(again)["job_id"])
        assert second["NumNodes"] == "2" and again["gang_nnodes"] == 2, second
        assert lost not in slurm.cluster.run("scontrol", "show", "hostnames", second["NodeList"])
        assert again["spec"]["batch"]["grad_accum_steps"] == 6  # the same global batch
        resizes = slurm.resizes(run_id, 1)
        assert [r[:2] for r in resizes] == [(3, 2)], resizes
        # From a whole checkpoint of the first job (a periodic one, or the drain's when
        # Slurm signalled the nodes left as it ended the job).
        listed = httpx.get(f"{slurm.url}/checkpoints?experiment=slurm-elastic", timeout=30)
        assert resizes[0][2] in {c["step"] for c in listed.json()["items"]}, resizes

        slurm.cluster.start_slurmd(lost)
        grown = slurm.wait(
            run_id,
            "to grow back in a job on three nodes",
            lambda r: len(r["jobs"]) == 3 and r["gang_nnodes"] == 3 and running_past(1)(r),
            timeout=180,
        )
        third = slurm.cluster.job(job_of(grown)["job_id"])
        assert third["NumNodes"] == "3", third
        # A gang's handing back is a new attempt (it fences the old members out) that uses
        # none of the run's: max_attempts grows with it. (Whether losing the node used one
        # is a race between Slurm's NODE_FAIL and the drain it signals to the nodes left.)
        grew = (grown["attempt"] - again["attempt"], grown["max_attempts"] - again["max_attempts"])
        assert grew == (1, 1), (again, grown)
        logs = [e.data for e in slurm.runs.events(run_id, type="log")]
        assert any("idle again" in d["message"] and "grow from 2 to 3" in d["message"]
                   for d in logs), logs  # fmt: skip
        resizes = slurm.resizes(run_id, 2)
        assert [r[:2] for r in resizes] == [(3, 2), (2, 3)], resizes


def test_a_time_limit_chains_jobs_without_costing_an_attempt_and_loses_no_bits(
    slurm: SlurmService,
) -> None:
    # Open-ended, both: the chained run is followed across a time limit and some steps past
    # it, then both are cancelled and their common steps compared.
    body = {**TINY, "steps": 100_000, "checkpoint_every": 100_000, "val_every": 100_000}
    chained = slurm.submit(**body, experiment="slurm-chain", slurm={"time_limit": "2"})["id"]
    whole = slurm.submit(**body, experiment="slurm-whole")["id"]
    try:
        resumed = slurm.wait(
            chained,
            "to go on in a second job past its drain",
            lambda r: (
                len(r["jobs"]) >= 2
                and r["jobs"][1]["claimed_at"] is not None
                and r["progress"]["step"] > drained_at(slurm, chained) + 20
            ),
            timeout=300,
        )
        assert resumed["attempt"] == 1, "a time limit cost an attempt"
        assert job_of(resumed, 0)["state"] in ("COMPLETED", "GONE"), resumed["jobs"]
        step = resumed["progress"]["step"]
        slurm.wait(whole, f"to pass step {step}", lambda r: r["progress"]["step"] >= step)
    finally:
        for run_id in (chained, whole):
            httpx.post(f"{slurm.url}/runs/{run_id}/cancel", timeout=30)
    assert {slurm.finished(chained)["state"], slurm.finished(whole)["state"]} == {"cancelled"}
    ours, theirs = slurm.train_losses(chained), slurm.train_losses(whole)
    # Both went on training until their cancels landed, by however much a loaded machine
    # let each: the steps they share are compared, and those reach past the drain.
    common = min(len(ours), len(theirs))
    assert common > drained_at(slurm, chained) + 20, (len(ours), len(theirs))
    assert ours[:common] == theirs[:common], "the chain changed the losses"


def drained_at(slurm: SlurmService, run_id: str) -> int:
    """The step of the run's first drain checkpoint (its time limit's); a large number
    until there is one."""
    for event in slurm.runs.events(run_id, type="log"):
        if event.data.get("checkpoint"):
            return int(event.data["checkpoint"]["step"])
    return 10**9


def test_scancel_drains_and_requeues_and_a_cancel_ends_the_run_and_its_job(
    slurm: SlurmService,
) -> None:
    body = {
        **TINY,
        "experiment": "slurm-scancel",
        "steps": 100_000,
        "checkpoint_every": 1000,
        "val_every": 100_000,
        "stragglers": {"avoid": True},
    }
    run_id = slurm.submit(**body)["id"]
    run = slurm.wait(run_id, "to train", running_past(3), timeout=120)
    first, node = job_of(run)["job_id"], job_of(run)["nodes"]
    # A straggler report naming the job's node, as rank 0 of a multi-process run writes it
    # (tests/worker/training/test_hangs.py makes one with real ranks): the next job keeps off.
    report = {"step": 3, "slowdowns": {"1": 0.5}, "nodes": {"1": node}, "avoid_nodes": [node]}
    slurm.runs.append_event(run_id, "log", {"level": "warning", "message": "slow",
                                            "straggler": report})  # fmt: skip
    assert slurm.get(run_id)["placement"]["avoid_nodes"] == [node]
    slurm.cluster.run("scancel", first)
    again = slurm.wait(
        run_id,
        "to run in a second job",
        lambda r: r["state"] == "running" and len(r["jobs"]) == 2 and r["jobs"][1]["claimed_at"],
        120,
    )
    assert again["attempt"] == 1, "an operator's scancel cost an attempt"
    reasons = [e.data["reason"] for e in slurm.runs.events(run_id, type="state")]
    assert "worker shutting down; the run continues later" in reasons, reasons
    listed = httpx.get(f"{slurm.url}/checkpoints?experiment=slurm-scancel", timeout=30)
    ckpts = listed.json()["items"]
    assert ckpts, "the drain saved no checkpoint"

    second = job_of(again)["job_id"]
    job = slurm.cluster.job(second)
    assert job["ExcNodeList"] == node and job["NodeList"] != node, job
    r = httpx.post(f"{slurm.url}/runs/{run_id}/cancel", timeout=30)
    assert r.status_code == 200, r.text
    assert slurm.finished(run_id)["state"] == "cancelled"
    poll(
        lambda: (
            slurm.cluster.run("squeue", "-h", "-j", second, "-o", "%T").strip()
            in ("", "COMPLETED", "CANCELLED")
        ),
        timeout=60,
        what=f"job {second} to end",
    )


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"extra": {"output": "/tmp/x"}}, "'output' is not one a run may set"),
        ({"extra": {"wrap": "rm -rf /"}}, "'wrap' is not one a run may set"),
        ({"partition": "debug; touch /tmp/pwned"}, "partition"),
        ({"partition": "$(id)"}, "partition"),
        ({"account": "a`b`"}, "account"),
        ({"nodes": 4}, "nodes"),
        ({"time_limit": "1"}, "leaves no time to train"),
        ({"time_limit": "soon"}, "time_limit"),
        ({"partition": "gpu"}, "'gpu': no such partition on this cluster (it has debug)"),
        ({}, "nnodes 4: partition 'debug' has 3 nodes"),
    ],
)
def test_options_outside_the_allow_list_are_a_422_that_names_them(
    slurm: SlurmService, options: dict[str, Any], named: str
) -> None:
    body = {**TINY, "experiment": "slurm-refused", "steps": 5, "slurm": options}
    if not options:
        body["nnodes"] = 4
    r = httpx.post(f"{slurm.url}/runs/train", json=body, timeout=30)
    assert r.status_code == 422, r.text
    assert named in r.text

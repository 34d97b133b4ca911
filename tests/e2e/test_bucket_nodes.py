"""Nodes that share nothing but PostgreSQL and a bucket, end to end on CPU (docs/scaling.md,
"Nodes without a shared disk").

The service and each worker ("node") have a data dir and a cache dir of their own; all of
them share a real PostgreSQL database and a bucket of the real S3 server, whose credentials
they take from the AWS environment. A prepare run on one node publishes its dataset in the
bucket; a 2-node FSDP gang trains on it, each rank reading it through its node's verified
cache and writing its shards of each checkpoint into the bucket; SIGKILL of the leader
requeues the gang, and a third node, whose data dir is empty, joins the survivor to resume
from the last checkpoint committed in the bucket. Nothing of either lives on any node's disk
but downloads in the caches.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.reliability.workers import Workers
from tests.support.databases import fresh_database
from tests.support.datasets import stdlib_documents
from tests.support.polling import poll
from tests.support.s3server import S3Server
from tests.support.service_process import Service, finished, submit
from tests.support.stores import s3_store
from trainctl.store.checkpoints.manifests import read_metadata
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.db.runs import RunStore

pytestmark = pytest.mark.slow
STEPS, CHECKPOINT_EVERY = 30, 10
PREFIX = "fleet"


class Fleet:
    """A service without workers and worker nodes, each with its own folders."""

    def __init__(self, root: Path, database_url: str, server: S3Server, bucket: str) -> None:
        self.root, self.database_url = root, database_url
        self.env = {
            "TRAINCTL_STORAGE_URL": f"s3://{bucket}/{PREFIX}",
            **server.environ(),
        }
        (root / "service").mkdir()
        self.service = Service(root / "service", workers=0)
        self.service.extra_env |= self.env | {
            "TRAINCTL_DATABASE_URL": database_url,
            "TRAINCTL_DATA_ROOTS": str(root / "inputs"),  # prepare's inputs: plain files
        }
        self.nodes: dict[str, Workers] = {}
        self.runs = RunStore(database_url)
        self.checkpoints: CheckpointStore = s3_store(
            server, bucket, root / "reader-cache", f"{PREFIX}/checkpoints"
        )

    def start_node(self, name: str) -> Path:
        """A worker `worker-<name>` on node `node-<name>`, with an empty data dir and cache
        dir of its own; its data dir."""
        data_dir = self.root / f"node-{name}"
        data_dir.mkdir()
        env = self.env | {"TRAINCTL_CACHE_DIR": str(self.root / f"cache-{name}")}
        self.nodes[name] = Workers(data_dir, self.database_url, env)
        self.nodes[name].start_node(f"worker-{name}", f"node-{name}", self.runs)
        return data_dir

    def worker(self, worker_id: str) -> Any:
        return self.nodes[worker_id.removeprefix("worker-")].procs[worker_id]

    def logs(self) -> str:
        return "\n".join(w.logs() for w in self.nodes.values())

    def close(self) -> None:
        for workers in self.nodes.values():
            workers.close()
        if self.service.process is not None and self.service.process.poll() is None:
            self.service.stop()
        self.runs.close()


@pytest.fixture
def fleet(request: pytest.FixtureRequest, tmp_path: Path, s3_server: S3Server) -> Iterator[Fleet]:
    (tmp_path / "inputs").mkdir()
    lines = [json.dumps({"text": text}) for text in stdlib_documents(60_000)]
    (tmp_path / "inputs" / "code.jsonl").write_text("\n".join(lines) + "\n")
    with fresh_database(request, "postgresql", tmp_path) as url:
        fleet = Fleet(tmp_path, url, s3_server, s3_server.new_bucket())
        try:
            fleet.service.start()
            yield fleet
        finally:
            fleet.close()


def test_a_gang_on_nodes_that_share_only_the_database_and_a_bucket_survives_a_kill(
    fleet: Fleet,
) -> None:
    node_a = fleet.start_node("a")
    prepare = submit(fleet.service, "prepare", name="code", inputs=["code.jsonl"])
    prepared = finished(fleet.service, prepare["id"], timeout=300)
    assert prepared["state"] == "succeeded", (prepared, fleet.logs())
    url = f"{fleet.env['TRAINCTL_STORAGE_URL']}/datasets/code"
    assert prepared["result"]["folder"] == url
    assert not list(node_a.glob("datasets/*")), "published, and nothing left on the node"

    fleet.start_node("b")
    body = {
        "experiment": "bucket-gang",
        "steps": STEPS,
        "nnodes": 2,
        "parallelism": {"strategy": "fsdp"},
        "model": {"preset": "tiny"},
        "data": {"source": "dataset", "dataset": "code"},
        "batch": {"micro_batch_size": 2, "seq_len": 32, "grad_accum_steps": 2},
        "checkpoint_every": CHECKPOINT_EVERY,
        "val_every": STEPS,
        "val_batches": 1,
        "device": "cpu",
        "max_attempts": 3,
    }
    nope = {**body, "data": {"source": "dataset", "dataset": "nope"}}
    missing = httpx.post(f"{fleet.service.url}/runs/train", json=nope, timeout=60)
    assert missing.status_code == 422 and "no dataset named 'nope'" in missing.text, missing.text
    run_id = submit(fleet.service, "train", **body)["id"]
    first = poll(
        lambda: fleet.checkpoints.latest_or_none("bucket-gang"),
        timeout=240,
        interval=0.05,
        what=f"the first checkpoint in the bucket; worker logs:\n{fleet.logs()}",
    )
    assert first.step < STEPS and first.sharded, "the run ended before the kill"
    leader = fleet.runs.get(run_id).worker_id
    assert leader is not None
    fleet.worker(leader).kill()  # the leader hosts the rendezvous: the hardest member to lose
    fleet.worker(leader).wait()
    poll(lambda: fleet.runs.get(run_id).attempt == 2, timeout=120, what="the gang requeued")
    node_c = fleet.start_node("c")  # an empty data dir: the dataset comes from the bucket
    run = finished(fleet.service, run_id, timeout=300)

    assert (run["state"], run["attempt"]) == ("succeeded", 2), (run, fleet.logs())
    logs = [e.data["message"] for e in fleet.runs.events(run_id, type="log")]
    resumed = [m for m in logs if "resuming from step_" in m]
    assert resumed and int(resumed[0].split("step_")[1].split()[0]) >= first.step, logs
    latest = fleet.checkpoints.latest_or_none("bucket-gang")
    assert latest is not None and latest.step == STEPS and latest.sharded
    meta = read_metadata(fleet.checkpoints.entry("bucket-gang", latest.tag))
    assert meta["dataset"]["folder"] == url  # the pin names the bucket, not a node's path
    for name in ("a", "b", "c"):  # every node read the shards through its own cache
        assert list((fleet.root / f"cache-{name}").rglob("train_*.bin")), name
    assert not list(node_c.glob("datasets/*")) and not list(node_c.glob("checkpoints/*"))

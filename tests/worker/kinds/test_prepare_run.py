"""A prepare run on the worker, against a real SQLite run store: published whole or not at all,
stopped and cancelled like any run, and started afresh by a retried attempt."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from tests.support.datasets import stdlib_documents, train_tokenizer
from tests.support.s3server import S3Server
from tests.support.stores import dataset_store
from trainctl.store.checkpoints.factory import open_stores
from trainctl.store.data.datasets import TOKENIZER_FILE, read_dataset
from trainctl.store.data.shards import DataError
from trainctl.store.db.records import Run
from trainctl.store.db.runs import RunStore
from trainctl.store.kinds.prepare import PreparePlan, PrepareRequest, resolve_prepare
from trainctl.store.layout import DataLayout
from trainctl.worker.context import RunContext
from trainctl.worker.executor import WorkerEnv
from trainctl.worker.kinds.prepare import execute_prepare

TEXTS = stdlib_documents(150_000)
WORKER = "worker-1"


@pytest.fixture
def runs(runs: RunStore) -> RunStore:
    """tests/conftest.py's, with this file's worker registered."""
    runs.workers.register(WORKER, host="test", pid=1, device="cpu", info={})
    return runs


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A data root with a JSONL corpus and a tokenizer trained on the same text."""
    root = tmp_path / "roots"
    (root / "corpus").mkdir(parents=True)
    lines = [json.dumps({"text": text}) for text in TEXTS]
    (root / "corpus" / "code.jsonl").write_text("\n".join(lines) + "\n")
    train_tokenizer(root / "tok" / TOKENIZER_FILE, TEXTS, 300)
    return root


def datasets(tmp_path: Path) -> Path:
    """The datasets of the data dir `tmp_path`, the service's and its worker's."""
    return tmp_path / "datasets"


def plan(tmp_path: Path, root: Path, **request: object) -> PreparePlan:
    body = {"name": "code", "inputs": ["corpus"], "tokenizer": "tok", "workers": 1, **request}
    return resolve_prepare(
        PrepareRequest.model_validate(body), data_roots=[root], datasets=dataset_store(tmp_path)
    )


def claim(runs: RunStore, prepare: PreparePlan) -> Run:
    runs.enqueue("prepare", prepare.filed_under, prepare.model_dump(mode="json"))
    run = runs.claim(WORKER, lease_seconds=60)
    assert run is not None
    return run


def context(runs: RunStore, run: Run, shutdown: threading.Event | None = None) -> RunContext:
    return RunContext(run, runs, WORKER, shutdown or threading.Event(), lease_seconds=60)


def leftovers(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in datasets(tmp_path).iterdir())


def test_a_prepare_run_publishes_its_dataset_and_reports_its_progress(
    runs: RunStore, tmp_path: Path, root: Path
) -> None:
    run = claim(runs, plan(tmp_path, root))

    outcome = execute_prepare(context(runs, run), WorkerEnv(open_stores(DataLayout(tmp_path))))

    assert outcome.state == "succeeded" and outcome.result is not None
    dataset = read_dataset(datasets(tmp_path) / "code")
    assert outcome.result["tokens"] == sum(s.tokens for s in dataset.splits.values()) > 0
    assert outcome.result["documents"] == len(TEXTS)
    assert (outcome.result["tokenizer"], outcome.result["vocab_size"]) == ("bpe", 300)
    assert dataset.tokenizer.sha256 == outcome.result["tokenizer_sha256"]
    assert (datasets(tmp_path) / "code" / TOKENIZER_FILE).read_bytes() == (
        root / "tok" / TOKENIZER_FILE
    ).read_bytes()
    progress = [e.data for e in runs.events(run.id, type="metrics")]
    assert progress and progress[-1]["kind"] == "prepare"
    assert progress[-1]["documents"] == len(TEXTS) and progress[-1]["tokens_per_sec"] > 0
    assert runs.get(run.id).progress["step"] == len(TEXTS)
    assert leftovers(tmp_path) == ["code"]  # no attempt's folder is left beside it


def test_a_prepare_stopped_by_a_worker_shutdown_leaves_nothing_and_is_requeued(
    runs: RunStore, tmp_path: Path, root: Path
) -> None:
    run = claim(runs, plan(tmp_path, root))
    shutdown = threading.Event()
    shutdown.set()

    outcome = execute_prepare(
        context(runs, run, shutdown), WorkerEnv(open_stores(DataLayout(tmp_path)))
    )

    assert outcome.state == "requeue"
    assert leftovers(tmp_path) == []


def test_a_cancelled_prepare_leaves_nothing(runs: RunStore, tmp_path: Path, root: Path) -> None:
    run = claim(runs, plan(tmp_path, root))
    runs.request_cancel(run.id)

    outcome = execute_prepare(context(runs, run), WorkerEnv(open_stores(DataLayout(tmp_path))))

    assert outcome.state == "cancelled"
    assert leftovers(tmp_path) == []


def test_a_retried_attempt_starts_afresh_from_what_a_killed_one_left(
    runs: RunStore, tmp_path: Path, root: Path
) -> None:
    first = claim(runs, plan(tmp_path, root))
    killed = datasets(tmp_path) / f".prepare-code-{first.id}-1"  # as a kill -9 leaves it
    killed.mkdir(parents=True)
    (killed / "train_000000.bin").write_bytes(b"half a shard")
    runs.fail_worker_runs(WORKER, "worker died")
    retried = runs.claim(WORKER, lease_seconds=60)
    assert retried is not None and retried.attempt == 2

    outcome = execute_prepare(context(runs, retried), WorkerEnv(open_stores(DataLayout(tmp_path))))

    assert outcome.state == "succeeded"
    assert leftovers(tmp_path) == ["code"]
    assert read_dataset(datasets(tmp_path) / "code").splits["train"].tokens > 0


def test_an_attempt_reports_the_dataset_its_predecessor_published_before_dying(
    runs: RunStore, tmp_path: Path, root: Path
) -> None:
    first = claim(runs, plan(tmp_path, root))
    published = execute_prepare(context(runs, first), WorkerEnv(open_stores(DataLayout(tmp_path))))
    runs.fail_worker_runs(WORKER, "worker died before it reported the run")
    retried = runs.claim(WORKER, lease_seconds=60)
    assert retried is not None

    outcome = execute_prepare(context(runs, retried), WorkerEnv(open_stores(DataLayout(tmp_path))))

    assert outcome.state == "succeeded" and outcome.result is not None
    assert published.result is not None
    assert outcome.result["tokens"] == published.result["tokens"]


def test_a_dataset_made_by_someone_else_since_submit_is_not_replaced(
    runs: RunStore, tmp_path: Path, root: Path
) -> None:
    run = claim(runs, plan(tmp_path, root))
    (datasets(tmp_path) / "code").mkdir(parents=True)
    (datasets(tmp_path) / "code" / "theirs.txt").write_text("not ours to delete")

    with pytest.raises(DataError, match="that this run did not make"):
        execute_prepare(context(runs, run), WorkerEnv(open_stores(DataLayout(tmp_path))))

    assert (datasets(tmp_path) / "code" / "theirs.txt").exists()


def test_a_strict_prepare_fails_on_a_bad_line_and_leaves_nothing(
    runs: RunStore, tmp_path: Path, root: Path
) -> None:
    with open(root / "corpus" / "code.jsonl", "a") as f:
        f.write("{not json\n")
    run = claim(runs, plan(tmp_path, root, strict=True))

    with pytest.raises(DataError, match="strict"):
        execute_prepare(context(runs, run), WorkerEnv(open_stores(DataLayout(tmp_path))))

    assert leftovers(tmp_path) == []


def test_a_prepare_into_a_bucket_uploads_its_dataset_and_a_retry_reports_it(
    runs: RunStore,
    tmp_path: Path,
    root: Path,
    s3_server: S3Server,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in s3_server.environ().items():
        monkeypatch.setenv(name, value)
    url = f"s3://{s3_server.new_bucket()}/fleet"
    env = WorkerEnv(open_stores(DataLayout(tmp_path, url, tmp_path / "cache")))
    request = PrepareRequest(name="code", inputs=["corpus"], tokenizer="tok", workers=1)
    planned = resolve_prepare(request, data_roots=[root], datasets=env.stores.datasets)
    first = claim(runs, planned)

    published = execute_prepare(context(runs, first), env)

    assert published.state == "succeeded" and published.result is not None
    assert published.result["folder"] == f"{url}/datasets/code"
    assert leftovers(tmp_path) == []  # prepared on this node's disk, and nothing left there
    listed = env.stores.datasets.read("code")
    assert listed.dataset.splits["train"].tokens == published.result["train_tokens"] > 0
    runs.fail_worker_runs(WORKER, "worker died before it reported the run")
    retried = runs.claim(WORKER, lease_seconds=60)
    assert retried is not None
    outcome = execute_prepare(context(runs, retried), env)
    assert outcome.state == "succeeded" and outcome.result is not None
    assert outcome.result["tokens"] == published.result["tokens"]

"""What only an object store can do wrong (docs/design/checkpoints.md, "Object storage"): a commit
without rename, saves killed mid-upload, multipart uploads, the download cache, and a bucket
that refuses our credentials. Against a real S3 server (tests/support/s3server.py); the store's own
tests run on it too (tests/store/checkpoints/test_checkpoints.py)."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.support.s3server import S3Server
from tests.support.soak import rounds as soak_rounds
from tests.support.stores import race_commits, rewrite, s3_store
from trainctl.store.checkpoints.factory import open_stores
from trainctl.store.checkpoints.manifests import (
    MANIFEST_FILE,
    METADATA_FILE,
    MODEL_FILE,
    OPTIMIZER_FILE,
    verify_manifest,
)
from trainctl.store.checkpoints.posix import PosixStorage
from trainctl.store.checkpoints.s3 import S3Storage, parse_url
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.db.guards import GuardLeases
from trainctl.store.db.runs import RunStore
from trainctl.store.exceptions import CheckpointCorrupt, StorageUnavailable
from trainctl.store.layout import DataLayout
from trainctl.store.names import BEST_TAG, step_tag

MiB = 1024 * 1024


@pytest.fixture
def bucket(s3_server: S3Server) -> str:
    return s3_server.new_bucket()


@pytest.fixture
def store(s3_server: S3Server, bucket: str, tmp_path: Path) -> CheckpointStore:
    return s3_store(s3_server, bucket, tmp_path / "cache")


def storage_of(store: CheckpointStore) -> S3Storage:
    assert isinstance(store.storage, S3Storage)
    return store.storage


def keys(server: S3Server, bucket: str) -> list[str]:
    listed = server.client().list_objects_v2(Bucket=bucket).get("Contents", [])
    return sorted(obj["Key"] for obj in listed)


def save(store: CheckpointStore, experiment: str, step: int, weights: bytes = b"w") -> None:
    with store.stage(experiment, step_tag(step)) as staged:
        staged.write(MODEL_FILE, weights)
        staged.write(OPTIMIZER_FILE, b"optimizer state")
        staged.write(METADATA_FILE, json.dumps({"step": step, "run_id": "run-1"}).encode())
        staged.commit()


def test_the_manifest_is_the_commit_marker_under_the_tags_prefix(
    store: CheckpointStore, s3_server: S3Server, bucket: str
) -> None:
    save(store, "exp", 1)
    found = keys(s3_server, bucket)
    assert "ckpt/exp/step_1/manifest.json" in found
    files = [k for k in found if k.startswith("ckpt/exp/step_1/.")]
    assert sorted(k.rsplit("/", 1)[1] for k in files) == [METADATA_FILE, MODEL_FILE, OPTIMIZER_FILE]


def test_a_save_killed_mid_upload_is_never_listed_and_the_next_save_sweeps_it(
    store: CheckpointStore, s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    save(store, "exp", 1)
    # Another process's save dies between two uploads: no abort, no manifest.
    killed = s3_store(s3_server, bucket, tmp_path / "other-cache")
    staged = killed.stage("exp", "step_2")
    staged.write(MODEL_FILE, b"uploaded before the kill")
    staged.create(OPTIMIZER_FILE).write(b"never closed")
    assert [i.tag for i in store.list_checkpoints("exp")] == ["step_1"]
    assert store.latest("exp").tag == "step_1"
    assert any(k.startswith("ckpt/exp/step_2/.") for k in keys(s3_server, bucket))

    save(store, "exp", 3)
    assert not any(k.startswith("ckpt/exp/step_2/") for k in keys(s3_server, bucket))
    assert [i.tag for i in store.list_checkpoints("exp")] == ["step_1", "step_3"]


def test_a_young_save_of_another_process_is_spared_by_the_sweep(
    s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    store = s3_store(s3_server, bucket, tmp_path / "cache", stale_after=3600.0)
    other = s3_store(s3_server, bucket, tmp_path / "other-cache")
    staged = other.stage("exp", "step_2")  # still uploading, in another process
    staged.write(MODEL_FILE, b"in flight")
    save(store, "exp", 1)
    assert store.cleanup("exp") == []  # another node's writer may run while this one starts
    assert any(k.startswith("ckpt/exp/step_2/.") for k in keys(s3_server, bucket))


def test_a_large_file_goes_up_in_parallel_parts_and_reads_back_whole(
    s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    store = s3_store(s3_server, bucket, tmp_path / "cache", part_bytes=5 * MiB)
    weights = os.urandom(11 * MiB + 3)
    with store.stage("exp", "step_1") as staged:
        sink = staged.create(MODEL_FILE)
        for start in range(0, len(weights), 3 * MiB):  # writes that straddle the parts
            sink.write(weights[start : start + 3 * MiB])
        sink.close()
        import hashlib

        staged.commit({MODEL_FILE: hashlib.sha256(weights).hexdigest()})
    head = s3_server.client().head_object(Bucket=bucket, Key=keys(s3_server, bucket)[1])
    assert head["ETag"].strip('"').endswith("-3")  # three parts: 5 + 5 + 1 MiB
    verify_manifest(store.entry("exp", "step_1"))
    with store.entry("exp", "step_1").open(MODEL_FILE) as reader:
        assert reader.size == len(weights)
        assert reader.local_path is not None
        assert Path(reader.local_path).read_bytes() == weights


def test_cleanup_aborts_the_multipart_upload_of_a_killed_save(
    store: CheckpointStore, s3_server: S3Server, bucket: str
) -> None:
    storage = storage_of(store)
    storage.part_bytes = 5 * MiB
    staged = store.stage("exp", "step_1")
    staged.create(MODEL_FILE).write(os.urandom(6 * MiB))  # one part up, then killed
    assert s3_server.client().list_multipart_uploads(Bucket=bucket).get("Uploads")
    store.cleanup()
    assert not s3_server.client().list_multipart_uploads(Bucket=bucket).get("Uploads")


def test_a_delete_cut_short_after_the_manifest_shows_nothing_and_cleanup_finishes_it(
    store: CheckpointStore, s3_server: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    save(store, "exp", 1)
    save(store, "exp", 2)

    def killed(*args: Any) -> None:
        raise RuntimeError("killed after the manifest went")

    with monkeypatch.context() as patch:
        patch.setattr(storage_of(store), "remove_generation", killed)
        with pytest.raises(RuntimeError):
            store.delete("exp", "step_1")
    assert [i.tag for i in store.list_checkpoints("exp")] == ["step_2"]
    assert [swept[1].split("/")[0] for swept in store.cleanup()] == ["step_1"]
    assert not any(k.startswith("ckpt/exp/step_1/") for k in keys(s3_server, bucket))


def test_a_replacing_commit_leaves_only_the_new_generation(
    store: CheckpointStore, s3_server: S3Server, bucket: str
) -> None:
    for weights in (b"first", b"second", b"third"):
        with store.stage("exp", BEST_TAG) as staged:
            staged.write(MODEL_FILE, weights)
            staged.commit()
    best = [k for k in keys(s3_server, bucket) if k.startswith(f"ckpt/exp/{BEST_TAG}/")]
    assert len(best) == 2  # the manifest, and the one file of the generation it names
    with store.entry("exp", BEST_TAG).open(MODEL_FILE) as reader:
        assert reader.read() == b"third"


def test_readers_never_see_a_replaced_best_half_done(
    store: CheckpointStore, s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    """Readers here and in another process (no lock shared) while `best` is replaced."""
    rounds = soak_rounds(8)
    with store.stage("exp", BEST_TAG) as staged:
        staged.write(MODEL_FILE, b"0" * 64)
        staged.commit()
    failures: list[BaseException] = []
    done = threading.Event()
    checked = 0

    def read(reader: CheckpointStore) -> None:
        nonlocal checked
        while not done.is_set():
            try:
                with reader.storage.reading("exp"):
                    verify_manifest(reader.entry("exp", BEST_TAG))
                checked += 1
            except CheckpointCorrupt as exc:
                # Another process's replace removed the generation this reader's manifest
                # named: missing, as a deleted checkpoint is; never a mix of two saves.
                if reader is store or "missing" not in str(exc):
                    failures.append(exc)
                    return
            except BaseException as exc:
                failures.append(exc)
                return

    other = s3_store(s3_server, bucket, tmp_path / "other-cache")
    readers = [threading.Thread(target=read, args=(r,)) for r in (store, other)]
    for thread in readers:
        thread.start()
    try:
        for n in range(1, rounds + 1):
            with store.stage("exp", BEST_TAG) as staged:
                staged.write(MODEL_FILE, str(n % 10).encode() * (64 + n))
                staged.commit()
    finally:
        done.set()
        for thread in readers:
            thread.join()
    assert failures == [] and checked > 0


def test_a_download_is_cached_only_when_it_matches_its_manifest(
    store: CheckpointStore, tmp_path: Path
) -> None:
    save(store, "exp", 1, weights=b"\x00" * 64)
    save(store, "exp", 2, weights=b"\x00" * 64)
    rewrite(store, "exp", "step_2", {MODEL_FILE: b"\x00" * 63 + b"\x01"})  # same size
    shutil.rmtree(tmp_path / "cache")  # what rewrite read (a generation now gone) with it
    for tag in ("step_1", "step_2"):
        with store.entry("exp", tag).open(MODEL_FILE) as reader:
            reader.read()
    cached = sorted(p.relative_to(tmp_path / "cache") for p in (tmp_path / "cache").rglob("*.*"))
    assert [p.parts[2] for p in cached if p.name == MODEL_FILE] == ["step_1"]
    assert store.get("exp", "step_2").tag == "step_2"  # listed: only the hash is wrong
    assert verify_manifest(store.entry("exp", "step_1"), deep=True) is not None


def test_the_cache_evicts_the_least_recently_used_files(
    store: CheckpointStore, tmp_path: Path
) -> None:
    storage = storage_of(store)
    for step in (1, 2, 3):
        save(store, "exp", step, weights=bytes([step]) * 1000)
    storage.cache.max_bytes = 2500
    for step in (1, 2, 3):
        with store.entry("exp", step_tag(step)).open(MODEL_FILE) as reader:
            assert reader.read() == bytes([step]) * 1000
    left = sorted(p.parent.parent.name for p in (tmp_path / "cache").rglob(MODEL_FILE))
    assert left == ["step_2", "step_3"]


def test_the_stores_of_a_cache_dir_share_one_budget_and_leave_other_files_alone(
    s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    """TRAINCTL_CACHE_BYTES bounds the whole cache dir: checkpoints and exports (two places)
    evict each other's files, least recently used first; a file of the operator's in that
    folder is neither counted nor removed."""
    cache = tmp_path / "scratch"
    (cache / "notes").mkdir(parents=True)
    (cache / "notes" / "keep.bin").write_bytes(b"n" * 10_000)
    ckpts, exports = (
        s3_store(s3_server, bucket, cache, prefix=name, max_cache_bytes=2500)
        for name in ("checkpoints", "exports")
    )
    for store, step in ((ckpts, 1), (exports, 2), (ckpts, 3)):
        save(store, "exp", step, weights=bytes([step]) * 1000)
        with store.entry("exp", step_tag(step)).open(MODEL_FILE) as reader:
            assert reader.read() == bytes([step]) * 1000
    left = sorted(p.parent.parent.name for p in cache.rglob(MODEL_FILE))
    assert left == ["step_2", "step_3"]  # step_1's was the oldest, of the other store
    assert (cache / "notes" / "keep.bin").stat().st_size == 10_000


def test_the_cache_budget_reaches_every_store_from_the_settings(
    s3_server: S3Server, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in s3_server.environ().items():
        monkeypatch.setenv(name, value)
    layout = DataLayout(tmp_path, f"s3://{bucket}/team", tmp_path / "cache", cache_bytes=12345)
    stores = open_stores(layout)
    assert stores.datasets is not None
    for storage in (stores.checkpoints.storage, stores.exports.storage, stores.datasets.storage):
        assert isinstance(storage, S3Storage)
        assert storage.cache.max_bytes == 12345 and storage.cache.shared == tmp_path / "cache"


def test_wrong_credentials_name_the_bucket_never_the_secret(
    s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    wrong = "not-the-secret-" + "x" * 20
    storage = S3Storage(
        bucket, "ckpt", cache_dir=tmp_path, client=s3_server.client(secret_key=wrong)
    )
    store = CheckpointStore(storage)
    for attempt in (store.list_checkpoints, lambda: store.stage("exp", "step_1")):
        with pytest.raises(StorageUnavailable, match=f"bucket '{bucket}' refused") as caught:
            attempt()
        message = str(caught.value)
        assert "SignatureDoesNotMatch" in message and "AWS_ACCESS_KEY_ID" in message
        assert wrong not in message and s3_server.secret_key not in message
        assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_a_missing_bucket_is_named_with_what_to_fix(s3_server: S3Server, tmp_path: Path) -> None:
    store = CheckpointStore(
        S3Storage("no-such-bucket", "", cache_dir=tmp_path, client=s3_server.client())
    )
    with pytest.raises(StorageUnavailable, match="bucket 'no-such-bucket' does not exist"):
        store.list_checkpoints()


def test_the_storage_url_selects_the_bucket_and_unset_keeps_the_folders(
    s3_server: S3Server, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert isinstance(open_stores(DataLayout(tmp_path)).checkpoints.storage, PosixStorage)
    for name, value in s3_server.environ().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    stores = open_stores(DataLayout(tmp_path, f"s3://{bucket}/team/a", tmp_path / "cache"))
    save(stores.checkpoints, "exp", 1)
    assert [i.tag for i in stores.checkpoints.list_checkpoints()] == ["step_1"]
    assert stores.exports.list_checkpoints() == []
    assert "team/a/checkpoints/exp/step_1/manifest.json" in keys(s3_server, bucket)
    assert stores.checkpoints.describe("exp") == f"s3://{bucket}/team/a/checkpoints/exp"


@pytest.mark.parametrize("url", ["s3://", "s3:///prefix", "gs://bucket", "bucket/prefix"])
def test_a_storage_url_that_names_no_bucket_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="expected s3://bucket"):
        parse_url(url)


def test_a_storage_url_splits_into_bucket_and_prefix() -> None:
    assert parse_url("s3://b") == ("b", "")
    assert parse_url("s3://b/team/runs/") == ("b", "team/runs")


def test_the_guard_is_a_lease_that_excludes_another_process_sharing_the_database(
    s3_server: S3Server, bucket: str, tmp_path: Path, database_url: str
) -> None:
    runs = RunStore(database_url)
    runs.create_all()
    here, there = (
        s3_store(s3_server, bucket, tmp_path / name, leases=GuardLeases(runs.engine))
        for name in ("here", "there")
    )  # two processes: each its own holder
    with here.guard("exp"):
        with here.guard("exp"):  # re-entrant
            assert not takes_guard(there, "exp")
        assert not takes_guard(there, "exp")
        assert takes_guard(there, "other")  # one lease per experiment
    assert takes_guard(there, "exp", timeout=10)
    all_taken()
    runs.close()


def test_the_lease_of_a_killed_holder_runs_out(
    s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    runs = RunStore(f"sqlite:///{tmp_path / 'runs.db'}")
    runs.create_all()
    killed = GuardLeases(runs.engine, lease_seconds=0.5)
    store = s3_store(s3_server, bucket, tmp_path / "cache", leases=GuardLeases(runs.engine))
    killed.take(store.describe("exp"))  # and never released: its process died
    assert not takes_guard(store, "exp", timeout=0.2)
    assert takes_guard(store, "exp", timeout=10)
    all_taken()
    runs.close()


TAKERS: list[threading.Thread] = []


def takes_guard(store: CheckpointStore, experiment: str, timeout: float = 0.3) -> bool:
    """Whether another thread takes the guard within `timeout` (then lets it go; the test
    waits for every such thread before it closes the database: `all_taken`)."""
    done = threading.Event()

    def take() -> None:
        with store.guard(experiment):
            done.set()

    TAKERS.append(threading.Thread(target=take, daemon=True))
    TAKERS[-1].start()
    return done.wait(timeout)


def all_taken() -> None:
    while TAKERS:
        TAKERS.pop().join(timeout=30)


def test_the_manifest_object_is_what_the_store_wrote(store: CheckpointStore) -> None:
    save(store, "exp", 1)
    with store.entry("exp", "step_1").open(MANIFEST_FILE) as reader:
        manifest = json.loads(reader.read())
    assert [f["name"] for f in manifest["files"]] == [MODEL_FILE, OPTIMIZER_FILE, METADATA_FILE]


def test_two_processes_committing_one_new_tag_at_once_are_refused_one_against_the_other(
    s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    """S3's conditional write decides (`S3Storage.commit`): each round exactly one process
    wins, the other gets FileExistsError, the winner's files are whole, the loser's gone."""
    rounds = soak_rounds(12)
    spawn = multiprocessing.get_context("spawn")
    barrier, results = spawn.Barrier(2), spawn.Queue()
    server = (s3_server.endpoint, s3_server.access_key, s3_server.secret_key)
    racers = [
        spawn.Process(
            target=race_commits,
            args=(server, bucket, tmp_path / who, who, rounds, barrier, results),
        )
        for who in ("a", "b")
    ]
    for racer in racers:
        racer.start()
    outcomes = [results.get(timeout=120) for _ in range(2 * rounds)]
    for racer in racers:
        racer.join(timeout=60)
        assert racer.exitcode == 0

    store = s3_store(s3_server, bucket, tmp_path / "reader")
    found = keys(s3_server, bucket)
    for n in range(rounds):
        these = sorted((how, who) for who, m, how in outcomes if m == n)
        assert [how for how, _ in these] == ["exists", "won"], these
        winner = these[1][1]
        tag = step_tag(n)
        verify_manifest(store.entry("race", tag))
        with store.entry("race", tag).open(MODEL_FILE) as reader:
            assert reader.read() == f"{winner} {n}".encode()
        generations = {k.split("/")[3] for k in found if k.startswith(f"ckpt/race/{tag}/.")}
        assert len(generations) == 1, generations  # the loser's save is gone

"""A bucket is any S3-compatible store, and what it holds is input (docs/design/checkpoints.md,
"Object storage"). On two real servers that differ where such stores do, SeaweedFS and
`rclone serve s3` (which keeps user metadata in memory only, and answers a listing of no
multipart uploads with NoSuchUpload): a commit reads back from the objects and their keys
alone, across a restart of the server; and an object planted in the bucket, whatever it
claims, never names a local path and never fails a listing."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from tests.support.s3server import S3Server
from tests.support.stores import manifest_of, s3_store
from trainctl.store.checkpoints.manifests import MANIFEST_FILE, METADATA_FILE, MODEL_FILE
from trainctl.store.checkpoints.s3 import S3Storage
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.exceptions import CheckpointNotFound
from trainctl.store.names import step_tag


@pytest.fixture(params=["s3_server", "rclone_server"])
def server(request: pytest.FixtureRequest) -> S3Server:
    found: S3Server = request.getfixturevalue(request.param)
    return found


def save(store: CheckpointStore, experiment: str, step: int) -> None:
    with store.stage(experiment, step_tag(step)) as staged:
        staged.write(MODEL_FILE, b"weights %d" % step)
        staged.write(METADATA_FILE, json.dumps({"step": step, "run_id": "run-1"}).encode())
        staged.commit()


def test_checkpoints_are_listed_and_read_after_the_server_restarts(
    server: S3Server, tmp_path: Path
) -> None:
    bucket = server.new_bucket()
    store = s3_store(server, bucket, tmp_path / "cache")
    save(store, "exp", 1)
    save(store, "exp", 2)
    save(store, "exp", 2)  # a replace: the newer generation is the one read back

    server.restart()
    reader = s3_store(server, bucket, tmp_path / "other-cache")  # nothing cached

    assert [i.tag for i in reader.list_checkpoints()] == ["step_1", "step_2"]
    assert reader.latest("exp").step == 2
    with reader.entry("exp", "step_2").open(MODEL_FILE) as f:
        assert f.read() == b"weights 2"
    save(reader, "exp", 3)  # writes go on: its cleanup and sweep read the bucket too
    assert reader.cleanup() == []
    assert [i.tag for i in reader.list_checkpoints()] == ["step_1", "step_2", "step_3"]


def test_cleanup_with_no_multipart_upload_in_progress_finds_nothing_to_abort(
    server: S3Server, tmp_path: Path
) -> None:
    store = s3_store(server, server.new_bucket(), tmp_path / "cache")
    save(store, "exp", 1)
    assert store.cleanup() == []
    assert store.latest("exp").step == 1


def plant_marker(server: S3Server, bucket: str, tag: str, *, generation: str, body: bool) -> None:
    """A manifest object in the bucket naming `generation`: in its body (the layout trainctl
    writes) or in its user metadata (the first layout's), with a file under that name."""
    files = {MODEL_FILE: b"planted", METADATA_FILE: b'{"step": 9}'}
    manifest = manifest_of(files)
    key = f"ckpt/exp/{tag}/{MANIFEST_FILE}"
    client = server.client()
    if body:
        marker = b"trainctl-commit 1 " + generation.encode() + b" 1.0\n" + manifest
        client.put_object(Bucket=bucket, Key=key, Body=marker)
    else:
        meta = {"trainctl-generation": generation, "trainctl-committed-at": "1.0"}
        client.put_object(Bucket=bucket, Key=key, Body=manifest, Metadata=meta)


PLANTED = ["../../../../escaped", "../../other", "/abs/escaped", "..", "a/b", "0" * 31 + "/"]


@pytest.mark.parametrize("body", [True, False], ids=["in-body", "in-metadata"])
@pytest.mark.parametrize("generation", PLANTED)
def test_a_planted_generation_never_reaches_the_filesystem_nor_fails_the_listing(
    server: S3Server, tmp_path: Path, generation: str, body: bool, caplog: pytest.LogCaptureFixture
) -> None:
    bucket = server.new_bucket()
    cache = tmp_path / "deep" / "down" / "cache"
    cache.mkdir(parents=True)
    store = s3_store(server, bucket, cache)
    save(store, "exp", 1)
    plant_marker(server, bucket, "step_9", generation=generation.replace("/abs", str(tmp_path)),
                 body=body)  # fmt: skip
    before = {p for p in tmp_path.rglob("*") if not p.is_relative_to(cache)}

    with caplog.at_level(logging.WARNING):
        listed = [i.tag for i in store.list_checkpoints()]
        assert store.latest("exp").tag == "step_1"
        with pytest.raises(CheckpointNotFound):
            store.get("exp", "step_9")

    assert listed == ["step_1"]  # the planted entry skipped, the others listed
    assert any("step_9" in r.getMessage() for r in caplog.records)  # and reported
    after = {p for p in tmp_path.rglob("*") if not p.is_relative_to(cache)}
    assert after == before, "a path outside the cache dir was made from the bucket's word"
    assert not any("escaped" in p.name or "other" == p.name for p in cache.rglob("*"))
    storage = store.storage
    assert isinstance(storage, S3Storage)
    with pytest.raises(FileNotFoundError):
        storage.url("exp", "step_9", MODEL_FILE, 60)  # no URL of a key of its choosing

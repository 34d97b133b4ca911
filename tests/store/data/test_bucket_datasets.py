"""Prepared datasets in a bucket (store.data.bucket.DatasetStore over S3), against the real S3
server: published with the manifest last, pinned at submit from the manifest alone, read by a
node with an empty data dir through the verified cache, and kept readable while the cache
evicts them."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.datasets import stdlib_texts, train_tokenizer, write_bpe_dataset
from tests.support.s3server import S3Server
from trainctl.store.checkpoints.s3 import S3Storage
from trainctl.store.data.bucket import DatasetStore
from trainctl.store.data.contents import dataset_arrays
from trainctl.store.data.datasets import TOKENIZER_FILE, Dataset
from trainctl.store.data.pins import data_codec
from trainctl.store.data.shards import DataError, read_shard
from trainctl.store.exceptions import DatasetExists, InvalidRequest
from trainctl.store.kinds.prepare import PrepareRequest, resolve_prepare
from trainctl.store.kinds.train import TrainRequest, resolve_train
from trainctl.store.plans import DatasetPin
from trainctl.store.kinds.prepare import PrepareRequest, resolve_prepare
from trainctl.store.kinds.train import TrainRequest, resolve_train

TEXTS = stdlib_texts(60_000)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    """A finished dataset folder, as a prepare run leaves it before publishing."""
    root = tmp_path_factory.mktemp("prepared")
    tokenizer = train_tokenizer(root / "tok" / TOKENIZER_FILE, TEXTS, 300)
    return write_bpe_dataset(root / "code", tokenizer, TEXTS, val_docs=3)


def shelf(server: S3Server, bucket: str, cache: Path, **options: Any) -> DatasetStore:
    """A node's view of the bucket: its own cache dir."""
    storage = S3Storage(bucket, "fleet", cache_dir=cache, client=server.client(), **options)
    return DatasetStore(storage)


@pytest.fixture
def bucket(s3_server: S3Server) -> str:
    return s3_server.new_bucket()


def keys(server: S3Server, bucket: str) -> list[str]:
    return [o["Key"] for o in server.client().list_objects_v2(Bucket=bucket).get("Contents", [])]


def arrays(dataset: Dataset) -> list[np.ndarray]:
    return [read_shard(p) for split in ("train", "val") for p in dataset.shard_paths(split)]


def same_tokens(mapped: list[np.ndarray], local: Dataset) -> None:
    for got, want in zip(mapped, arrays(local), strict=True):
        assert np.array_equal(got, want)


def test_a_published_dataset_is_pinned_from_its_manifest_and_read_on_another_node(
    s3_server: S3Server, bucket: str, local: Dataset, tmp_path: Path
) -> None:
    shelf(s3_server, bucket, tmp_path / "prepare-node").publish(local.folder, "code")
    assert "fleet/datasets/code/manifest.json" in keys(s3_server, bucket)

    service = shelf(s3_server, bucket, tmp_path / "service")
    data = {"source": "dataset", "dataset": "code"}
    plan = resolve_train(
        # samples: the prompts are encoded with the dataset's tokenizer.json, from the bucket
        TrainRequest(steps=10, data=data, sample_every=5, sample_prompts=["def main("]),
        cuda_available=False,
        data_roots=[],
        datasets=service,
    )
    url = f"s3://{bucket}/fleet/datasets/code"
    assert plan.data.dataset == url and plan.dataset is not None and plan.dataset.folder == url
    assert plan.dataset.tokenizer.sha256 == local.tokenizer.sha256
    # the service counted the tokens from the manifest's sizes, without the shards
    assert service.read("code").token_arrays() == dataset_arrays(local, "data")
    assert not list((tmp_path / "service").rglob("*.bin"))
    assert data_codec(plan.data, plan.dataset, service) is not None

    with closing(shelf(s3_server, bucket, tmp_path / "train-node").fetch("code")) as fetched:
        assert DatasetPin.of(fetched) == plan.dataset
        same_tokens(arrays(fetched), local)


def test_a_dataset_stays_readable_while_the_cache_evicts_its_files(
    s3_server: S3Server, bucket: str, local: Dataset, tmp_path: Path
) -> None:
    shelf(s3_server, bucket, tmp_path / "a").publish(local.folder, "code")
    # A cache of one byte keeps nothing but the file just downloaded: every download evicts
    # the files fetched before it, which the run still maps.
    with closing(shelf(s3_server, bucket, tmp_path / "node", max_cache_bytes=1).fetch("code")) as d:
        cached = [p for p in (tmp_path / "node").rglob("*") if p.is_file()]
        assert len(cached) == 1, "the cache evicted all but the last download"
        mapped = arrays(d)
    same_tokens(mapped, local)  # the readers closed: the mappings hold the bytes


def test_a_damaged_object_is_refused_by_its_manifest(
    s3_server: S3Server, bucket: str, local: Dataset, tmp_path: Path
) -> None:
    shelf(s3_server, bucket, tmp_path / "a").publish(local.folder, "code")
    [shard] = [k for k in keys(s3_server, bucket) if k.endswith("/train_000000.bin")]
    body = bytearray((local.folder / "train_000000.bin").read_bytes())
    body[-1] ^= 0xFF  # one token changed, the size the same
    s3_server.client().put_object(Bucket=bucket, Key=shard, Body=bytes(body))
    with pytest.raises(DataError, match=r"train_000000.bin: not the file its manifest lists"):
        shelf(s3_server, bucket, tmp_path / "node").fetch("code")


def test_submit_refuses_a_dataset_the_bucket_does_not_have_naming_it(
    s3_server: S3Server, bucket: str, local: Dataset, tmp_path: Path
) -> None:
    datasets = shelf(s3_server, bucket, tmp_path / "service")
    with pytest.raises(InvalidRequest, match=r"data.dataset: there is no dataset named 'code'"):
        resolve_train(
            TrainRequest(steps=10, data={"source": "dataset", "dataset": "code"}),
            cuda_available=False,
            data_roots=[],
            datasets=datasets,  # the bucket, where names are (not `local`'s folder)
        )


def test_a_prepare_into_the_bucket_is_planned_under_its_url_and_never_twice(
    s3_server: S3Server, bucket: str, local: Dataset, tmp_path: Path
) -> None:
    datasets = shelf(s3_server, bucket, tmp_path / "service")
    request = PrepareRequest(name="code", inputs=["code"])
    roots = [local.folder.parent]
    plan = resolve_prepare(request, data_roots=roots, datasets=datasets)
    assert plan.output == f"s3://{bucket}/fleet/datasets/code"
    datasets.publish(local.folder, "code")
    with pytest.raises(DatasetExists, match=f"s3://{bucket}/fleet/datasets already has a 'code'"):
        resolve_prepare(request, data_roots=roots, datasets=datasets)
    with pytest.raises(FileExistsError):
        datasets.publish(local.folder, "code")


def test_a_prepare_killed_mid_upload_leaves_nothing_the_start_up_sweep_keeps(
    s3_server: S3Server, bucket: str, local: Dataset, tmp_path: Path
) -> None:
    killed = shelf(s3_server, bucket, tmp_path / "prepare-node")
    staged = killed.storage.stage("datasets", "code")
    sink = staged.create("train_000000.bin")
    sink.write(b"x" * 1024)
    sink.close()  # one file up, then the node died
    assert not killed.exists("code")
    # The service's start (service/app.py) sweeps the bucket's datasets with the checkpoints:
    # a stage nothing is writing any more (stale_after 0: another node's, long dead).
    service = shelf(s3_server, bucket, tmp_path / "service", stale_after=0.0)
    assert [name for _, name in service.cleanup()] != []
    assert not [k for k in keys(s3_server, bucket) if "/datasets/code/" in k]
    service.publish(local.folder, "code")  # the name is free: the killed prepare never took it
    assert service.exists("code")

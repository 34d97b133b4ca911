"""Training and validating on a prepared dataset: its shards read (uint16 or uint32), its pin
checked, bits per byte reported, and its tokenizer saved with every checkpoint."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.datasets import stdlib_texts, train_tokenizer, write_bpe_dataset
from tests.support.stores import dataset_store, folder, posix_store
from trainctl.store.checkpoints.info import TokenizerId
from trainctl.store.data.datasets import TOKENIZER_FILE, Dataset, Split, TokenizerRef, write_dataset
from trainctl.store.data.shards import DataError, write_shard
from trainctl.store.kinds.train import TrainPlan, TrainRequest, resolve_train
from trainctl.store.plans import DatasetPin
from trainctl.store.specs import DataSpec
from trainctl.worker.training.hooks import TrainerHooks
from trainctl.worker.training.loop import Trainer, build_token_arrays, train

TEXTS = stdlib_texts(150_000)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tokenizer(tmp_path_factory.mktemp("tok") / TOKENIZER_FILE, TEXTS, 384)


@pytest.fixture
def dataset(tmp_path: Path, tokenizer: Path) -> Dataset:
    return write_bpe_dataset(tmp_path / "datasets" / "code", tokenizer, TEXTS)


def dataset_plan(tmp_path: Path, **request: Any) -> TrainPlan:
    request = {
        "experiment": "bpe",
        "steps": 6,
        "checkpoint_every": 3,
        "log_every": 1,
        "val_batches": 2,
        "batch": {"micro_batch_size": 4, "seq_len": 64},
        "data": {"source": "dataset", "dataset": "code"},
        **request,
    }
    return resolve_train(
        TrainRequest(**request),
        cuda_available=False,
        data_roots=[],
        datasets=dataset_store(tmp_path),
    )


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
@pytest.mark.parametrize("async_checkpoint", [False, True], ids=["sync", "async"])
def test_each_checkpoint_of_a_bpe_run_carries_its_tokenizer_and_the_datasets_identity(
    tmp_path: Path, dataset: Dataset, async_checkpoint: bool
) -> None:
    plan = dataset_plan(tmp_path, async_checkpoint=async_checkpoint)
    store = posix_store(tmp_path / "checkpoints")
    train(plan, store)

    saved = store.list_checkpoints("bpe")
    assert {c.tag for c in saved} >= {"step_3", "step_6", "best"}
    for info in saved:
        listed = {f["name"]: f["sha256"] for f in info.files}
        assert listed[TOKENIZER_FILE] == dataset.tokenizer.sha256
        where = folder(store, info.experiment, info.tag)
        assert sha256(where / TOKENIZER_FILE) == sha256(dataset.folder / TOKENIZER_FILE)
        assert info.tokenizer == TokenizerId("bpe", dataset.tokenizer.sha256)
        metadata = json.loads((where / "metadata.json").read_text())
        assert plan.dataset is not None
        assert metadata["dataset"] == plan.dataset.model_dump()
        assert metadata["tokenizer"]["eot_id"] == dataset.tokenizer.eot_id


@pytest.mark.slow
def test_validation_on_a_dataset_reports_bits_per_byte(tmp_path: Path, dataset: Dataset) -> None:
    metrics: list[dict[str, Any]] = []
    checkpoints = posix_store(tmp_path / "checkpoints")
    result = train(dataset_plan(tmp_path), checkpoints, hooks=TrainerHooks(on_metrics=metrics.append))

    val = [m for m in metrics if m["kind"] == "val"]
    assert [m["step"] for m in val] == [3, 6]
    for m in val:
        expected = m["val_loss"] / np.log(2) / dataset.bytes_per_token
        assert m["val_bits_per_byte"] == pytest.approx(expected)
    assert result["final_val_bits_per_byte"] == val[-1]["val_bits_per_byte"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("data", "known"),
    [({"source": "stdlib", "max_bytes": 200_000}, True), ({"source": "synthetic"}, False)],
)
def test_byte_level_text_reports_bits_per_byte_and_synthetic_tokens_do_not(
    tmp_path: Path, data: dict[str, Any], known: bool
) -> None:
    metrics: list[dict[str, Any]] = []
    plan = dataset_plan(tmp_path, steps=2, data=data)
    train(plan, posix_store(tmp_path), hooks=TrainerHooks(on_metrics=metrics.append))

    val = next(m for m in metrics if m["kind"] == "val")
    assert ("val_bits_per_byte" in val) is known
    if known:  # a byte is a token: bits per byte is the loss in bits
        assert val["val_bits_per_byte"] == pytest.approx(val["val_loss"] / np.log(2))


def test_a_dataset_prepared_again_after_submit_is_not_trained_on(
    tmp_path: Path, dataset: Dataset, tokenizer: Path
) -> None:
    plan = dataset_plan(tmp_path)
    write_bpe_dataset(dataset.folder, tokenizer, TEXTS[:-1])

    with pytest.raises(DataError, match="prepared again since the run was submitted"):
        Trainer(plan, posix_store(tmp_path / "checkpoints"))


def test_a_tokenizer_file_swapped_after_submit_is_not_saved_with_checkpoints(
    tmp_path: Path, dataset: Dataset
) -> None:
    plan = dataset_plan(tmp_path)
    (dataset.folder / TOKENIZER_FILE).write_text("{}")

    with pytest.raises(DataError, match=r"not the tokenizer its dataset\.json records"):
        Trainer(plan, posix_store(tmp_path / "checkpoints"))


def test_uint32_shards_of_a_large_vocabulary_read_as_their_token_ids(tmp_path: Path) -> None:
    folder = tmp_path / "wide"
    folder.mkdir()
    (folder / TOKENIZER_FILE).write_text('{"not": "parsed by the worker"}')
    train_ids = np.arange(0, 100_000, 7, dtype=np.int64)  # ids above 65,535 included
    write_shard(folder / "train_000000.bin", train_ids, dtype="uint32")
    write_shard(folder / "val_000000.bin", train_ids[:100], dtype="uint32")
    sha = sha256(folder / TOKENIZER_FILE)
    splits = {
        "train": Split(["train_000000.bin"], len(train_ids), 1, 4 * len(train_ids)),
        "val": Split(["val_000000.bin"], 100, 1, 400),
    }
    wide = Dataset(folder, TokenizerRef("bpe", sha, 0), 100_000, "uint32", splits)
    write_dataset(wide)
    pin = DatasetPin.of(wide)

    train_arrays, val_arrays = build_token_arrays(
        DataSpec(source="dataset", dataset=str(folder)), pin
    )

    assert np.array_equal(np.asarray(train_arrays[0]), train_ids)
    assert len(val_arrays[0]) == 100 and int(train_arrays[0].max()) == 99_995

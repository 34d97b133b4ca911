"""A FIFO swapped in after submit, where a run reads: its data files, a dataset's shards and
tokenizer, a checkpoint it loads. The read fails at once, naming the file, instead of
blocking the run for good (where no cancel reaches it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.checkpoints import save_checkpoint
from tests.support.datasets import stdlib_texts, train_tokenizer, write_bpe_dataset
from tests.support.special_files import plant, self_loops, without_blocking
from tests.support.stores import dataset_store, posix_store
from trainctl.store.checkpoints.manifests import MODEL_FILE, OPTIMIZER_FILE
from trainctl.store.data.bucket import DatasetStore
from trainctl.store.data.datasets import TOKENIZER_FILE
from trainctl.store.data.shards import DataError, expand_paths, write_shard
from trainctl.store.kinds.train import TrainRequest, resolve_train
from trainctl.store.training.optim import OptimizerSpec
from trainctl.worker.checkpoints.state import load_checkpoint
from trainctl.worker.data.datasets import build_data_record
from trainctl.worker.exceptions import CheckpointCorrupt
from trainctl.worker.models.gpt import build_model
from trainctl.worker.training.loop import build_token_arrays
from trainctl.worker.training.optim import build_optimizers

TEXTS = stdlib_texts(60_000)


def plan_for(root: Path, data: dict[str, Any], datasets: DatasetStore | None = None) -> Any:
    request = TrainRequest(
        experiment="e", steps=2, batch={"micro_batch_size": 2, "seq_len": 32}, data=data
    )
    return resolve_train(request, cuda_available=False, data_roots=[root], datasets=datasets)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "roots"
    (root / "text").mkdir(parents=True)
    for i, text in enumerate(TEXTS[:4]):
        (root / "text" / f"{i}.py").write_text(text)
    write_shard(root / "train.bin", list(range(200)))
    write_shard(root / "val.bin", list(range(100)))
    (root / "val.txt").write_text(TEXTS[4])
    return root


@pytest.mark.parametrize(
    ("data", "swapped"),
    [
        ({"source": "text", "paths": ["text"]}, "text/2.py"),
        ({"source": "text", "paths": ["text"], "val_paths": ["val.txt"]}, "val.txt"),
        ({"source": "shards", "paths": ["train.bin"], "val_paths": ["val.bin"]}, "train.bin"),
    ],
)
def test_a_data_file_swapped_for_a_fifo_after_submit_fails_the_read_naming_it(
    root: Path, data: dict[str, Any], swapped: str
) -> None:
    plan = plan_for(root, data)
    plant(root / swapped, "fifo")

    with pytest.raises(DataError, match="a FIFO, not a regular file") as failed:
        without_blocking(lambda: build_token_arrays(plan.data, plan.dataset), "reading the data")

    assert swapped in str(failed.value)


@pytest.mark.parametrize("swapped", ["train_000000.bin", TOKENIZER_FILE, "dataset.json"])
def test_a_dataset_file_swapped_for_a_fifo_fails_the_run_naming_it(
    tmp_path: Path, swapped: str
) -> None:
    tokenizer = train_tokenizer(tmp_path / "tok" / TOKENIZER_FILE, TEXTS, 300)
    dataset = write_bpe_dataset(tmp_path / "datasets" / "code", tokenizer, TEXTS)
    data = {"source": "dataset", "dataset": "code"}
    datasets = dataset_store(tmp_path)
    plan = plan_for(tmp_path, data, datasets)
    plant(dataset.folder / swapped, "fifo")

    def read_as_a_run_does() -> None:
        build_data_record(plan.data, plan.dataset, datasets=datasets)
        build_token_arrays(plan.data, plan.dataset, datasets)

    with pytest.raises(DataError, match="a FIFO, not a regular file") as failed:
        without_blocking(read_as_a_run_does, "reading the dataset")

    assert swapped in str(failed.value)


def test_a_plan_path_is_read_as_it_is_and_a_glob_walk_ends_among_link_loops(
    tmp_path: Path,
) -> None:
    """The worker's paths are the files submit expanded, a name with glob characters among
    them; a pattern it is given is walked without following the loops."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a[1].txt").write_text("a")
    (tmp_path / "data" / "b.txt").write_text("b")
    self_loops(tmp_path / "data", "x", "y")

    assert expand_paths([str(tmp_path / "data" / "a[1].txt")]) == [tmp_path / "data" / "a[1].txt"]
    found = without_blocking(lambda: expand_paths([str(tmp_path / "**" / "*.txt")]), "a glob")
    assert found == [tmp_path / "data" / "a[1].txt", tmp_path / "data" / "b.txt"]


@pytest.mark.parametrize("name", [MODEL_FILE, OPTIMIZER_FILE])
def test_loading_a_checkpoint_whose_file_became_a_fifo_fails_at_once(
    tmp_path: Path, name: str
) -> None:
    model = build_model("tiny", seed=0)
    optimizers = build_optimizers(model, OptimizerSpec())
    save_checkpoint(model, optimizers, None, 1, 100, None, tmp_path / "checkpoints" / "exp")
    store = posix_store(tmp_path / "checkpoints")
    checkpoint = store.entry("exp", "step_1")  # complete when listed...
    plant(tmp_path / "checkpoints" / "exp" / "step_1" / name, "fifo")  # ...a FIFO since

    with pytest.raises(CheckpointCorrupt, match="missing"):
        without_blocking(lambda: load_checkpoint(model, optimizers, None, checkpoint), "the load")

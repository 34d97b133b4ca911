"""Plans that read a prepared dataset: found by name or folder, confined, pinned, and refused
at submit when they cannot work (no dataset.json, a vocabulary larger than the model's, a
checkpoint trained with another tokenizer); and the plans of prepare runs that make one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tests.service.fakes import save_checkpoint
from tests.support.datasets import (
    stdlib_texts,
    train_tokenizer,
    write_bpe_dataset,
    write_byte_dataset,
)
from tests.support.stores import dataset_store, posix_store
from trainctl.store.checkpoints.info import TokenizerId
from trainctl.store.data.datasets import DATASET_FILE, TOKENIZER_FILE, Dataset, read_dataset
from trainctl.store.exceptions import DatasetExists, InvalidRequest
from trainctl.store.kinds.prepare import PreparePlan, PrepareRequest, resolve_prepare
from trainctl.store.kinds.train import TrainPlan, TrainRequest, resolve_train
from trainctl.store.kinds.validate import ValidatePlan, ValidateRequest, resolve_validate
from trainctl.store.models.presets import get_preset
from trainctl.store.plans import DatasetPin
from trainctl.store.specs import DataSpec

TEXTS = stdlib_texts(120_000)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tokenizer(tmp_path_factory.mktemp("tok") / TOKENIZER_FILE, TEXTS, 300)


@pytest.fixture
def roots(tmp_path: Path) -> list[Path]:
    (tmp_path / "root").mkdir()
    return [tmp_path / "root"]


@pytest.fixture
def datasets_dir(tmp_path: Path) -> Path:
    return tmp_path / "data" / "datasets"


@pytest.fixture
def bpe(datasets_dir: Path, tokenizer: Path) -> Dataset:
    return write_bpe_dataset(datasets_dir / "code", tokenizer, TEXTS)


def plan(roots: list[Path], datasets_dir: Path, dataset: str, **request: Any) -> TrainPlan:
    return resolve_train(
        TrainRequest(steps=10, data={"source": "dataset", "dataset": dataset}, **request),
        cuda_available=False,
        data_roots=roots,
        datasets=dataset_store(datasets_dir.parent),
    )


def validation(
    checkpoints: Path, roots: list[Path], datasets_dir: Path, data: dict[str, Any]
) -> ValidatePlan:
    return resolve_validate(
        ValidateRequest(checkpoint="exp/step_10", data=data),
        cuda_available=False,
        data_roots=roots,
        checkpoints=posix_store(checkpoints),
        datasets=dataset_store(datasets_dir.parent),
    )


def test_a_train_plan_pins_a_dataset_named_by_its_name(
    roots: list[Path], datasets_dir: Path, bpe: Dataset
) -> None:
    p = plan(roots, datasets_dir, "code")

    assert p.data.dataset == str(bpe.folder.resolve())
    assert p.dataset == DatasetPin.of(read_dataset(bpe.folder.resolve()))
    assert p.dataset is not None and p.dataset.tokenizer.kind == "bpe"
    assert p.dataset.tokenizer.sha256 == bpe.tokenizer.sha256
    assert p.dataset.vocab_size == 300 and p.dataset.bytes_per_token > 1.5
    assert TrainPlan.model_validate(p.model_dump(mode="json")) == p  # as the worker reads it


def test_a_dataset_folder_is_named_by_a_path_inside_the_data_roots(
    roots: list[Path], datasets_dir: Path, tokenizer: Path
) -> None:
    write_bpe_dataset(roots[0] / "corpora" / "code", tokenizer, TEXTS)

    assert plan(roots, datasets_dir, "./corpora/code").dataset is not None
    assert plan(roots, datasets_dir, str(roots[0] / "corpora" / "code")).dataset is not None


@pytest.mark.parametrize(
    ("ref", "problem"),
    [
        ("missing", "no dataset named 'missing'"),
        ("../data/datasets/code", "outside the data roots"),
        ("/etc", "outside the data roots"),
        ("./nothing/here", "does not exist"),
        ("a..b", "neither a dataset name"),
    ],
)
def test_a_dataset_that_is_not_there_or_outside_the_roots_is_refused(
    roots: list[Path], datasets_dir: Path, bpe: Dataset, ref: str, problem: str
) -> None:
    with pytest.raises(InvalidRequest, match=problem):
        plan(roots, datasets_dir, ref)


def test_a_folder_without_dataset_json_is_an_unfinished_prepare(
    roots: list[Path], datasets_dir: Path, bpe: Dataset
) -> None:
    (bpe.folder / DATASET_FILE).unlink()

    with pytest.raises(InvalidRequest, match=r"has no dataset\.json.*prepare has not finished"):
        plan(roots, datasets_dir, "code")


def test_a_dataset_whose_vocabulary_exceeds_the_models_names_both_sizes(
    roots: list[Path], datasets_dir: Path, tokenizer: Path
) -> None:
    write_bpe_dataset(datasets_dir / "big", tokenizer, TEXTS, vocab_size=70_000)
    tiny = get_preset("tiny").vocab_size

    with pytest.raises(InvalidRequest) as caught:
        plan(roots, datasets_dir, "big")

    assert "70,000 tokens" in str(caught.value) and f"vocab_size of {tiny:,}" in str(caught.value)
    big_enough = {"overrides": {"vocab_size": 70_000}}
    assert plan(roots, datasets_dir, "big", model=big_enough).dataset is not None


def test_a_dataset_missing_a_shard_or_with_another_tokenizer_file_is_refused(
    roots: list[Path], datasets_dir: Path, bpe: Dataset
) -> None:
    (bpe.folder / TOKENIZER_FILE).write_text("{}")
    with pytest.raises(InvalidRequest, match=r"tokenizer\.json is not the one"):
        plan(roots, datasets_dir, "code")

    (bpe.folder / bpe.splits["val"].shards[0]).unlink()
    with pytest.raises(InvalidRequest, match=r"lists 'val_000000\.bin', which is missing"):
        plan(roots, datasets_dir, "code")


def test_a_shard_linked_out_of_the_roots_is_refused(
    roots: list[Path], datasets_dir: Path, bpe: Dataset, tmp_path: Path
) -> None:
    shard = bpe.folder / bpe.splits["train"].shards[0]
    outside = tmp_path / "outside.bin"
    shard.rename(outside)
    shard.symlink_to(outside)

    with pytest.raises(InvalidRequest, match="outside the data roots"):
        plan(roots, datasets_dir, "code")


def test_a_dataset_source_takes_a_dataset_and_no_paths() -> None:
    with pytest.raises(ValidationError, match="needs `dataset`"):
        DataSpec(source="dataset")
    with pytest.raises(ValidationError, match="takes no paths"):
        DataSpec(source="dataset", dataset="code", paths=["x"])
    with pytest.raises(ValidationError, match="takes no dataset"):
        DataSpec(source="stdlib", dataset="code")
    with pytest.raises(ValidationError, match="dataset"):
        DataSpec(source="dataset", dataset="corpora/*")


def checkpoint(checkpoints: Path, tokenizer: dict[str, Any] | None) -> None:
    save_checkpoint(posix_store(checkpoints), "exp", step=10, metadata={"tokenizer": tokenizer})


def test_a_validation_on_data_of_another_tokenizer_is_refused_saying_so(
    tmp_path: Path, roots: list[Path], datasets_dir: Path, bpe: Dataset
) -> None:
    write_byte_dataset(datasets_dir / "bytes", TEXTS)
    checkpoints = tmp_path / "checkpoints"
    trained_on = {"kind": "bpe", "sha256": bpe.tokenizer.sha256, "eot_id": 0}
    checkpoint(checkpoints, trained_on)
    on_bpe = {"source": "dataset", "dataset": "code"}

    assert validation(checkpoints, roots, datasets_dir, on_bpe).dataset is not None
    for other in ({"source": "dataset", "dataset": "bytes"}, {"source": "stdlib"}):
        with pytest.raises(InvalidRequest, match="was trained on tokens of the bpe tokenizer"):
            validation(checkpoints, roots, datasets_dir, other)

    checkpoint(tmp_path / "elsewhere", {**trained_on, "sha256": "0" * 64})
    with pytest.raises(
        InvalidRequest, match=f"but the data is tokens of .* {bpe.tokenizer.sha256}"
    ):
        validation(tmp_path / "elsewhere", roots, datasets_dir, on_bpe)


def test_a_checkpoint_that_records_no_tokenizer_validates_on_any_data(
    tmp_path: Path, roots: list[Path], datasets_dir: Path, bpe: Dataset
) -> None:
    checkpoint(tmp_path / "checkpoints", None)
    data = {"source": "dataset", "dataset": "code"}

    assert validation(tmp_path / "checkpoints", roots, datasets_dir, data).dataset is not None
    info = posix_store(tmp_path / "checkpoints").get("exp", "step_10")
    assert info.tokenizer is None


def test_the_store_reads_the_tokenizer_a_checkpoint_records(tmp_path: Path) -> None:
    checkpoint(tmp_path, {"kind": "bpe", "sha256": "ab" * 32, "eot_id": 0})
    info = posix_store(tmp_path).get("exp", "step_10")

    assert info.tokenizer == TokenizerId("bpe", "ab" * 32)
    with posix_store(tmp_path).entry("exp", "step_10").open("metadata.json") as f:
        metadata = json.loads(f.read())
    assert metadata["tokenizer"]["eot_id"] == 0


# --- prepare plans ---------------------------------------------------------------------------


def prepare(roots: list[Path], datasets_dir: Path, **request: Any) -> PreparePlan:
    return resolve_prepare(
        PrepareRequest(**{"name": "corpus", "inputs": ["corpus"], **request}),
        data_roots=roots,
        datasets=dataset_store(datasets_dir.parent),
    )


def test_a_prepare_plan_reads_a_folders_files_but_its_hidden_ones(
    roots: list[Path], datasets_dir: Path
) -> None:
    corpus = roots[0] / "corpus"
    (corpus / "b").mkdir(parents=True)
    (corpus / ".git").mkdir()
    for name in ("a.jsonl", "b/c.txt", ".hidden.txt", ".git/config"):
        (corpus / name).write_text("text")

    p = prepare(roots, datasets_dir, workers=2)

    real = corpus.resolve()
    assert p.inputs == [str(real / "a.jsonl"), str(real / "b" / "c.txt")]
    assert p.output == str(datasets_dir.resolve() / "corpus") and p.filed_under == "corpus"
    assert p.tokenizer == "bytes" and p.workers == 2
    named = prepare(roots, datasets_dir, inputs=["corpus/.hidden.txt"])  # named: it is read
    assert named.inputs == [str(real / ".hidden.txt")]


def test_a_prepare_plan_takes_a_tokenizer_file_or_folder_inside_the_roots(
    roots: list[Path], datasets_dir: Path, tokenizer: Path
) -> None:
    (roots[0] / "corpus").mkdir()
    (roots[0] / "corpus" / "a.txt").write_text("text")
    (roots[0] / "tok").mkdir()
    (roots[0] / "tok" / TOKENIZER_FILE).write_bytes(tokenizer.read_bytes())
    expected = str((roots[0] / "tok" / TOKENIZER_FILE).resolve())

    assert prepare(roots, datasets_dir, tokenizer="tok").tokenizer == expected
    assert prepare(roots, datasets_dir, tokenizer="tok/tokenizer.json").tokenizer == expected
    with pytest.raises(InvalidRequest, match="outside the data roots"):
        prepare(roots, datasets_dir, tokenizer=str(tokenizer))
    with pytest.raises(InvalidRequest, match="does not exist"):
        prepare(roots, datasets_dir, tokenizer="corpus/tokenizer.json")


def test_a_prepare_into_a_name_in_use_is_a_conflict(
    roots: list[Path], datasets_dir: Path, bpe: Dataset
) -> None:
    (roots[0] / "corpus").mkdir()
    (roots[0] / "corpus" / "a.txt").write_text("text")

    with pytest.raises(DatasetExists, match="already has a 'code'"):
        prepare(roots, datasets_dir, name="code")


def test_prepare_inputs_outside_the_roots_are_refused(
    roots: list[Path], datasets_dir: Path, tmp_path: Path
) -> None:
    with pytest.raises(InvalidRequest, match="outside the data roots"):
        prepare(roots, datasets_dir, inputs=[str(tmp_path)])
    with pytest.raises(ValidationError, match="inputs"):
        PrepareRequest(name="x", inputs=[])

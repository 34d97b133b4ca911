"""Runs on a prepared dataset through the API: pinned when accepted, refused at submit with a
422 that says why (an unfinished prepare, a vocabulary larger than the model's, a checkpoint
trained with another tokenizer); and prepare runs, refused with a 409 for a name in use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.datasets import stdlib_texts, train_tokenizer, write_bpe_dataset, write_byte_dataset
from tests.service.fakes import save_checkpoint
from trainctl.service.settings import Settings
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.data.datasets import DATASET_FILE, TOKENIZER_FILE, Dataset

TEXTS = stdlib_texts(100_000)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """The app's settings (conftest's `app` reads them), with a data root holding a corpus."""
    (tmp_path / "roots" / "corpus").mkdir(parents=True)
    (tmp_path / "roots" / "corpus" / "a.txt").write_text("some text")
    return Settings(data_dir=tmp_path / "data", workers=0, data_roots=[tmp_path / "roots"])


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tokenizer(tmp_path_factory.mktemp("tok") / TOKENIZER_FILE, TEXTS, 300)


@pytest.fixture
def bpe(settings: Settings, tokenizer: Path) -> Dataset:
    return write_bpe_dataset(settings.datasets_dir / "code", tokenizer, TEXTS)


def on(dataset: str, **spec: Any) -> dict[str, Any]:
    return {"device": "cpu", "data": {"source": "dataset", "dataset": dataset}, **spec}


def test_a_train_run_on_a_dataset_is_queued_with_the_dataset_pinned(
    client: TestClient, bpe: Dataset
) -> None:
    r = client.post("/runs/train", json=on("code", steps=5))

    assert r.status_code == 202, r.text
    pinned = r.json()["spec"]["dataset"]
    assert pinned["folder"] == r.json()["spec"]["data"]["dataset"] == str(bpe.folder.resolve())
    assert pinned["tokenizer"]["sha256"] == bpe.tokenizer.sha256
    assert pinned["vocab_size"] == 300 and pinned["bytes_per_token"] == bpe.bytes_per_token


def test_a_dataset_whose_prepare_has_not_finished_is_a_422(
    client: TestClient, bpe: Dataset
) -> None:
    (bpe.folder / DATASET_FILE).unlink()

    r = client.post("/runs/train", json=on("code", steps=5))

    assert r.status_code == 422
    assert "has no dataset.json" in r.json()["detail"]


def test_a_vocabulary_larger_than_the_models_is_a_422_naming_both_sizes(
    client: TestClient, settings: Settings, tokenizer: Path
) -> None:
    write_bpe_dataset(settings.datasets_dir / "wide", tokenizer, TEXTS, vocab_size=100_000)

    r = client.post("/runs/train", json=on("wide", steps=5))

    assert r.status_code == 422
    assert "100,000 tokens" in r.json()["detail"] and "512" in r.json()["detail"]


def test_validating_on_data_of_another_tokenizer_is_a_422_saying_so(
    client: TestClient, settings: Settings, ckpts: CheckpointStore, bpe: Dataset
) -> None:
    write_byte_dataset(settings.datasets_dir / "bytes", TEXTS)
    trained_on = {"kind": "bpe", "sha256": bpe.tokenizer.sha256, "eot_id": 0}
    save_checkpoint(ckpts, "exp", step=10, metadata={"tokenizer": trained_on})

    same = client.post("/runs/validate", json=on("code", checkpoint="exp/step_10"))
    other = client.post("/runs/validate", json=on("bytes", checkpoint="exp/step_10"))

    assert same.status_code == 202, same.text
    assert other.status_code == 422
    assert "trained on tokens of the bpe tokenizer" in other.json()["detail"]
    assert "but the data is byte-level tokens" in other.json()["detail"]


def test_a_checkpoint_answer_names_the_tokenizer_it_was_trained_with(
    client: TestClient, ckpts: CheckpointStore
) -> None:
    tokenizer = {"kind": "bpe", "sha256": "ab" * 32, "eot_id": 0}
    save_checkpoint(ckpts, "exp", step=10, metadata={"tokenizer": tokenizer})
    save_checkpoint(ckpts, "old", step=10)

    assert client.get("/checkpoints/exp/step_10").json()["tokenizer"] == {
        "kind": "bpe",
        "sha256": "ab" * 32,
    }
    assert client.get("/checkpoints/old/step_10").json()["tokenizer"] is None


def test_a_prepare_run_is_queued_filed_under_its_dataset_name(
    client: TestClient, settings: Settings
) -> None:
    r = client.post("/runs/prepare", json={"name": "notes", "inputs": ["corpus"]})

    assert r.status_code == 202, r.text
    run = r.json()
    assert (run["kind"], run["experiment"], run["state"]) == ("prepare", "notes", "queued")
    output = settings.datasets_dir.resolve() / "notes"
    assert run["spec"]["output"] == str(output) and run["spec"]["tokenizer"] == "bytes"
    assert run["spec"]["inputs"] == [str(settings.data_roots[0].resolve() / "corpus" / "a.txt")]
    listed = client.get("/runs", params={"kind": "prepare"}).json()["items"]
    assert [item["id"] for item in listed] == [run["id"]]


def test_a_prepare_of_a_name_in_use_or_being_prepared_is_a_409(
    client: TestClient, bpe: Dataset
) -> None:
    taken = client.post("/runs/prepare", json={"name": "code", "inputs": ["corpus"]})
    first = client.post("/runs/prepare", json={"name": "notes", "inputs": ["corpus"]})
    second = client.post("/runs/prepare", json={"name": "notes", "inputs": ["corpus"]})

    assert taken.status_code == 409 and "already has a 'code'" in taken.json()["detail"]
    assert first.status_code == 202
    assert second.status_code == 409
    assert f"being prepared by run {first.json()['id']}" in second.json()["detail"]


def test_prepare_inputs_outside_the_data_roots_are_a_422(
    client: TestClient, tmp_path: Path
) -> None:
    r = client.post("/runs/prepare", json={"name": "notes", "inputs": [str(tmp_path)]})

    assert r.status_code == 422 and "outside the data roots" in r.json()["detail"]

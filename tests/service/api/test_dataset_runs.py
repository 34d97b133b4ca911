"""Runs on a prepared dataset through the API: pinned when accepted, refused at submit with a
422 that says why (an unfinished prepare, a vocabulary larger than the model's, a checkpoint
trained with another tokenizer); mixtures of datasets (docs/design/data.md, "Data
mixtures"), each dataset pinned, refused with a 422 naming the entry (another tokenizer, an
unknown dataset, one named twice, bad weights); and prepare runs, refused with a 409 for a
name in use."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.service.api.submits import CPU_TRAIN, submit
from tests.service.fakes import save_checkpoint
from tests.support.datasets import (
    stdlib_texts,
    train_tokenizer,
    write_bpe_dataset,
    write_byte_dataset,
)
from trainctl.service.settings import Settings
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.data.datasets import DATASET_FILE, TOKENIZER_FILE, Dataset, read_dataset

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


# --- mixtures ----------------------------------------------------------------------------------


@pytest.fixture
def mixable(settings: Settings, tokenizer: Path, bpe: Dataset) -> Path:
    """web beside code, of one BPE tokenizer, and bytes, byte-level: another tokenizer."""
    write_bpe_dataset(settings.datasets_dir / "web", tokenizer, TEXTS[: len(TEXTS) // 2])
    write_byte_dataset(settings.datasets_dir / "bytes", TEXTS)
    return settings.datasets_dir


def mixture(*sources: tuple[str, Any], **spec: Any) -> dict[str, Any]:
    entries = [{"dataset": name, "weight": weight} for name, weight in sources]
    return CPU_TRAIN | {"data": {"mixture": entries}} | spec


def refusal(response: Any) -> str:
    assert response.status_code == 422, response.text
    return str(response.json()["detail"])


def test_a_mixture_is_queued_with_each_of_its_datasets_pinned(
    client: TestClient, mixable: Path
) -> None:
    r = submit(client, "train", mixture(("web", 0.7), ("code", 0.3)))

    assert r.status_code == 202, r.text
    spec = r.json()["spec"]
    folders = [str((mixable / name).resolve()) for name in ("web", "code")]
    assert spec["data"]["source"] == "mixture"
    assert [s["dataset"] for s in spec["data"]["mixture"]] == folders
    assert [s["weight"] for s in spec["data"]["mixture"]] == [0.7, 0.3]
    assert [d["folder"] for d in spec["datasets"]] == folders
    assert spec["dataset"] is None


def test_a_mixture_of_datasets_with_different_tokenizers_is_a_422_naming_both(
    client: TestClient, mixable: Path
) -> None:
    message = refusal(submit(client, "train", mixture(("web", 1), ("bytes", 1))))

    assert "data.mixture[1].dataset 'bytes' holds byte-level tokens" in message
    assert "data.mixture[0].dataset 'web' holds tokens of the bpe tokenizer" in message
    assert "must share one tokenizer" in message


def test_an_unknown_dataset_in_a_mixture_is_a_422_naming_it(
    client: TestClient, mixable: Path
) -> None:
    r = submit(client, "train", mixture(("web", 1), ("nope", 1)))

    assert "data.mixture[1].dataset: there is no dataset named 'nope'" in refusal(r)


def test_a_dataset_named_twice_or_two_of_one_name_are_422s(
    client: TestClient, settings: Settings, tokenizer: Path, mixable: Path
) -> None:
    root = settings.data_roots[0].resolve()
    write_bpe_dataset(root / "web", tokenizer, TEXTS[len(TEXTS) // 2 :])

    twice = submit(client, "train", mixture(("web", 1), ("web", 2)))
    by_paths = submit(client, "train", mixture(("./web", 1), (str(root / "web"), 2)))
    one_name = submit(client, "train", mixture(("web", 1), ("./web", 2)))

    assert "'web' is named more than once" in refusal(twice)
    assert (
        f"data.mixture[1].dataset '{root / 'web'}' names the dataset data.mixture[0].dataset "
        "'./web' names" in refusal(by_paths)
    )
    assert "are both datasets named 'web'" in refusal(one_name)


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"mixture": [{"dataset": "web", "weight": 0}, {"dataset": "code", "weight": 1}]},
         "greater than 0"),
        ({"mixture": [{"dataset": "web", "weight": -1}, {"dataset": "code", "weight": 1}]},
         "greater than 0"),
        ({"mixture": [{"dataset": "web", "weight": "0.5"}, {"dataset": "code", "weight": 1}]},
         "valid number"),
        ({"mixture": [{"dataset": "web"}, {"dataset": "code", "weight": 1}]}, "Field required"),
        ({"mixture": [{"dataset": "web", "weight": 1}]}, "at least 2 items"),
        ({"mixture": [{"dataset": f"d{i}", "weight": 1} for i in range(17)]}, "at most 16 items"),
        ({"source": "dataset", "dataset": "web",
          "mixture": [{"dataset": "web", "weight": 1}, {"dataset": "code", "weight": 1}]},
         "takes no mixture"),
        ({"source": "mixture"}, "needs `mixture`"),
    ],
    ids=["zero", "negative", "string", "missing", "one", "seventeen", "with-dataset", "empty"],
)  # fmt: skip
def test_bad_weights_and_malformed_mixtures_are_422s_naming_the_problem(
    client: TestClient, mixable: Path, data: dict[str, Any], says: str
) -> None:
    assert says in refusal(submit(client, "train", CPU_TRAIN | {"data": data}))


def test_a_validate_run_on_a_mixture_is_a_422_pointing_to_each_dataset(
    client: TestClient, mixable: Path
) -> None:
    data = {"mixture": [{"dataset": "web", "weight": 1}, {"dataset": "code", "weight": 1}]}

    r = submit(client, "validate", {"checkpoint": "exp/step_10", "data": data})

    assert "validate the checkpoint on each of the mixture's datasets" in refusal(r)


def test_a_fork_may_train_on_another_mixture_of_its_parents_tokenizer(
    client: TestClient, ckpts: CheckpointStore, mixable: Path
) -> None:
    tokenizer = asdict(read_dataset(mixable / "web").tokenizer)
    metadata = {"optimizer_kind": "muon_adamw", "tokenizer": tokenizer}
    save_checkpoint(ckpts, "parent", step=10, metadata=metadata)
    fork = {"experiment": "fork", "fork_from": "parent/step_10"}

    other = submit(client, "train", mixture(("code", 3), ("web", 1), **fork))
    on_bytes = submit(client, "train", CPU_TRAIN | fork | {"data": on("bytes")["data"]})

    assert other.status_code == 202, other.text
    assert other.json()["spec"]["fork_from"]["step"] == 10
    assert "was trained on tokens of the bpe tokenizer" in refusal(on_bytes)


# --- prepare runs --------------------------------------------------------------------------------


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

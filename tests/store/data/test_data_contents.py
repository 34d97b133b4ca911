"""Data files are what their source says, checked at submit (store/data/contents.py): a wrong
file, or too little data for one sequence, is a 422 naming it, never a run that fails at the
worker. Every kind: shards, text, a dataset's shards, val paths, a prepare's inputs and its
tokenizer."""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.service.fakes import save_checkpoint
from tests.support.datasets import stdlib_texts, write_byte_dataset
from tests.support.stores import dataset_store, posix_store
from trainctl.store.data.shards import SHARD_HEADER_BYTES, write_shard
from trainctl.store.exceptions import InvalidRequest
from trainctl.store.kinds.prepare import PrepareRequest, resolve_prepare
from trainctl.store.kinds.train import TrainRequest, resolve_train
from trainctl.store.kinds.validate import ValidateRequest, resolve_validate

TEXT = "def f(x):\n    return x + 1\n" * 400  # 10,800 bytes


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "root").mkdir()
    return tmp_path / "root"


def train(root: Path, data: dict[str, Any], seq_len: int = 64) -> Any:
    request = TrainRequest(steps=1, data=data, batch={"seq_len": seq_len})
    return resolve_train(
        request, cuda_available=False, data_roots=[root], datasets=dataset_store(root.parent)
    )


def refused(root: Path, data: dict[str, Any], seq_len: int = 64) -> str:
    with pytest.raises(InvalidRequest) as caught:
        train(root, data, seq_len)
    return str(caught.value)


def shard(path: Path, tokens: int) -> Path:
    write_shard(path, np.arange(tokens) % 256)
    return path


# --- shards ---------------------------------------------------------------------------------


def test_shards_naming_a_prepared_dataset_folder_are_refused_pointing_to_the_dataset_source(
    root: Path,
) -> None:
    write_byte_dataset(root / "corpus", stdlib_texts(20_000), val_docs=1)

    detail = refused(root, {"source": "shards", "paths": ["corpus"]})

    assert "dataset.json" in detail and "data.source 'dataset'" in detail


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (TEXT.encode(), "bad magic"),
        (b"", "too short for a token shard header"),
        (
            np.array([20240520, 7, 0], dtype=np.int32).tobytes() + bytes(1012),
            "unsupported shard version",
        ),
        (
            np.array([20240520, 1, 100], dtype=np.int32).tobytes() + bytes(1012 + 20),
            "header says 100 tokens",
        ),
    ],
    ids=["text", "empty", "unknown-version", "truncated"],
)
def test_a_file_that_is_not_a_shard_is_refused_naming_it(
    root: Path, content: bytes, problem: str
) -> None:
    shard(root / "good.bin", 10_000)
    (root / "bad.bin").write_bytes(content)

    detail = refused(root, {"source": "shards", "paths": ["*.bin"]})

    assert detail.startswith("data.paths: ") and "bad.bin" in detail and problem in detail


def test_a_val_path_that_is_not_a_shard_is_refused_naming_val_paths(root: Path) -> None:
    shard(root / "train.bin", 10_000)
    (root / "val.bin").write_text(TEXT)

    detail = refused(root, {"source": "shards", "paths": ["train.bin"], "val_paths": ["val.bin"]})

    assert detail.startswith("data.val_paths: ")


def test_shards_too_short_for_one_sequence_are_refused_naming_the_lengths(root: Path) -> None:
    shard(root / "short.bin", 60)

    detail = refused(root, {"source": "shards", "paths": ["short.bin"]})

    assert "seq_len + 1 = 65 tokens" in detail and "the longest has 57" in detail


def test_shards_are_counted_as_the_worker_splits_them(root: Path) -> None:
    """The held-out tail comes from each shard: 5% of 1,400 tokens is 70, just enough."""
    shard(root / "a.bin", 1_400)

    assert train(root, {"source": "shards", "paths": ["a.bin"]}).data.paths
    assert "validation data" in refused(root, {"source": "shards", "paths": ["a.bin"]}, seq_len=69)


# --- text -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["train_000000.bin", "dataset.json", "blob"])
def test_a_text_path_that_is_not_text_is_refused(root: Path, name: str) -> None:
    (root / "notes.txt").write_text(TEXT)
    if name == "train_000000.bin":
        shard(root / name, 5_000)
    else:
        (root / name).write_bytes(b'{"a": 1}\x00' if name == "dataset.json" else bytes(100))

    detail = refused(root, {"source": "text", "paths": ["*"]})

    assert detail.startswith("data.paths: ") and name in detail and "is not text" in detail


def test_text_past_max_bytes_is_not_read_so_not_checked(root: Path) -> None:
    (root / "a.txt").write_text(TEXT)
    (root / "b.bin").write_bytes(bytes(100))  # after a.txt, which fills max_bytes

    plan = train(root, {"source": "text", "paths": ["*"], "max_bytes": 2048})

    assert [Path(p).name for p in plan.data.paths] == ["a.txt", "b.bin"]


def test_text_too_short_for_one_sequence_is_refused(root: Path) -> None:
    (root / "tiny.txt").write_text("x = 1\n" * 10)

    assert "seq_len + 1" in refused(root, {"source": "text", "paths": ["tiny.txt"]})


def test_a_fifo_among_the_data_files_is_refused_without_reading_it(root: Path) -> None:
    os.mkfifo(root / "pipe.txt")  # opened non-blocking and refused: no writer is ever needed

    detail = refused(root, {"source": "text", "paths": ["pipe.txt"]})

    assert "pipe.txt" in detail and "not a regular file" in detail


# --- datasets -------------------------------------------------------------------------------


def test_a_dataset_with_a_damaged_shard_is_refused_at_submit(root: Path) -> None:
    dataset = write_byte_dataset(root / "corpus", stdlib_texts(20_000), val_docs=1)
    (path,) = dataset.shard_paths("train")
    with path.open("r+b") as f:
        f.truncate(SHARD_HEADER_BYTES + 10)

    detail = refused(root, {"source": "dataset", "dataset": "./corpus"})

    assert "train_000000.bin" in detail and "header says" in detail


def test_a_dataset_too_small_for_the_sequence_length_is_refused(root: Path) -> None:
    write_byte_dataset(root / "corpus", ["a" * 500, "b" * 40], val_docs=1)

    detail = refused(root, {"source": "dataset", "dataset": "./corpus"}, seq_len=64)

    assert "the validation data holds no array longer than seq_len + 1 = 65" in detail


def test_a_validation_needs_enough_validation_data_only(root: Path) -> None:
    save_checkpoint(posix_store(root.parent / "ckpts"), "exp", step=10)
    (root / "val.txt").write_text("y" * 1000)

    def validate(seq_len: int) -> Any:
        return resolve_validate(
            ValidateRequest(
                checkpoint="exp/step_10",
                data={"source": "text", "paths": ["val.txt"]},
                seq_len=seq_len,
            ),
            cuda_available=False,
            data_roots=[root],
            checkpoints=posix_store(root.parent / "ckpts"),
        )

    assert validate(8).data.paths  # 1,000 bytes, the last 50 held out: more than 8 + 1
    with pytest.raises(InvalidRequest, match="validation data holds no array longer than"):
        validate(64)


# --- prepare --------------------------------------------------------------------------------


def prepare(root: Path, inputs: list[str], tokenizer: str = "bytes") -> Any:
    request = PrepareRequest(name="ds", inputs=inputs, tokenizer=tokenizer)
    return resolve_prepare(request, data_roots=[root], datasets=dataset_store(root.parent))


@pytest.mark.parametrize(
    ("name", "content", "kind"),
    [
        ("docs.jsonl.gz", b'{"text": "plain, not gzip"}\n', "gzip"),
        ("docs.jsonl.zst", gzip.compress(b'{"text": "gzip, not zstd"}\n', mtime=0), "zstd"),
        ("docs.parquet", b'{"text": "json, not parquet"}\n', "Parquet"),
        ("empty.parquet", b"", "Parquet"),
    ],
)
def test_a_prepare_input_that_is_not_what_its_name_says_is_refused(
    root: Path, name: str, content: bytes, kind: str
) -> None:
    (root / "ok.jsonl.gz").write_bytes(gzip.compress(b'{"text": "fine"}\n'))
    (root / name).write_bytes(content)

    with pytest.raises(InvalidRequest, match=f"{name}.* is not {kind} data"):
        prepare(root, ["ok.jsonl.gz", name])


def test_prepare_inputs_of_their_kind_and_empty_compressed_ones_are_accepted(root: Path) -> None:
    (root / "a.jsonl.gz").write_bytes(gzip.compress(b'{"text": "fine"}\n'))
    (root / "b.jsonl.gz").write_bytes(b"")
    (root / "c.txt").write_text("plain text, read as it is")

    assert len(prepare(root, ["a.jsonl.gz", "b.jsonl.gz", "c.txt"]).inputs) == 3


def test_a_prepare_tokenizer_that_tokenizers_cannot_load_is_refused(root: Path) -> None:
    (root / "a.txt").write_text(TEXT)
    (root / "tokenizer.json").write_text('{"version": "1.0", "model": "no such model"}')

    with pytest.raises(
        InvalidRequest, match=r"^tokenizer: .*not a tokenizer.json that tokenizers loads"
    ):
        prepare(root, ["a.txt"], tokenizer="tokenizer.json")

"""Training a byte-level BPE on real text (stdlib source), and loading tokenizer files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from tests.support.datasets import stdlib_files, train_stdlib_tokenizer
from trainctl.store.data.shards import DataError
from trainctl.store.data.tokenizer import (
    EOT,
    TrainProgress,
    end_of_text_id,
    load_tokenizer,
    train_tokenizer,
    vocab_size,
)


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_stdlib_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.mark.slow
def test_training_twice_on_the_same_text_gives_the_same_file_byte_for_byte(
    tokenizer_file: Path, tmp_path: Path
) -> None:
    again = train_stdlib_tokenizer(tmp_path)

    assert again.read_bytes() == tokenizer_file.read_bytes()


def test_the_tokenizer_is_byte_level_bpe_with_end_of_text_as_id_0(tokenizer_file: Path) -> None:
    tokenizer = load_tokenizer(tokenizer_file)
    config = json.loads(tokenizer_file.read_text())
    text = "naïve café — 日本語 🙂\n\tdef f(x):\r\n        return x  # done\n"

    assert config["model"]["type"] == "BPE"
    assert config["pre_tokenizer"]["type"] == config["decoder"]["type"] == "ByteLevel"
    assert vocab_size(tokenizer) == 1024
    assert end_of_text_id(tokenizer, tokenizer_file) == tokenizer.token_to_id(EOT) == 0
    assert tokenizer.decode(tokenizer.encode(text).ids) == text  # any text round-trips
    assert len(tokenizer.encode("    def __init__(self):").ids) < 10  # it learned Python


def test_training_reads_jsonl_and_parquet_and_reports_progress(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [p.read_text() for p in stdlib_files(200_000)]
    with open(tmp_path / "a.jsonl", "w") as f:
        for text in texts:
            f.write(json.dumps({"body": text}) + "\n")
        f.write("not json\n")
    pq.write_table(pa.table({"body": texts}), tmp_path / "b.parquet")
    seen: list[TrainProgress] = []

    path = train_tokenizer(
        [tmp_path / "a.jsonl", tmp_path / "b.parquet"], tmp_path / "tok", 300,
        text_field="body", text_column="body", on_progress=seen.append,
    )  # fmt: skip

    assert load_tokenizer(path).get_vocab_size() == 300
    done = seen[-1]
    assert done.phase == "done" and done.documents == 2 * len(texts)
    assert done.bytes == 2 * sum(len(t.encode()) for t in texts)
    assert done.skipped.documents == 1
    assert str(done.skipped.examples[0]).startswith(f"{tmp_path / 'a.jsonl'}:{len(texts) + 1}: ")


def test_training_refuses_a_small_vocabulary_an_existing_file_and_no_documents(
    tokenizer_file: Path, tmp_path: Path
) -> None:
    (tmp_path / "empty.jsonl").write_text('{"other": "field"}\n')

    with pytest.raises(DataError, match="vocab size 256 is not in 257"):
        train_tokenizer(stdlib_files(1), tmp_path, 256)
    with pytest.raises(DataError, match=r"tokenizer\.json exists"):
        train_tokenizer(stdlib_files(1), tokenizer_file.parent, 300)
    with pytest.raises(DataError, match=r"no documents to train on \(1 skipped; .*no field"):
        train_tokenizer([tmp_path / "empty.jsonl"], tmp_path / "out", 300)
    assert not (tmp_path / "out" / "tokenizer.json").exists()


def test_a_file_that_is_not_a_tokenizer_is_named_in_the_error(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text('{"not": "a tokenizer"}')

    with pytest.raises(DataError, match=r"not a tokenizer\.json that tokenizers loads"):
        load_tokenizer(tmp_path / "tokenizer.json")
    with pytest.raises(DataError, match="no such tokenizer file"):
        load_tokenizer(tmp_path / "missing.json")


def test_end_of_text_goes_by_the_names_other_tokenizers_give_it(tmp_path: Path) -> None:
    llama2_like = Tokenizer(models.WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2}, "<unk>"))
    llama2_like.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    none = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1}, "<unk>"))

    assert end_of_text_id(llama2_like, tmp_path / "t.json") == 2
    with pytest.raises(DataError, match=r"t.json has no end-of-text token .*<\|endoftext\|>"):
        end_of_text_id(none, tmp_path / "t.json")

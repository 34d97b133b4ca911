"""`prepare_dataset` on corpora made here (JSONL plain, .gz, .zst; Parquet; text files) with
a BPE trained on stdlib source: real tokenizers, real pyarrow, real worker processes."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from tokenizers import Tokenizer, models, pre_tokenizers

from tests.support.datasets import stdlib_files, train_stdlib_tokenizer
from trainctl.store.data import corpus
from trainctl.store.data.datasets import DATASET_FILE, Dataset, read_dataset
from trainctl.store.data.prepare import PrepareProgress, PrepareStopped, prepare_dataset
from trainctl.store.data.shards import SHARD_HEADER_INTS, DataError, read_shard
from trainctl.store.data.tokenizer import load_tokenizer

DOC_CHARS = 5000


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_stdlib_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def docs() -> list[str]:
    """120 documents of real text: the beginnings of stdlib source files."""
    return [p.read_text()[:DOC_CHARS] for p in stdlib_files(3_000_000)[:120]]


@pytest.fixture(scope="module")
def mixed_corpus(tmp_path_factory: pytest.TempPathFactory, docs: list[str]) -> Path:
    """docs[0:40] in a.jsonl, [40:80] in b.jsonl.gz, [80:100] in c.jsonl.zst, [100:120] in
    d.parquet (row groups of 8): one folder, read in name order."""
    folder = tmp_path_factory.mktemp("corpus")
    lines = [json.dumps({"id": i, "text": t}).encode() + b"\n" for i, t in enumerate(docs)]
    (folder / "a.jsonl").write_bytes(b"".join(lines[:40]))
    with gzip.open(folder / "b.jsonl.gz", "wb") as f:
        f.write(b"".join(lines[40:80]))
    with zstandard.open(folder / "c.jsonl.zst", "wb") as f:
        f.write(b"".join(lines[80:100]))
    pq.write_table(pa.table({"text": docs[100:]}), folder / "d.parquet", row_group_size=8)
    return folder


def documents(dataset: Dataset, split: str, tokenizer: Any) -> list[str]:
    """The split's documents, decoded: its tokens cut at end-of-text."""
    tokens = np.concatenate([read_shard(p) for p in dataset.shard_paths(split)])
    eot = dataset.tokenizer.eot_id
    cuts = np.flatnonzero(tokens == eot)
    assert cuts.size and cuts[-1] == tokens.size - 1, "every document ends with end-of-text"
    return [tokenizer.decode(d.tolist()) for d in np.split(tokens[: cuts[-1]], cuts[:-1])]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_jsonl_gz_zst_and_parquet_become_a_dataset_of_documents_in_order(
    mixed_corpus: Path, tokenizer_file: Path, docs: list[str], tmp_path: Path
) -> None:
    seen: list[PrepareProgress] = []

    dataset = prepare_dataset(
        [mixed_corpus], tmp_path / "ds", tokenizer_file, val_fraction=0.1, workers=1,
        on_progress=seen.append,
    )  # fmt: skip

    tokenizer = load_tokenizer(tokenizer_file)
    val_index = {9, 19, 29, 39, 49, 59, 69, 79, 89, 99, 109, 119}  # every 10th
    assert documents(dataset, "train", tokenizer) == [
        d for i, d in enumerate(docs) if i not in val_index
    ]
    assert documents(dataset, "val", tokenizer) == [docs[i] for i in sorted(val_index)]
    train, val = dataset.splits["train"], dataset.splits["val"]
    assert (train.documents, val.documents) == (108, 12)
    assert train.bytes + val.bytes == sum(len(d.encode()) for d in docs)
    assert seen[-1].documents == 120 and seen[-1].tokens == train.tokens + val.tokens
    assert dataset.tokenizer.kind == "bpe" and dataset.tokenizer.eot_id == 0
    assert dataset.vocab_size == 1024 and dataset.token_dtype == "uint16"
    copied = tmp_path / "ds" / "tokenizer.json"
    assert dataset.tokenizer.sha256 == sha256(copied) == sha256(tokenizer_file)
    assert [s["path"] for s in dataset.sources] == [
        str(mixed_corpus / n) for n in ("a.jsonl", "b.jsonl.gz", "c.jsonl.zst", "d.parquet")
    ]
    assert dataset.skipped == {
        "documents": 0, "oversized": 0, "max_document_bytes": 16 << 20, "examples": [],
    }  # fmt: skip
    assert read_dataset(tmp_path / "ds").to_json() | {"created_at": ""} == dataset.to_json()


@pytest.mark.slow
def test_one_and_two_workers_write_the_same_bytes(
    mixed_corpus: Path, tokenizer_file: Path, tmp_path: Path
) -> None:
    outs = [tmp_path / "one", tmp_path / "two"]
    for out, workers in zip(outs, (1, 2), strict=True):
        prepare_dataset([mixed_corpus], out, tokenizer_file, shard_tokens=20_000, workers=workers)

    files = [sorted(p.name for p in out.iterdir()) for out in outs]
    assert files[0] == files[1] and len(files[0]) > 5  # several shards each
    for name in files[0]:
        one, two = (out / name for out in outs)
        if name == DATASET_FILE:
            without_time = [json.loads(p.read_text()) | {"created_at": ""} for p in (one, two)]
            assert without_time[0] == without_time[1]
        else:
            assert one.read_bytes() == two.read_bytes(), name


def test_a_long_text_file_is_read_in_pieces_that_tokenize_as_the_whole(
    tokenizer_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(corpus, "PIECE_BYTES", 4096)
    # starts of files: top-level lines often enough for a cut in each 4 KiB (a long class
    # body has none: it would be cut at any line break, which changes a token there)
    text = "".join(p.read_text()[:3000] for p in stdlib_files(200_000)[:25])
    text += "\n  é 日本 🙂 trailing  \n\n"
    (tmp_path / "long.py").write_text(text)
    (tmp_path / "bad.py").write_bytes(text.encode()[:30_000] + b"\n\xff\n" + b"x = 1\n" * 9000)

    pieces = next(corpus.read_batches(corpus.find_sources([tmp_path / "long.py"])))
    dataset = prepare_dataset(
        [tmp_path / "long.py", tmp_path / "bad.py"], tmp_path / "ds", tokenizer_file,
        val_fraction=0, workers=1,
    )  # fmt: skip

    assert len(pieces) > 5 and all(len(p.raw) < 3 * 4096 for p in pieces)
    whole = load_tokenizer(tokenizer_file).encode(text, add_special_tokens=False).ids
    assert read_shard(dataset.shard_paths("train")[0]).tolist() == [*whole, 0]
    bad_line = text.encode()[:30_000].count(b"\n") + 2
    assert dataset.skipped == {
        "documents": 1, "oversized": 0, "max_document_bytes": 16 << 20,
        "examples": [{"file": str(tmp_path / "bad.py"), "line": bad_line,
                      "reason": "not UTF-8 (byte 0xff)"}],
    }  # fmt: skip


def write_bad_corpus(folder: Path) -> list[tuple[str, int, str]]:
    """A corpus with every kind of bad document; returns (file, line, reason) of each."""
    folder.mkdir()
    good = json.dumps({"text": "def ok():\n    return 1\n"})
    (folder / "a.jsonl").write_bytes(
        b"\n".join([
            good.encode(),
            b'{"text": "unterminated',
            b'{"title": "no text field"}',
            b'{"text": 42}',
            b'{"text": "caf\xe9"}',  # latin-1, not UTF-8
            b"",  # a blank line is no document
            b'["an", "array"]',
            b'{"text": "\\ud800 lone surrogate"}',
            good.encode(),
        ]) + b"\n"
    )  # fmt: skip
    (folder / "b.txt").write_bytes(b"line 1\nline 2\nbad \xc3\x28 here\n")
    pq.write_table(pa.table({"text": pa.array([1, 2, 3])}), folder / "c.parquet")
    pq.write_table(pa.table({"body": ["x", "y"]}), folder / "d.parquet")
    pq.write_table(pa.table({"text": ["fine", None, "also fine"]}), folder / "e.parquet")
    a, b, c, d, e = (str(folder / n) for n in ("a.jsonl", "b.txt", "c.parquet", "d.parquet",
                                               "e.parquet"))  # fmt: skip
    return [
        (a, 2, "not valid JSON (Unterminated string starting at: line 1 column 10 (char 9))"),
        (a, 3, "no field 'text'"),
        (a, 4, "field 'text' is a number, not a string"),
        (a, 5, "not UTF-8 (byte 0xe9)"),
        (a, 7, "an array, not a JSON object"),
        (a, 8, "not valid Unicode (a lone surrogate escape)"),
        (b, 3, "not UTF-8 (byte 0xc3)"),
        (c, 1, "column 'text' holds int64, not text: all 3 rows skipped"),
        (d, 1, "no column 'text' (columns: body): all 2 rows skipped"),
        (e, 2, "the text column is null"),
    ]


def test_bad_documents_are_skipped_and_reported_with_file_and_line(
    tokenizer_file: Path, tmp_path: Path
) -> None:
    expected = write_bad_corpus(tmp_path / "corpus")

    dataset = prepare_dataset(
        [tmp_path / "corpus"], tmp_path / "ds", tokenizer_file, val_fraction=0, workers=1
    )

    assert dataset.skipped["documents"] == 13  # the Parquet files' 3 and 2 rows count each
    assert [tuple(e.values()) for e in dataset.skipped["examples"]] == expected
    assert dataset.splits["train"].documents == 4  # two of a.jsonl, two of e.parquet
    assert read_dataset(tmp_path / "ds").skipped == dataset.skipped


def test_strict_stops_at_the_first_bad_document_and_leaves_nothing(
    tokenizer_file: Path, tmp_path: Path
) -> None:
    write_bad_corpus(tmp_path / "corpus")
    (tmp_path / "empty").mkdir()

    for out in (tmp_path / "new", tmp_path / "empty"):
        with pytest.raises(DataError, match=r"a.jsonl:2: not valid JSON .*\(strict"):
            prepare_dataset([tmp_path / "corpus"], out, tokenizer_file, strict=True, workers=1)

    assert not (tmp_path / "new").exists()  # made by the prepare: removed
    assert list((tmp_path / "empty").iterdir()) == []  # given empty: left empty


def test_a_stopped_prepare_leaves_no_dataset_json(mixed_corpus: Path, tmp_path: Path) -> None:
    calls: list[int] = []  # when it is asked: after the first batch

    def should_stop() -> bool:
        calls.append(1)
        return True

    with pytest.raises(PrepareStopped):
        prepare_dataset([mixed_corpus], tmp_path / "ds", None, workers=2, should_stop=should_stop)

    assert not (tmp_path / "ds").exists()


def test_a_folder_that_is_not_empty_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "notes.txt").write_text("mine")
    (tmp_path / "doc.txt").write_text("text")

    with pytest.raises(DataError, match="ds is not empty"):
        prepare_dataset([tmp_path / "doc.txt"], tmp_path / "ds", None, val_fraction=0)

    assert [p.name for p in (tmp_path / "ds").iterdir()] == ["notes.txt"]


def test_a_vocabulary_above_65536_gives_uint32_shards(tmp_path: Path) -> None:
    vocab = {"<|endoftext|>": 0, "[UNK]": 1} | {f"w{i}": i for i in range(2, 70_000)}
    tokenizer = Tokenizer(models.WordLevel(vocab, "[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "doc.txt").write_text("w69999 w65536 w2 unknown")

    dataset = prepare_dataset(
        [tmp_path / "doc.txt"], tmp_path / "ds", tmp_path, val_fraction=0, workers=1
    )

    assert dataset.vocab_size == 70_000 and dataset.token_dtype == "uint32"
    shard = dataset.shard_paths("train")[0]
    assert np.fromfile(shard, np.int32, SHARD_HEADER_INTS)[1] == 2  # header version 2
    assert read_shard(shard).tolist() == [69999, 65536, 2, 1, 0]


def test_bytes_are_one_token_each_and_documents_run_together(tmp_path: Path) -> None:
    for i in range(20):
        (tmp_path / "in").mkdir(exist_ok=True)
        (tmp_path / "in" / f"{i:02d}.txt").write_text(f"document {i} é\n")

    dataset = prepare_dataset([tmp_path / "in"], tmp_path / "ds", None, workers=1)

    texts = [f"document {i} é\n".encode() for i in range(20)]
    train = read_shard(dataset.shard_paths("train")[0])
    assert bytes(train.astype(np.uint8)) == b"".join(texts[:19])
    assert bytes(read_shard(dataset.shard_paths("val")[0]).astype(np.uint8)) == texts[19]
    assert dataset.tokenizer.kind == "bytes" and dataset.vocab_size == 256
    assert dataset.bytes_per_token == 1.0 and not (tmp_path / "ds" / "tokenizer.json").exists()


def test_too_few_documents_for_a_val_split_is_an_error_that_leaves_nothing(
    tmp_path: Path,
) -> None:
    (tmp_path / "a.txt").write_text("one document")

    with pytest.raises(DataError, match=r"too few documents \(1\) to hold out 0\.05 .* takes 20;"):
        prepare_dataset([tmp_path / "a.txt"], tmp_path / "ds", None)

    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize("name", ["cut.jsonl.gz", "cut.jsonl.zst"])
def test_a_truncated_compressed_file_is_an_error_naming_it(
    docs: list[str], tmp_path: Path, name: str
) -> None:
    data = "".join(json.dumps({"text": t}) + "\n" for t in docs).encode()
    packed = gzip.compress(data) if name.endswith(".gz") else zstandard.compress(data)
    (tmp_path / name).write_bytes(packed[: len(packed) // 2])

    with pytest.raises(DataError, match=rf"{name}: unreadable after line \d+"):
        prepare_dataset([tmp_path / name], tmp_path / "ds", None, workers=1)

    assert not (tmp_path / "ds").exists()

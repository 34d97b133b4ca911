"""`trainctl data tokenizer train` and `trainctl data prepare`: what they print where, and
their exit codes. No service: these commands work on local files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.service.cli.invoke import NO_CONFIG, trainctl
from tests.support.datasets import stdlib_files
from tests.support.polling import poll
from tests.support.service_process import REPO
from trainctl.store.data.datasets import read_dataset


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Stdlib source as 60 JSONL documents, under `content`, and one line that is not JSON."""
    folder = tmp_path_factory.mktemp("corpus")
    with open(folder / "docs.jsonl", "w") as f:
        for i, path in enumerate(stdlib_files(3_000_000)[:60]):
            f.write(json.dumps({"id": i, "content": path.read_text()[:8000]}) + "\n")
            if i == 2:
                f.write("{oops\n")
    return folder


@pytest.mark.slow
def test_train_a_tokenizer_then_prepare_a_dataset_with_it(corpus: Path, tmp_path: Path) -> None:
    code, out, err = trainctl(
        None, "data", "tokenizer", "train", corpus, "--vocab-size", "600",
        "--out", tmp_path / "tok", "--text-field", "content",
    )  # fmt: skip

    tokenizer = tmp_path / "tok" / "tokenizer.json"
    assert code == 0, err
    assert out == (
        f"wrote {tokenizer}: byte-level BPE, vocabulary 600 (asked 600), <|endoftext|> = 0; "
        f"prepare with --tokenizer {tokenizer}\n"
    )
    assert err.startswith("tokenizer: done: 60 documents, ")
    assert f"skipped 1 document (not in the output); the first:\n  {corpus}/docs.jsonl:4: " in err

    code, out, err = trainctl(
        None, "data", "prepare", corpus, "--out", tmp_path / "ds", "--tokenizer", tokenizer,
        "--text-field", "content", "--val-fraction", "0.1",
    )  # fmt: skip

    assert code == 0, err
    dataset = read_dataset(tmp_path / "ds")
    train, val = dataset.splits["train"], dataset.splits["val"]
    assert out == (
        f"prepared {tmp_path / 'ds'}: {train.tokens:,} train tokens in 1 shard, "
        f"{val.tokens:,} val tokens in 1 shard; 54 + 6 documents; vocabulary 600 (BPE, uint16); "
        f"{dataset.bytes_per_token:.3f} bytes per token\n"
        f"train on it with --dataset {tmp_path / 'ds'}\n"
    )
    assert err.startswith(f"prepare: 60 documents, {train.tokens + val.tokens:,} tokens, ")
    assert "tokens/s, 1 skipped in " in err and f"{corpus}/docs.jsonl:4: not valid JSON" in err


def test_strict_exits_2_naming_the_line_and_leaves_no_folder(corpus: Path, tmp_path: Path) -> None:
    code, out, err = trainctl(
        None, "data", "prepare", corpus, "--out", tmp_path / "ds", "--text-field", "content",
        "--strict", "--workers", "1",
    )  # fmt: skip

    assert code == 2 and out == ""
    assert err.startswith(f"error: {corpus}/docs.jsonl:4: not valid JSON")
    assert err.count("\n") == 1 and not (tmp_path / "ds").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing"], "error: {tmp}/missing: no such file or folder"),
        (["corpus", "--tokenizer", "corpus/docs.jsonl"], "not a tokenizer.json that tokenizers"),
        (["corpus", "--tokenizer", "nope.json"], "error: {tmp}/nope.json: no such tokenizer file"),
        (["corpus", "--text-field", "absent"], "error: no documents to prepare (61 skipped; "),
        (["corpus", "--val-fraction", "0.9"], "error: Invalid value for '--val-fraction'"),
        (["corpus", "--out", "corpus"], "corpus is not empty; prepare into a new or empty folder"),
    ],
)
def test_bad_input_is_one_error_line_and_exit_2(
    corpus: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "corpus").symlink_to(corpus)
    paths = [str(tmp_path / a) if a in ("missing", "corpus", "nope.json") or "/" in a else a
             for a in args]  # fmt: skip
    out_args = [] if "--out" in args else ["--out", str(tmp_path / "ds")]

    code, out, err = trainctl(None, "data", "prepare", *paths, *out_args, "--workers", "1")

    assert code == 2 and out == ""
    assert message.format(tmp=tmp_path) in err and err.count("\n") == 1, err
    assert not (tmp_path / "ds").exists()


def test_bytes_is_the_default_and_the_workers_default_to_every_core(
    corpus: Path, tmp_path: Path
) -> None:
    code, out, err = trainctl(
        None, "data", "prepare", corpus, "--out", tmp_path / "ds", "--text-field", "content"
    )

    dataset = read_dataset(tmp_path / "ds")
    assert code == 0, err
    assert dataset.tokenizer.kind == "bytes" and "vocabulary 256 (bytes, uint16); 1.000" in out


@pytest.mark.slow
def test_a_parquet_corpus_prepares_through_the_cli_to_the_jsonl_corpus_s_shards(
    corpus: Path, tmp_path: Path
) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    lines = (corpus / "docs.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines if line.startswith('{"id"')]  # not the bad one
    (tmp_path / "pq").mkdir()
    table = pa.table({"id": [r["id"] for r in rows], "content": [r["content"] for r in rows]})
    pq.write_table(table, tmp_path / "pq" / "docs.parquet", row_group_size=7)
    code, _, err = trainctl(
        None, "data", "tokenizer", "train", corpus, "--vocab-size", "400",
        "--out", tmp_path / "tok", "--text-field", "content",
    )  # fmt: skip
    assert code == 0, err

    for name, source, option in [
        ("jsonl", corpus, "--text-field"), ("parquet", tmp_path / "pq", "--text-column"),
    ]:  # fmt: skip
        code, out, err = trainctl(
            None, "data", "prepare", source, "--out", tmp_path / name,
            "--tokenizer", tmp_path / "tok", option, "content", "--workers", "2",
        )  # fmt: skip
        assert code == 0 and "57 + 3 documents" in out, err

    jsonl, parquet = read_dataset(tmp_path / "jsonl"), read_dataset(tmp_path / "parquet")
    assert jsonl.splits == parquet.splits and jsonl.tokenizer == parquet.tokenizer
    for shard in jsonl.shard_paths("train") + jsonl.shard_paths("val"):
        assert shard.read_bytes() == (tmp_path / "parquet" / shard.name).read_bytes()


@pytest.mark.slow
def test_ctrl_c_stops_a_prepare_with_130_and_removes_what_it_wrote(tmp_path: Path) -> None:
    """Ctrl-C asks the prepare to stop (its `should_stop`) rather than raising wherever the
    main thread is, so its cleaning up runs: no folder is left, and no tokenizing process."""
    big = tmp_path / "big.jsonl"
    line = json.dumps({"text": "the quick brown fox jumps over the lazy dog " * 40}) + "\n"
    big.write_text(line * 40_000)  # 70 MB: seconds to prepare, far longer than the poll below
    out = tmp_path / "ds"
    env = {**os.environ, "XDG_CONFIG_HOME": str(NO_CONFIG)}
    with subprocess.Popen(
        [sys.executable, "-m", "trainctl.service.cli", "data", "prepare", big, "--out", out,
         "--workers", "2"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as prepare:  # fmt: skip
        try:
            poll(out.is_dir, timeout=60, what="the prepare to claim its folder", interval=0.01)
            prepare.send_signal(signal.SIGINT)
            assert prepare.wait(timeout=60) == 130
        finally:
            prepare.kill()
        stdout, stderr = prepare.communicate()
    assert stdout == ""
    assert stderr == (
        "stopping the prepare (Ctrl-C); removing what it wrote\n"
        "error: the prepare was stopped; nothing of it is left\n"
    )
    assert not out.exists()

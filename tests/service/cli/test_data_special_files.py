"""`trainctl data prepare` and `data tokenizer train` on folders holding what others can
plant: a FIFO is an error naming it (exit 2), never a read that waits for a writer, and link
loops are walked past (docs/design/data.md, "Datasets", "Walks and opens")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.support.special_files import plant, self_loops, without_blocking
from trainctl.service.cli import app
from trainctl.store.data.datasets import read_dataset


def trainctl(*args: str | Path) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, [str(a) for a in args], env={"TRAINCTL_DEBUG": None})
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    for i in range(30):
        line = json.dumps({"text": f"def f{i}(x):\n    return x + {i}\n" * 20})
        (folder / "sub" / f"{i:02d}.jsonl").write_text(line + "\n")
    return folder


@pytest.mark.parametrize("where", ["named", "in the folder"])
@pytest.mark.parametrize("command", ["prepare", "tokenizer"])
def test_a_fifo_among_the_inputs_is_an_error_naming_it(
    corpus: Path, tmp_path: Path, where: str, command: str
) -> None:
    plant(corpus / "sub" / "pipe.jsonl", "fifo")
    inputs = [corpus / "sub" / "pipe.jsonl"] if where == "named" else [corpus]
    args: list[str | Path] = (
        ["data", "prepare", *inputs, "--out", tmp_path / "ds", "--workers", "1"]
        if command == "prepare"
        else ["data", "tokenizer", "train", *inputs, "--vocab-size", "300", "--out", tmp_path]
    )

    code, _, err = without_blocking(lambda: trainctl(*args), "the command")

    assert code == 2, err
    assert f"{corpus / 'sub' / 'pipe.jsonl'}: a FIFO, not a regular file" in err
    assert not (tmp_path / "ds").exists()


def test_link_loops_in_an_input_folder_are_walked_past(corpus: Path, tmp_path: Path) -> None:
    self_loops(corpus, "a", "b")
    self_loops(corpus / "sub", "c")

    code, _, err = without_blocking(
        lambda: trainctl("data", "prepare", corpus, "--out", tmp_path / "ds", "--workers", "1"),
        "the prepare",
    )

    assert code == 0, err
    assert len(read_dataset(tmp_path / "ds").sources) == 30

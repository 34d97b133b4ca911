"""Data mixtures on the worker (docs/design/data.md, "Data mixtures"): each sequence's dataset
a pure function of (seed, position) whose proportions follow the weights, every dataset read on
from its own position across a resume and a fork, and each one's tokens counted."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.support.datasets import stdlib_texts, train_tokenizer, write_bpe_dataset
from tests.support.stores import dataset_store, folder, posix_store
from tests.support.train_script import run_script
from trainctl.store.checkpoints.manifests import METADATA_FILE, MODEL_FILE
from trainctl.store.data.datasets import TOKENIZER_FILE
from trainctl.store.kinds.train import TrainPlan, TrainRequest, resolve_train
from trainctl.worker.data.mixtures import count_sources
from trainctl.worker.training.hooks import TrainerHooks
from trainctl.worker.training.loop import build_mixture, train

TEXTS = stdlib_texts(150_000)
NAMES = ("web", "code", "docs")
SEQ_LEN, MICRO, ACCUM = 32, 4, 2


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three BPE datasets of one tokenizer, each a third of the texts."""
    root = tmp_path_factory.mktemp("mixture")
    tokenizer = train_tokenizer(root / TOKENIZER_FILE, TEXTS, 384)
    third = len(TEXTS) // 3
    for i, name in enumerate(NAMES):
        write_bpe_dataset(root / "datasets" / name, tokenizer, TEXTS[i * third : (i + 1) * third])
    return root / "datasets"


def mixture_plan(
    datasets: Path,
    checkpoints: Path | None = None,
    sources: tuple[tuple[str, float], ...] = (("web", 0.7), ("code", 0.3)),
    seed: int = 0,
    **request: Any,
) -> TrainPlan:
    request = {
        "experiment": "mix",
        "steps": 8,
        "checkpoint_every": 4,
        "log_every": 1,
        "val_batches": 1,
        "model": {"preset": "tiny"},
        "batch": {"micro_batch_size": MICRO, "seq_len": SEQ_LEN, "grad_accum_steps": ACCUM},
        "data": {"mixture": [{"dataset": n, "weight": w} for n, w in sources], "seed": seed},
        **request,
    }
    return resolve_train(
        TrainRequest(**request),
        cuda_available=False,
        data_roots=[],
        datasets=dataset_store(datasets.parent),
        checkpoints=posix_store(checkpoints) if checkpoints is not None else None,
    )


def metadata(checkpoints: Path, experiment: str, tag: str) -> dict[str, Any]:
    where = folder(posix_store(checkpoints), experiment, tag)
    saved: dict[str, Any] = json.loads((where / METADATA_FILE).read_text())
    return saved


def by_name(saved: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in saved["data_sources"]}


@pytest.mark.parametrize("weights", [(0.7, 0.3), (0.5, 0.3, 0.2)], ids=["two", "three"])
def test_the_realised_proportions_over_10000_sequences_are_within_3_sd_of_the_weights(
    datasets: Path, weights: tuple[float, ...]
) -> None:
    sampler, _ = build_mixture(
        mixture_plan(datasets, sources=tuple(zip(NAMES[: len(weights)], weights, strict=True)))
    )
    n = 10_000

    counts = sampler.sequences_at(n // MICRO)

    assert counts.sum() == n
    for count, weight in zip(counts, weights, strict=True):
        sd = math.sqrt(n * weight * (1 - weight))  # binomial
        assert abs(count - n * weight) <= 3 * sd, (count, n * weight, sd)


def test_the_choice_is_a_pure_function_of_seed_and_position(datasets: Path) -> None:
    a, _ = build_mixture(mixture_plan(datasets))
    b, _ = build_mixture(mixture_plan(datasets))
    other, _ = build_mixture(mixture_plan(datasets, seed=1))

    far = b.batch(40)  # asked first, out of order: nothing depends on what came before
    order = np.concatenate([a.choices(p) for p in range(50)])

    assert np.array_equal(order, np.concatenate([b.choices(p) for p in range(50)]))
    assert all(torch.equal(x, y) for x, y in zip(a.batch(40), far, strict=True))
    assert all(
        torch.equal(x, y) for p in (0, 1, 2) for x, y in zip(a.batch(p), b.batch(p), strict=True)
    )
    assert set(order.tolist()) == {0, 1}
    assert not np.array_equal(order, np.concatenate([other.choices(p) for p in range(50)]))


@pytest.mark.slow
def test_resume_in_the_middle_of_a_mixture_is_bit_exact(datasets: Path, tmp_path: Path) -> None:
    common: dict[str, Any] = {"steps": 12, "checkpoint_every": 4}
    straight = run_script(mixture_plan(datasets, experiment="straight", **common), tmp_path)
    first = run_script(mixture_plan(datasets, experiment="resumed", **common), tmp_path, 6)
    stopped = by_name(metadata(tmp_path, "resumed", "step_6"))
    resumed = mixture_plan(datasets, tmp_path, experiment="resumed", resume_from="latest", **common)
    second = run_script(resumed, tmp_path)  # a fresh process, as a requeued run's worker

    assert 0 < stopped["code"]["sequences"] < stopped["web"]["sequences"]
    assert [r["step"] for r in first + second] == list(range(1, 13))
    assert [r["loss"] for r in first + second] == [r["loss"] for r in straight]
    a = load_file(str(folder(posix_store(tmp_path), "straight", "step_12") / MODEL_FILE))
    b = load_file(str(folder(posix_store(tmp_path), "resumed", "step_12") / MODEL_FILE))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert by_name(metadata(tmp_path, "straight", "step_12")) == by_name(
        metadata(tmp_path, "resumed", "step_12")
    )


@pytest.mark.slow
def test_each_datasets_tokens_are_reported_and_add_up_to_the_tokens_seen(
    datasets: Path, tmp_path: Path
) -> None:
    plan = mixture_plan(datasets)
    metrics: list[dict[str, Any]] = []
    store = posix_store(tmp_path)

    result = train(plan, store, hooks=TrainerHooks(on_metrics=metrics.append))

    steps = [m for m in metrics if m["kind"] == "train"]
    assert [m["step"] for m in steps] == list(range(1, 9))
    for m in steps:
        assert m["tokens/web"] + m["tokens/code"] == m["tokens"]
    assert result["source_tokens"] == {
        "web": steps[-1]["tokens/web"],
        "code": steps[-1]["tokens/code"],
    }
    assert (
        sum(result["source_tokens"].values())
        == result["token_count"]
        == 8 * ACCUM * MICRO * SEQ_LEN
    )
    assert store.get("mix", "step_8").source_tokens == result["source_tokens"]
    # Each dataset's position is the count of the sequences the pure choice gave it.
    fresh, _ = build_mixture(plan)
    saved = by_name(metadata(tmp_path, "mix", "step_8"))
    for name, sequences in zip(("web", "code"), fresh.sequences_at(8 * ACCUM), strict=True):
        assert saved[name]["sequences"] == sequences
        assert saved[name]["tokens"] == sequences * SEQ_LEN
    val = [m for m in metrics if m["kind"] == "val"]
    assert val and all(math.isfinite(m["val_bits_per_byte"]) for m in val)


@pytest.mark.slow
def test_a_fork_that_changes_the_mixture_continues_the_datasets_it_shares_and_starts_the_new(
    datasets: Path, tmp_path: Path
) -> None:
    train(
        mixture_plan(datasets, sources=(("web", 1), ("code", 1)), experiment="parent", steps=4),
        posix_store(tmp_path),
    )
    new = (("code", 1.0), ("docs", 3.0))
    plan = mixture_plan(
        datasets, tmp_path, sources=new, experiment="fork", fork_from="parent/step_4"
    )

    result = train(plan, posix_store(tmp_path))

    parent = by_name(metadata(tmp_path, "parent", "step_4"))
    fork = by_name(metadata(tmp_path, "fork", "step_8"))
    first, count = 4 * ACCUM * MICRO, 4 * ACCUM * MICRO  # the fork's sequences: steps 5 to 8
    code, docs = count_sources(0, first, count, np.array([0.25, 1.0]))
    assert set(fork) == {"code", "docs"}
    assert fork["code"]["sequences"] == parent["code"]["sequences"] + code
    assert fork["code"]["tokens"] == parent["code"]["tokens"] + code * SEQ_LEN
    assert fork["docs"]["sequences"] == docs and fork["docs"]["tokens"] == docs * SEQ_LEN
    assert result["source_tokens"] == {"code": fork["code"]["tokens"], "docs": docs * SEQ_LEN}

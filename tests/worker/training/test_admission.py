"""Admission at claim (worker/training/memory.py): a transformers model's real parameter count,
counted on the meta device, against the worker's memory budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.hf_archs import hf
from tests.support.plans import enqueue, train_plan, validate_plan
from tests.support.registries import registered
from tests.support.stores import posix_store
from trainctl.store.db.runs import RunStore
from trainctl.store.kinds.train import train_need
from trainctl.store.models.hf_catalog import SUPPORTED_MODEL_TYPES
from trainctl.store.training.memory import GIB
from trainctl.store.worker_settings import WorkerSettings
from trainctl.worker.exceptions import DoesNotFit
from trainctl.worker.models import build_model
from trainctl.worker.models.plugin import MODEL_PLUGINS
from trainctl.worker.runner import Worker
from trainctl.worker.training.loop import train
from trainctl.worker.training.memory import admit_at_claim


def test_the_count_at_claim_is_the_built_models_and_goes_through_the_submit_estimate() -> None:
    plan = train_plan(steps=1, model={"hf": hf("qwen3_moe")}, batch={"seq_len": 64})
    real = sum(p.numel() for p in build_model(plan.model.config).parameters())
    assert admit_at_claim(plan, memory_bytes=None) == real
    # The same bytes-per-parameter rule as submit's estimate, with the real count.
    assert admit_at_claim(plan, train_need(plan, real).estimate.total) == real


def test_a_run_too_big_for_the_worker_fails_at_claim_naming_both_numbers_without_an_attempt(
    tmp_path: Path,
) -> None:
    runs = RunStore(f"sqlite:///{tmp_path / 'trainctl.db'}")
    runs.create_all()
    # 1 GiB is the runtime alone (store.training.memory): no model fits.
    config = WorkerSettings(
        database_url=runs.engine.url.render_as_string(),
        data_dir=tmp_path,
        worker_id="w1",
        worker_memory_bytes=GIB,
    )
    worker = Worker(config, runs)
    worker.register()
    assert runs.workers.list_workers()[0].info["memory_bytes"] == GIB  # reported as its memory
    plan = train_plan(steps=1, model={"hf": hf("qwen3_moe")}, batch={"seq_len": 64})
    queued = enqueue(runs, plan)
    claimed = worker.claim()
    assert claimed is not None and claimed.id == queued.id
    worker.run_one(claimed)
    run = runs.get(queued.id)
    real = sum(p.numel() for p in build_model(plan.model.config).parameters())
    assert run.state == "failed" and run.attempt == 1
    assert run.error is not None
    assert f"its model has {real:,} parameters" in run.error
    assert f"more than the {GIB:,} bytes (1.0 GiB) this worker has" in run.error
    assert worker.claim() is None  # failed, not requeued: it cannot cycle between workers
    runs.close()


def test_every_kind_that_builds_the_model_is_counted_at_claim_not_only_train(
    tmp_path: Path,
) -> None:
    """A validation of a transformers checkpoint: its model is counted as a train run's is,
    and on a worker too small for it the run fails at claim, before loading anything."""
    checkpoints = tmp_path / "checkpoints"
    trained = train_plan(
        checkpoints, experiment="moe", steps=1, model={"hf": hf("qwen3_moe")},
        batch={"micro_batch_size": 1, "seq_len": 16}, data={"source": "synthetic"},
        checkpoint_every=1, val_batches=1,
    )  # fmt: skip
    train(trained, posix_store(checkpoints))
    plan = validate_plan(checkpoints, checkpoint="moe/step_1", num_batches=1)
    real = sum(p.numel() for p in build_model(plan.model).parameters())
    assert admit_at_claim(plan, memory_bytes=None) == real
    with pytest.raises(DoesNotFit, match=f"its model has {real:,} parameters"):
        admit_at_claim(plan, memory_bytes=GIB)

    runs = RunStore(f"sqlite:///{tmp_path / 'trainctl.db'}")
    runs.create_all()
    config = WorkerSettings(
        database_url=runs.engine.url.render_as_string(),
        data_dir=tmp_path,
        worker_id="w1",
        worker_memory_bytes=GIB,
    )
    worker = Worker(config, runs)
    worker.register()
    queued = enqueue(runs, plan)
    claimed = worker.claim()
    assert claimed is not None and claimed.id == queued.id
    worker.run_one(claimed)
    run = runs.get(queued.id)
    assert run.state == "failed" and run.attempt == 1
    assert run.error is not None and "this validation does not fit this worker" in run.error
    runs.close()


def test_a_plug_in_model_is_counted_on_the_meta_device_too() -> None:
    from tests.plugins.trainctl_tinylm import MODEL

    with registered((MODEL_PLUGINS, "tiny_mlp_admission", MODEL)):
        config = {"vocab_size": 256, "max_seq_len": 64, "d_model": 32}
        plan = train_plan(
            steps=1,
            model={"plugin": {"name": "tiny_mlp_admission", "config": config}},
            batch={"seq_len": 64},
        )
        real = sum(p.numel() for p in build_model(plan.model.config).parameters())
        assert admit_at_claim(plan, memory_bytes=None) == real


def test_a_worker_reports_the_transformers_model_types_it_trains(tmp_path: Path) -> None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    runs = RunStore(f"sqlite:///{tmp_path / 'trainctl.db'}")
    runs.create_all()
    Worker(
        WorkerSettings(
            database_url=runs.engine.url.render_as_string(), data_dir=tmp_path, worker_id="w1"
        ),
        runs,
    ).register()
    reported = runs.workers.list_workers()[0].hf_model_types
    # Of what its transformers builds, the types trainctl trains (GET /models lists them).
    assert set(reported) == set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) & SUPPORTED_MODEL_TYPES
    assert {"qwen3_next", "mamba", "rwkv"} <= set(reported) and "bert" not in reported
    runs.close()

"""The clients' sample and export calls, sync and async, against a real uvicorn server.

No worker runs here: what a worker would write (a sample run's events, an export folder) is
written into the stores as the worker writes it; tests/service/cli/test_cli_sample.py runs the
real worker.
"""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastapi import FastAPI

from tests.service.fakes import save_checkpoint
from tests.service.sdk.clients import run_async
from trainctl.service.schemas import CheckpointPublic
from trainctl.service.sdk.async_client import AsyncTrainctlClient
from trainctl.service.sdk.client import (
    Conflict,
    InvalidRequest,
    NotFound,
    SamplePiece,
    TrainctlClient,
    TrainingSample,
)
from trainctl.store.checkpoints.manifests import MODEL_FILE
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.db.runs import RunStore

BYTES = {"tokenizer": {"kind": "bytes", "sha256": None}}  # metadata of a byte-level checkpoint
PIECES = [  # two completions decoded together: their pieces interleave
    {"index": 0, "delta": "def", "finish_reason": None},
    {"index": 1, "delta": "import", "finish_reason": None},
    {"index": 0, "delta": " f():", "finish_reason": "length"},
    {"index": 1, "delta": "", "finish_reason": "eot"},
]


def stores(app: FastAPI) -> tuple[RunStore, CheckpointStore, CheckpointStore]:
    """The app's runs, checkpoints and exports."""
    return app.state.runs, app.state.checkpoints, app.state.exports


def play_sample_run(runs: RunStore, run_id: str) -> int:
    """What a worker writes for a sample run: its pieces, then success; the first piece's id."""
    claimed = runs.claim("w", lease_seconds=60)
    assert claimed is not None and claimed.id == run_id
    first = runs.append_event(run_id, "sample", PIECES[0])
    for piece in PIECES[1:]:
        runs.append_event(run_id, "sample", piece)
    runs.finish(run_id, "w", claimed.attempt, "succeeded", result={"completions": []})
    return first


def save_export(exports: CheckpointStore) -> str:
    """An export folder as an export run publishes one; the sha256 of its weights."""
    weights = b"exported weights " * 20_000
    save_checkpoint(exports, "exp", step=10, weights=weights)
    return hashlib.sha256(weights).hexdigest()


def test_sample_stream_yields_each_completions_pieces_and_resumes(
    api: TrainctlClient, server_app: FastAPI
) -> None:
    runs, ckpts, _ = stores(server_app)
    save_checkpoint(ckpts, "exp", step=10, metadata=BYTES)
    run = api.submit_sample(checkpoint="exp/step_10", prompts=["def", "import"])
    first = play_sample_run(runs, run.id)

    pieces = list(api.sample_stream(run.id))  # the run's state events are not pieces
    resumed = list(api.sample_stream(run.id, last_event_id=first))

    assert run.kind == "sample" and run.spec["prompt_tokens"] == [list(b"def"), list(b"import")]
    assert pieces == [SamplePiece.model_validate(p) for p in PIECES]
    assert resumed == pieces[1:]
    texts = ["".join(p.delta for p in pieces if p.index == i) for i in (0, 1)]
    assert texts == ["def f():", "import"]
    assert api.wait(run.id, timeout=5).state == "succeeded"


def test_sample_requests_the_checkpoint_cannot_serve_are_invalid(
    api: TrainctlClient, server_app: FastAPI
) -> None:
    _, ckpts, _ = stores(server_app)
    save_checkpoint(ckpts, "exp", step=10)  # trained on synthetic tokens: no tokenizer

    with pytest.raises(InvalidRequest) as text:
        api.submit_sample(checkpoint="exp/step_10", prompts=["def"])
    with pytest.raises(InvalidRequest) as too_long:
        api.submit_sample(
            checkpoint="latest", experiment="exp", prompt_tokens=[[1, 2]],
            generation={"max_new_tokens": 100_000},
        )  # fmt: skip
    tokens = api.submit_sample(checkpoint="latest", experiment="exp", prompt_tokens=[[1, 2]])

    assert "records no tokenizer" in text.value.detail and "prompt_tokens" in text.value.detail
    assert "exceeds the model's context" in too_long.value.detail
    assert tokens.spec["prompt_tokens"] == [[1, 2]]


def test_a_train_runs_sample_events_read_as_training_samples(
    api: TrainctlClient, server_app: FastAPI
) -> None:
    runs, _, _ = stores(server_app)
    run = api.submit_train(experiment="exp", steps=20, device="cpu")
    sample = {"step": 10, "prompt": "def", "completion": " f", "finish_reason": None, "seed": 0}
    runs.append_event(run.id, "log", {"level": "info", "message": "one"})
    runs.append_event(run.id, "sample", sample)
    api.cancel_run(run.id)  # a queued run ends at once: the stream has an end

    read = [TrainingSample.from_event(e) for e in api.events(run.id)]

    assert read == [None, TrainingSample(**sample), None]  # the log, the sample, the state


@pytest.mark.slow
def test_exports_are_listed_read_downloaded_and_deleted_like_checkpoints(
    api: TrainctlClient, server_app: FastAPI, tmp_path: Path
) -> None:
    _, ckpts, exports = stores(server_app)
    sha256 = save_export(exports)
    save_checkpoint(ckpts, "exp", step=20)  # a checkpoint is not an export
    seen: list[tuple[int, int | None]] = []

    listed = api.list_exports()
    mine, elsewhere = api.list_exports(experiment="exp"), api.list_exports(experiment="other")
    export = api.get_export("exp", "step_10")
    file = api.download_export_file(
        "exp", "step_10", MODEL_FILE, tmp_path, on_progress=lambda *p: seen.append(p)
    )
    archive = api.download_export_archive("exp", "step_10", tmp_path)
    deleted = api.delete_export("exp", "step_10")

    assert [(e.experiment, e.tag) for e in listed] == [("exp", "step_10")] and listed == [export]
    assert mine == listed and elsewhere == [] and api.list_exports() == []  # filtered; deleted
    assert hashlib.sha256(file.read_bytes()).hexdigest() == sha256
    assert seen[-1] == (file.stat().st_size, file.stat().st_size)
    with tarfile.open(archive) as tar:
        assert f"step_10/{MODEL_FILE}" in tar.getnames()
    assert deleted == export
    with pytest.raises(NotFound):
        api.get_export("exp", "step_10")
    assert api.get_checkpoint("exp", "step_20").tag == "step_20"  # the other store is untouched


def test_an_export_of_a_checkpoint_being_exported_is_a_conflict(
    api: TrainctlClient, server_app: FastAPI
) -> None:
    _, ckpts, _ = stores(server_app)
    save_checkpoint(ckpts, "exp", step=10)

    run = api.submit_export(checkpoint="exp/step_10", dtype="bfloat16")
    with pytest.raises(Conflict) as second:
        api.submit_export(checkpoint="latest", experiment="exp")

    assert run.kind == "export" and run.spec["dtype"] == "bfloat16"
    assert f"being exported by run {run.id}" in second.value.detail


# --- the async client: the same calls ---


def test_the_async_client_samples_and_streams_the_pieces(server_app: FastAPI) -> None:
    runs, ckpts, _ = stores(server_app)
    save_checkpoint(ckpts, "exp", step=10, metadata=BYTES)

    async def scenario(api: AsyncTrainctlClient) -> tuple[str, list[SamplePiece], str]:
        run = await api.submit_sample(checkpoint="exp/step_10", prompts=["def", "import"])
        with pytest.raises(InvalidRequest) as negative:
            await api.submit_sample(prompts=["def"], generation={"temperature": -1.0})
        await anyio.to_thread.run_sync(play_sample_run, runs, run.id)
        pieces = [piece async for piece in api.sample_stream(run.id)]
        return run.kind, pieces, negative.value.detail

    kind, pieces, negative = run_async(server_app, scenario)

    assert kind == "sample"
    assert pieces == [SamplePiece.model_validate(p) for p in PIECES]
    assert "temperature must be >= 0" in negative


@pytest.mark.slow
def test_the_async_client_lists_reads_downloads_deletes_and_submits_exports(
    server_app: FastAPI, tmp_path: Path
) -> None:
    _, ckpts, exports = stores(server_app)
    sha256 = save_export(exports)
    save_checkpoint(ckpts, "exp", step=20)

    async def scenario(api: AsyncTrainctlClient) -> dict[str, Any]:
        listed = await api.list_exports()
        export = await api.get_export("exp", "step_10")
        file = await api.download_export_file("exp", "step_10", MODEL_FILE, tmp_path)
        archive = await api.download_export_archive("exp", "step_10", tmp_path / "e.tar")
        deleted = await api.delete_export("exp", "step_10")
        with pytest.raises(NotFound):
            await api.get_export("exp", "step_10")
        run = await api.submit_export(checkpoint="exp/step_20")
        return {"listed": listed, "export": export, "file": file, "archive": archive,
                "deleted": deleted, "kind": run.kind}  # fmt: skip

    got = run_async(server_app, scenario)

    export: CheckpointPublic = got["export"]
    assert got["listed"] == [export] and got["deleted"] == export
    assert hashlib.sha256(got["file"].read_bytes()).hexdigest() == sha256
    with tarfile.open(got["archive"]) as tar:
        assert f"step_10/{MODEL_FILE}" in tar.getnames()
    assert got["kind"] == "export"

"""The httpx clients, sync and async, against a real uvicorn server (a thread, a free port)."""

from __future__ import annotations

import hashlib
import inspect
import tarfile
from pathlib import Path

import anyio
import pytest
from fastapi import FastAPI

from tests.service.fakes import save_checkpoint
from tests.service.sdk.clients import CPU_TRAIN, run_async
from tests.service.serving import serve
from tests.support.stores import folder
from trainctl.service.app import create_app
from trainctl.service.schemas import ModelsPublic
from trainctl.service.sdk.async_client import AsyncTrainctlClient
from trainctl.service.sdk.client import ApiError, DownloadError, TrainctlClient
from trainctl.service.settings import Settings
from trainctl.store.checkpoints.manifests import MODEL_FILE
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.db.runs import RunStore
from trainctl.store.models.presets import PRESETS


def test_submit_get_and_list_round_trip(api: TrainctlClient) -> None:
    run = api.submit_train(**CPU_TRAIN)
    bench = api.submit("benchmark", {"steps": 1, "device": "cpu"}, idempotency_key="b1")
    replay = api.submit("benchmark", {"steps": 1, "device": "cpu"}, idempotency_key="b1")

    assert api.get_run(run.id) == run
    assert replay.id == bench.id
    assert [r.id for r in api.list_runs(kind="train").items] == [run.id]
    assert [r.id for r in api.iter_runs(limit=1)] == [bench.id, run.id]
    assert api.health().status == "ok"
    assert api.workers() == []


def test_errors_raise_api_error_with_the_servers_detail(api: TrainctlClient) -> None:
    with pytest.raises(ApiError) as missing:
        api.get_run("nope")
    with pytest.raises(ApiError) as invalid:
        api.submit_train(steps=0)

    assert missing.value.status_code == 404
    assert "run 'nope' does not exist" in str(missing.value)
    assert invalid.value.status_code == 422
    assert "body.steps" in invalid.value.detail


def test_events_follow_the_run_to_its_end_and_resume(api: TrainctlClient, runs: RunStore) -> None:
    run = api.submit_train(**CPU_TRAIN)
    first = runs.append_event(run.id, "log", {"level": "info", "message": "one"})
    runs.append_event(run.id, "metrics", {"kind": "train", "step": 1, "loss": 4.2})
    claimed = runs.claim("w", lease_seconds=60)
    assert claimed is not None
    runs.finish(run.id, "w", claimed.attempt, "succeeded", result={"loss": 4.2})

    events = list(api.events(run.id))
    resumed = list(api.events(run.id, last_event_id=first))

    assert [e.type for e in events] == ["log", "metrics", "state", "state"]
    assert resumed == events[1:]
    assert api.metrics(run.id, kind="train")[0].model_extra == {"step": 1, "loss": 4.2}
    assert api.logs(run.id)[0].message == "one"
    assert api.wait(run.id, timeout=5).result == {"loss": 4.2}


def test_cancel_then_wait_returns_the_cancelled_run(api: TrainctlClient) -> None:
    run = api.submit_train(**CPU_TRAIN)

    api.cancel_run(run.id)

    assert api.wait(run.id, timeout=5).state == "cancelled"


def test_wait_times_out_on_a_run_that_does_not_finish(api: TrainctlClient) -> None:
    run = api.submit_train(**CPU_TRAIN)

    with pytest.raises(TimeoutError, match="still queued"):
        api.wait(run.id, timeout=0.3, poll=0.05)


def test_downloads_land_on_disk_verified(
    api: TrainctlClient, ckpts: CheckpointStore, tmp_path: Path
) -> None:
    save_checkpoint(ckpts, "exp", step=10, weights=b"w" * 300_000)
    entry = next(f for f in api.get_checkpoint("exp", "step_10").files if f.name == MODEL_FILE)

    file = api.download_file("exp", "step_10", MODEL_FILE, tmp_path)
    archive = api.download_archive("exp", "step_10", tmp_path)

    assert file == tmp_path / MODEL_FILE
    assert hashlib.sha256(file.read_bytes()).hexdigest() == entry.sha256
    with tarfile.open(archive) as tar:
        assert f"step_10/{MODEL_FILE}" in tar.getnames()
    assert api.latest_checkpoint("exp").tag == "step_10"
    assert [c.tag for c in api.list_checkpoints()] == ["step_10"]


def test_a_download_that_does_not_match_the_manifest_raises_and_leaves_no_file(
    api: TrainctlClient, ckpts: CheckpointStore, tmp_path: Path
) -> None:
    save_checkpoint(ckpts, "exp", step=10, weights=b"a" * 1000)
    (folder(ckpts, "exp", "step_10") / MODEL_FILE).write_bytes(b"b" * 1000)  # bit rot

    with pytest.raises(DownloadError, match="does not match the manifest"):
        api.download_file("exp", "step_10", MODEL_FILE, tmp_path / "model.bin")

    assert list(tmp_path.glob("model*")) == []


def test_delete_and_prune_through_the_client(api: TrainctlClient, ckpts: CheckpointStore) -> None:
    for step in (10, 20, 30):
        save_checkpoint(ckpts, "exp", step=step)

    dry = api.prune("exp", keep_last=1, dry_run=True)
    deleted = api.delete_checkpoint("exp", "step_10")

    assert [c.tag for c in dry.deleted] == ["step_20", "step_10"]
    assert deleted.tag == "step_10"
    assert [c.tag for c in api.prune("exp", keep_last=1).deleted] == ["step_20"]
    with pytest.raises(ApiError) as gone:
        api.best_checkpoint("exp")
    assert gone.value.status_code == 404


def test_an_interrupted_download_resumes_from_its_part_file(
    api: TrainctlClient, ckpts: CheckpointStore, tmp_path: Path
) -> None:
    weights = bytes(range(256)) * 2000
    save_checkpoint(ckpts, "exp", step=10, weights=weights)
    (tmp_path / "model.bin.part").write_bytes(weights[:100_000])  # what a dropped link left
    seen: list[tuple[int, int | None]] = []

    file = api.download_file(
        "exp", "step_10", MODEL_FILE, tmp_path / "model.bin", on_progress=lambda *p: seen.append(p)
    )

    assert file.read_bytes() == weights
    assert seen[0] == (100_000, len(weights))  # started from the bytes on disk
    assert not (tmp_path / "model.bin.part").exists()


def test_a_part_file_with_wrong_bytes_fails_verification_and_is_removed(
    api: TrainctlClient, ckpts: CheckpointStore, tmp_path: Path
) -> None:
    save_checkpoint(ckpts, "exp", step=10, weights=b"a" * 10_000)
    (tmp_path / "model.bin.part").write_bytes(b"b" * 5_000)

    with pytest.raises(DownloadError, match="does not match the manifest"):
        api.download_file("exp", "step_10", MODEL_FILE, tmp_path / "model.bin")

    assert list(tmp_path.glob("model.bin*")) == []
    assert api.download_file("exp", "step_10", MODEL_FILE, tmp_path / "model.bin").exists()


def test_the_async_client_submits_iterates_and_follows_events(
    server_app: FastAPI, runs: RunStore
) -> None:
    async def scenario() -> tuple[list[str], list[str], str]:
        async with AsyncTrainctlClient(server_app.state.base_url, timeout=10) as api:
            first = await api.submit("train", CPU_TRAIN)
            second = await api.submit("benchmark", {"steps": 1, "device": "cpu"})
            listed = [r.id async for r in api.iter_runs(limit=1)]
            await api.cancel_run(first.id)
            types = [e.type async for e in api.events(first.id)]
            done = await api.wait(first.id, timeout=5)
            return listed, [second.id, first.id, *types], done.state

    listed, expected, state = anyio.run(scenario)

    assert listed == expected[:2]
    assert expected[2:] == ["state"]  # queued -> cancelled
    assert state == "cancelled"


def test_the_client_reads_its_url_and_token_from_the_environment(
    server_app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINCTL_URL", server_app.state.base_url)
    monkeypatch.setenv("TRAINCTL_API_TOKEN", "s3cret")

    with TrainctlClient() as api:
        assert api.base_url.rstrip("/") == server_app.state.base_url
        assert api._http.headers["Authorization"] == "Bearer s3cret"


def test_a_failed_stream_raises_api_error_and_writes_nothing(
    api: TrainctlClient, tmp_path: Path
) -> None:
    with pytest.raises(ApiError) as no_run:
        list(api.events("nope"))
    with pytest.raises(ApiError) as no_checkpoint:
        api.download_archive("exp", "step_10", tmp_path / "exp.tar")

    assert no_run.value.status_code == no_checkpoint.value.status_code == 404
    assert "run 'nope' does not exist" in no_run.value.detail
    assert list(tmp_path.glob("exp.tar*")) == []


# --- the async client: the same calls, so the same tests ---


def public(client: type) -> set[str]:
    """Its public attributes but closing, which is close or aclose as in httpx."""
    return {name for name in dir(client) if not name.startswith("_")} - {"close", "aclose"}


def test_both_clients_have_the_same_calls_with_the_same_parameters() -> None:
    assert public(AsyncTrainctlClient) == public(TrainctlClient)
    for name in public(TrainctlClient) - {"base_url"}:
        sync = inspect.signature(getattr(TrainctlClient, name))
        twin = inspect.signature(getattr(AsyncTrainctlClient, name))
        is_iterator = sync.return_annotation.startswith("Iterator[")
        assert twin.parameters == sync.parameters, name
        # Iterator[X] becomes AsyncIterator[X]; any other answer X is awaited to give X.
        assert twin.return_annotation == ("Async" if is_iterator else "") + sync.return_annotation
        assert inspect.iscoroutinefunction(getattr(AsyncTrainctlClient, name)) != is_iterator


def test_both_clients_take_the_same_arguments_but_their_transport() -> None:
    sync = inspect.signature(TrainctlClient.__init__).parameters
    twin = inspect.signature(AsyncTrainctlClient.__init__).parameters

    assert list(twin) == list(sync)
    assert [p.replace(annotation="") for p in twin.values()] == [
        p.replace(annotation="") for p in sync.values()
    ]
    assert {n for n in sync if sync[n].annotation != twin[n].annotation} == {"transport"}
    assert {"retries", "backoff"} <= set(sync)


def test_the_async_client_submits_every_kind_and_reads_logs_health_and_readiness(
    server_app: FastAPI, runs: RunStore, ckpts: CheckpointStore
) -> None:
    save_checkpoint(ckpts, "exp", step=10)  # what the validation reads

    async def scenario(api: AsyncTrainctlClient) -> tuple[list[str], list[str], str, int]:
        train = await api.submit_train(**CPU_TRAIN)
        validate = await api.submit_validate(experiment="exp", device="cpu")
        bench = await api.submit_benchmark(steps=1, device="cpu")
        runs.append_event(train.id, "log", {"level": "info", "message": "one"})
        logs = await api.logs(train.id)
        health, readiness = await api.health(), await api.readiness()
        kinds: list[str] = [train.kind, validate.kind, bench.kind]
        return kinds, [line.message for line in logs], health.status, readiness.workers_alive

    kinds, messages, health, workers_alive = run_async(server_app, scenario)

    assert kinds == ["train", "validate", "benchmark"]
    assert messages == ["one"]
    assert health == "ok"
    assert workers_alive == 0


def test_the_async_client_raises_api_error_and_times_out_like_the_sync_one(
    server_app: FastAPI,
) -> None:
    async def scenario(api: AsyncTrainctlClient) -> list[int]:
        with pytest.raises(ApiError) as no_run:
            await api.get_run("nope")
        with pytest.raises(ApiError) as no_stream:
            [event async for event in api.events("nope")]
        run = await api.submit_train(**CPU_TRAIN)
        with pytest.raises(TimeoutError, match="still queued"):
            await api.wait(run.id, timeout=0.3, poll=0.05)
        return [no_run.value.status_code, no_stream.value.status_code]

    assert run_async(server_app, scenario) == [404, 404]


def test_the_async_client_downloads_files_and_archives_verified(
    server_app: FastAPI, ckpts: CheckpointStore, tmp_path: Path
) -> None:
    save_checkpoint(ckpts, "exp", step=10, weights=b"w" * 300_000)

    async def scenario(api: AsyncTrainctlClient) -> tuple[str, Path, Path]:
        checkpoint = await api.get_checkpoint("exp", "step_10")
        file = await api.download_file("exp", "step_10", MODEL_FILE, tmp_path)
        archive = await api.download_archive("exp", "step_10", tmp_path)
        return next(f.sha256 for f in checkpoint.files if f.name == MODEL_FILE), file, archive

    sha256, file, archive = run_async(server_app, scenario)

    assert file == tmp_path / MODEL_FILE
    assert hashlib.sha256(file.read_bytes()).hexdigest() == sha256
    assert archive == tmp_path / "exp-step_10.tar"
    with tarfile.open(archive) as tar:
        assert f"step_10/{MODEL_FILE}" in tar.getnames()


def test_the_async_client_resumes_an_interrupted_download_from_its_part_file(
    server_app: FastAPI, ckpts: CheckpointStore, tmp_path: Path
) -> None:
    weights = bytes(range(256)) * 2000
    save_checkpoint(ckpts, "exp", step=10, weights=weights)
    (tmp_path / "model.bin.part").write_bytes(weights[:100_000])  # what a dropped link left
    seen: list[tuple[int, int | None]] = []

    async def scenario(api: AsyncTrainctlClient) -> Path:
        dest = tmp_path / "model.bin"
        return await api.download_file(
            "exp", "step_10", MODEL_FILE, dest, on_progress=lambda *p: seen.append(p)
        )

    file = run_async(server_app, scenario)

    assert file.read_bytes() == weights
    assert seen[0] == (100_000, len(weights))  # started from the bytes on disk
    assert not (tmp_path / "model.bin.part").exists()


def test_an_async_download_that_does_not_match_the_manifest_raises_and_leaves_no_file(
    server_app: FastAPI, ckpts: CheckpointStore, tmp_path: Path
) -> None:
    save_checkpoint(ckpts, "exp", step=10, weights=b"a" * 1000)
    (folder(ckpts, "exp", "step_10") / MODEL_FILE).write_bytes(b"b" * 1000)  # bit rot

    async def scenario(api: AsyncTrainctlClient) -> Path:
        return await api.download_file("exp", "step_10", MODEL_FILE, tmp_path / "model.bin")

    with pytest.raises(DownloadError, match="does not match the manifest"):
        run_async(server_app, scenario)

    assert list(tmp_path.glob("model*")) == []


@pytest.mark.slow
def test_the_async_client_deletes_prunes_and_finds_the_best_checkpoint(
    server_app: FastAPI, ckpts: CheckpointStore
) -> None:
    for step in (10, 20, 30):
        save_checkpoint(ckpts, "exp", step=step)
    save_checkpoint(ckpts, "other", "best", step=5, best_loss=1.5)

    async def scenario(api: AsyncTrainctlClient) -> tuple[list[str], str, list[str], str, int]:
        dry = await api.prune("exp", keep_last=1, dry_run=True)
        deleted = await api.delete_checkpoint("exp", "step_10")
        pruned = await api.prune("exp", keep_last=1)
        best = await api.best_checkpoint("other")
        with pytest.raises(ApiError) as no_best:
            await api.best_checkpoint("exp")
        return (
            [c.tag for c in dry.deleted],
            deleted.tag,
            [c.tag for c in pruned.deleted],
            best.tag,
            no_best.value.status_code,
        )

    dry, deleted, pruned, best, no_best = run_async(server_app, scenario)

    assert dry == ["step_20", "step_10"]
    assert deleted == "step_10"
    assert pruned == ["step_20"]
    assert best == "best"
    assert no_best == 404


def test_both_clients_submit_a_prepare_run(tmp_path: Path) -> None:
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("some text")
    settings = Settings(data_dir=tmp_path / "data", workers=0, data_roots=[tmp_path / "corpus"])

    async def submit_async(url: str) -> str:
        async with AsyncTrainctlClient(url, timeout=10) as api:
            return (await api.submit_prepare(name="two", inputs=["a.txt"])).experiment

    with serve(create_app(settings)) as url:
        with TrainctlClient(url, timeout=10) as api:
            run = api.submit_prepare(name="one", inputs=["a.txt"], tokenizer="bytes")
        twin = anyio.run(submit_async, url)

    assert (run.kind, run.experiment, twin) == ("prepare", "one", "two")


def test_both_clients_list_eval_tasks_and_submit_an_evaluation(
    api: TrainctlClient, server_app: FastAPI, ckpts: CheckpointStore
) -> None:
    save_checkpoint(ckpts, "lm", step=10, metadata={"tokenizer": {"kind": "bytes"}})

    async def scenario(client: AsyncTrainctlClient) -> tuple[int, str]:
        tasks = await client.eval_tasks()
        run = await client.submit_evaluate(checkpoint="lm/step_10", tasks=["piqa"], limit=2)
        return len(tasks), run.kind

    tasks = api.eval_tasks()
    run = api.submit_evaluate(checkpoint="lm/step_10", tasks=["arc_easy"], num_fewshot=3)

    assert tasks[1].name == "arc_easy" and tasks[1].size == 570
    assert (run.kind, run.spec["tasks"], run.spec["num_fewshot"]) == ("evaluate", ["arc_easy"], 3)
    assert run_async(server_app, scenario) == (len(tasks), "evaluate")
    with pytest.raises(ApiError, match="unknown eval task 'nope'"):
        api.submit_evaluate(checkpoint="lm/step_10", tasks=["nope"])


def test_both_clients_list_the_presets_and_the_transformers_types(
    server_app: FastAPI, api: TrainctlClient
) -> None:
    async def scenario(client: AsyncTrainctlClient) -> ModelsPublic:
        return await client.models()

    listed, async_listed = api.models(), run_async(server_app, scenario)

    assert async_listed == listed
    assert {p.name for p in listed.presets} == set(PRESETS.names())
    assert listed.hf_model_types is not None and "llama" in listed.hf_model_types
    assert listed.plugins == []  # no live worker, so no plug-in


def test_both_clients_queue_a_sweep_of_forks_and_read_a_run_by_its_short_id(
    api: TrainctlClient, server_app: FastAPI, ckpts: CheckpointStore
) -> None:
    save_checkpoint(ckpts, "stable", step=10, metadata={"optimizer_kind": "muon_adamw"})
    variants = [
        {"experiment": f"stable.cool{n}", "steps": 10 + n, "device": "cpu"} for n in (10, 20)
    ]

    forks = api.submit_forks("stable/step_10", variants, idempotency_key="sweep-1")
    replayed = api.submit_forks("stable/step_10", variants, idempotency_key="sweep-1")

    async def scenario(client: AsyncTrainctlClient) -> list[str]:
        more = await client.submit_forks(
            "stable/latest", [{"experiment": "async.cool", "steps": 30, "device": "cpu"}]
        )
        return [more[0].experiment, (await client.get_run(more[0].short_id)).id, more[0].id]

    assert [run.experiment for run in forks] == ["stable.cool10", "stable.cool20"]
    assert [run.id for run in replayed] == [run.id for run in forks]
    assert all(run.parent and run.parent.tag == "step_10" for run in forks)
    assert api.get_run(forks[1].short_id) == api.get_run(forks[1].id)
    experiment, read_id, queued_id = run_async(server_app, scenario)
    assert experiment == "async.cool" and read_id == queued_id

"""Runs over HTTP: submit (resolved specs, idempotency, 422s that name the field), list,
read, cancel, and the event stream, metrics and logs."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastapi.testclient import TestClient

from tests.plugins.trainctl_rmsprop.kind import RMSPROP
from tests.service.api.submits import CPU_TRAIN, submit
from tests.service.fakes import finish, save_checkpoint
from tests.support.registries import registered
from trainctl.service import sse
from trainctl.service.app import create_app
from trainctl.service.settings import Settings
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.db.runs import RunStore
from trainctl.store.models.presets import get_preset
from trainctl.store.training.optim import OPTIMIZER_KINDS

# --- submit ---------------------------------------------------------------------------------


def test_train_submit_is_accepted_with_location_and_a_fully_resolved_spec(
    client: TestClient,
) -> None:
    response = submit(client, "train", CPU_TRAIN)

    assert response.status_code == 202
    run = response.json()
    assert response.headers["location"] == f"/runs/{run['id']}"
    assert (run["kind"], run["experiment"], run["state"]) == ("train", "exp", "queued")
    spec = run["spec"]
    assert spec["model"]["preset"] == "tiny"
    assert spec["batch"] == {"micro_batch_size": 8, "grad_accum_steps": 1, "seq_len": 256}
    assert spec["checkpoint_every"] == 10
    assert spec["val_every"] == 10
    assert spec["log_every"] == 10
    assert spec["model"]["config"] == get_preset("tiny").to_dict()
    assert client.get(f"/runs/{run['id']}").json() == run


def test_a_run_has_exactly_the_design_fields_with_iso_times(client: TestClient) -> None:
    run = submit(client, "train", CPU_TRAIN).json()

    assert set(run) == {
        "id", "kind", "experiment", "state", "spec", "progress", "result", "error",
        "worker_id", "attempt", "created_at", "started_at", "finished_at", "submitted_by",
        "priority", "max_attempts", "placement", "waiting_reason", "parent", "short_id",
        "jobs", "wandb_url", "gang_nnodes",
    }  # fmt: skip
    assert run["short_id"] == run["id"][:8]
    assert datetime.fromisoformat(run["created_at"]).utcoffset() == timedelta(0)
    assert run["started_at"] is None


@pytest.mark.parametrize("field", ["model_config_resolved", "warnings"])
def test_a_field_the_server_fills_in_is_refused_by_name(client: TestClient, field: str) -> None:
    bodies: list[tuple[str, dict[str, Any]]] = [("train", CPU_TRAIN), ("benchmark", {"steps": 5})]
    for kind, body in bodies:
        response = submit(client, kind, body | {field: [] if field == "warnings" else {}})

        assert response.status_code == 422
        assert f"{field}: filled in by the server" in response.json()["detail"]


def test_benchmark_submit_resolves_the_cpu_profile_under_the_benchmark_experiment(
    client: TestClient,
) -> None:
    response = submit(client, "benchmark", {"steps": 5, "device": "cpu"})

    assert response.status_code == 202
    run = response.json()
    assert run["experiment"] == "benchmark"
    spec = run["spec"]
    assert spec["batch"] == {"micro_batch_size": 16, "grad_accum_steps": 3, "seq_len": 512}
    config = spec["model"]["config"]
    assert (config["use_compile"], config["compile_mode"]) == (False, "reduce-overhead")
    assert config["n_layers"] == get_preset("tiny").n_layers


def test_validate_submit_pins_latest_to_a_concrete_checkpoint(
    client: TestClient, ckpts: CheckpointStore
) -> None:
    save_checkpoint(ckpts, "exp", step=10)
    save_checkpoint(ckpts, "exp", step=20)

    response = submit(client, "validate", {"checkpoint": "latest", "experiment": "exp"})

    assert response.status_code == 202
    run = response.json()
    assert run["experiment"] == "exp"
    assert run["spec"]["checkpoint"] == {"experiment": "exp", "tag": "step_20"}
    assert run["spec"]["model"] == get_preset("tiny").to_dict()  # the checkpoint's model
    assert run["spec"]["seq_len"] == 256  # the CPU profile's, within the tiny model's 512


def test_validate_of_a_missing_checkpoint_is_422_saying_so(client: TestClient) -> None:
    response = submit(client, "validate", {"checkpoint": "nope/step_1"})

    assert response.status_code == 422
    assert "checkpoint" in response.json()["detail"]
    assert "'nope'" in response.json()["detail"]


def test_a_retry_with_the_same_idempotency_key_returns_the_same_run(client: TestClient) -> None:
    first = submit(client, "train", CPU_TRAIN, **{"Idempotency-Key": "k1"})
    again = submit(client, "train", CPU_TRAIN, **{"Idempotency-Key": "k1"})

    assert (first.status_code, again.status_code) == (202, 202)
    assert again.json()["id"] == first.json()["id"]


def test_a_retry_returns_the_original_run_even_when_latest_has_moved_on(
    client: TestClient, ckpts: CheckpointStore
) -> None:
    save_checkpoint(ckpts, "exp", step=10)
    body = {**CPU_TRAIN, "resume_from": "latest"}
    first = submit(client, "train", body, **{"Idempotency-Key": "resume-1"})
    save_checkpoint(ckpts, "exp", step=20)  # the run has saved since; "latest" means step_20

    again = submit(client, "train", body, **{"Idempotency-Key": "resume-1"})

    assert again.status_code == 202, again.json()
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["spec"]["resume_from"] == {"experiment": "exp", "tag": "step_10"}


def test_reusing_an_idempotency_key_for_another_body_is_409(client: TestClient) -> None:
    submit(client, "benchmark", {"steps": 5, "device": "cpu"}, **{"Idempotency-Key": "k"})

    response = submit(
        client, "benchmark", {"steps": 6, "device": "cpu"}, **{"Idempotency-Key": "k"}
    )

    assert response.status_code == 409
    assert "idempotency key" in response.json()["detail"]


def test_a_second_train_run_on_a_busy_experiment_is_409(client: TestClient) -> None:
    first = submit(client, "train", CPU_TRAIN).json()

    response = submit(client, "train", CPU_TRAIN)

    assert response.status_code == 409
    assert first["id"] in response.json()["detail"]


BAD_TRAIN_BODIES = [
    ({"steps": 0}, "body.steps: Input should be greater than or equal to 1"),
    ({"steps": -1}, "body.steps: Input should be greater than or equal to 1"),
    ({"steps": 10**12}, "body.steps: Input should be less than or equal to"),
    ({"steps": "many"}, "body.steps: Input should be a valid integer"),
    ({}, "body.steps: Field required"),
    ({"steps": 10, "model": {"preset": "huge"}}, "body.model.preset"),
    ({"steps": 10, "model": {"preset": "huge"}}, "unknown model preset 'huge'"),
    ({"steps": 10, "model": {"preset": "tiny"}, "batch": {"seq_len": 100000}}, "batch.seq_len"),
    ({"steps": 10, "lr": 0.1}, "body.lr: Extra inputs are not permitted"),
    ({"steps": 10, "batch": {"micro_batch_size": 1.5}}, "body.batch.micro_batch_size"),
    ({"steps": 10, "experiment": "../etc"}, "body.experiment: String should match pattern"),
    ({"steps": 10, "resume_from": "a/b"}, "body.resume_from"),
    ([1, 2], "body: Input should be a valid dictionary"),
    # Loss health (store/training/health.py): bounds, and settings that contradict each other.
    ({"steps": 10, "health": {"spike": {"action": "retry"}}}, "body.health.spike.action"),
    ({"steps": 10, "health": {"spike": {"ema_decay": 1}}}, "body.health.spike.ema_decay"),
    ({"steps": 10, "health": {"spike": {"action": "log"}, "rewind": {"max_rewinds": 9}}},
     "health.rewind is read only when health.spike.action is 'rewind', not 'log'"),
    ({"steps": 10, "health": {"rewind": {"lr_factor": 0.5}}},
     "health.rewind.lr_factor 0.5 with health.rewind.lr_steps 0"),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("body", "expected"), BAD_TRAIN_BODIES)
def test_bad_train_input_is_422_naming_the_field(
    client: TestClient, body: Any, expected: str
) -> None:
    response = submit(client, "train", body)

    assert response.status_code == 422
    assert expected in response.json()["detail"]


# Each value has the JSON type the schema says, not one pydantic's lax mode would convert:
# `false` is no seed of 0, `"10"` no step count, `1` no `true`.
WRONGLY_TYPED_BODIES = [
    ("train", {"steps": True}, "body.steps: Input should be a valid integer"),
    ("train", {"steps": 10, "seed": False}, "body.seed: Input should be a valid integer"),
    ("train", {"steps": "10"}, "body.steps: Input should be a valid integer"),
    ("train", {"steps": 10, "batch": {"grad_accum_steps": True}}, "body.batch.grad_accum_steps"),
    ("train", {"steps": 10, "data": {"seed": False}}, "body.data.seed: Input should be a valid"),
    ("train", {"steps": 10, "optimizer": {"grad_clip": True}}, "body.optimizer.grad_clip: Input"),
    ("train", {"steps": 10, "async_checkpoint": 1}, "body.async_checkpoint: Input should be"),
    ("benchmark", {"warmup_steps": False}, "body.warmup_steps: Input should be a valid integer"),
    ("benchmark", {"target_tokens": "1000"}, "body.target_tokens: Input should be a valid"),
    ("benchmark", {"use_compile": "yes"}, "body.use_compile: Input should be a valid boolean"),
    ("validate", {"num_batches": True}, "body.num_batches: Input should be a valid integer"),
    ("validate", {"data": {"seed": True}}, "body.data.seed: Input should be a valid integer"),
    # Model overrides are checked against ModelConfig's field types, not by pydantic.
    ("train", {"steps": 10, "model": {"overrides": {"n_layers": True}}},
     "model n_layers must be of type int, got True"),
    ("train", {"steps": 10, "model": {"overrides": {"n_layers": "4"}}},
     "model n_layers must be of type int, got '4'"),
    ("train", {"steps": 10, "model": {"overrides": {"qk_norm": 0}}},
     "model qk_norm must be of type bool, got 0"),
    ("train", {"steps": 10, "model": {"overrides": {"mtp_depth": 1, "mtp_loss_weights": 0.3}}},
     "model mtp_loss_weights must be a list of numbers, got 0.3"),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "body", "expected"), WRONGLY_TYPED_BODIES)
def test_a_value_of_the_wrong_json_type_is_422_naming_the_field(
    client: TestClient, kind: str, body: dict[str, Any], expected: str
) -> None:
    response = submit(client, kind, body)

    assert response.status_code == 422
    assert expected in response.json()["detail"]


def test_an_integer_is_still_a_valid_float(client: TestClient) -> None:
    response = submit(client, "train", CPU_TRAIN | {"optimizer": {"muon_lr": 1}})

    assert response.status_code == 202, response.json()
    assert response.json()["spec"]["optimizer"]["muon_lr"] == 1.0


def test_kind_adamw_runs_and_refuses_a_muon_setting_by_name(client: TestClient) -> None:
    adamw = {"kind": "adamw", "adamw_lr": 1e-3}
    accepted = submit(client, "train", CPU_TRAIN | {"optimizer": adamw})
    refused = submit(client, "train", CPU_TRAIN | {"optimizer": adamw | {"muon_lr": 0.05}})

    assert accepted.status_code == 202, accepted.json()
    assert accepted.json()["spec"]["optimizer"]["kind"] == "adamw"
    assert refused.status_code == 422
    assert "optimizer kind 'adamw' does not read muon_lr" in refused.json()["detail"]


def test_a_plugin_optimizer_kind_takes_settings_of_its_own_and_refuses_them_by_name(
    client: TestClient,
) -> None:
    """tests/plugins/trainctl_rmsprop: its `rmsprop_lr` is accepted beside its kind, checked
    by its model, refused on a built-in kind, and listed in the served schema."""
    with registered((OPTIMIZER_KINDS, RMSPROP.name, RMSPROP)):
        rmsprop = {"kind": "rmsprop", "rmsprop_lr": 0.005}
        accepted = submit(client, "train", CPU_TRAIN | {"optimizer": rmsprop})
        out_of_bounds = submit(
            client, "train", CPU_TRAIN | {"optimizer": rmsprop | {"rmsprop_lr": 2.0}}
        )
        on_adamw = submit(client, "train", CPU_TRAIN | {"optimizer": rmsprop | {"kind": "adamw"}})
        schema = client.get("/openapi.json").json()["components"]["schemas"]["OptimizerSpec"]

    assert accepted.status_code == 202, accepted.json()
    assert accepted.json()["spec"]["optimizer"] | rmsprop == accepted.json()["spec"]["optimizer"]
    assert out_of_bounds.status_code == 422
    assert (
        "body.optimizer.rmsprop_lr: Input should be less than or equal to 1"
        in out_of_bounds.json()["detail"]
    )
    assert on_adamw.status_code == 422
    assert "optimizer kind 'adamw' does not read rmsprop_lr" in on_adamw.json()["detail"]
    assert schema["properties"]["rmsprop_lr"]["maximum"] == 1
    assert schema["additionalProperties"] is False


def test_a_validation_error_also_lists_the_raw_errors(client: TestClient) -> None:
    errors = submit(client, "train", {"steps": 0}).json()["errors"]

    assert errors[0]["loc"] == ["body", "steps"]
    assert errors[0]["type"] == "greater_than_equal"


def test_a_malformed_json_body_is_422_naming_the_json_problem(client: TestClient) -> None:
    response = client.post(
        "/runs/train", content=b'{"steps": 10,', headers={"Content-Type": "application/json"}
    )

    assert response.status_code == 422
    assert response.json()["detail"].startswith("body: invalid JSON at character")


def test_a_body_over_the_size_limit_is_refused(client: TestClient) -> None:
    response = client.post(
        "/runs/train",
        content=b'{"steps": 1, "x": "' + b"a" * (2 << 20) + b'"}',
        headers={"Content-Type": "application/json"},
    )

    assert response.status_code == 413


def test_resuming_from_latest_without_a_checkpoint_is_422(client: TestClient) -> None:
    response = submit(client, "train", CPU_TRAIN | {"resume_from": "latest"})

    assert response.status_code == 422
    assert "experiment 'exp' has no checkpoint 'latest' to resume from" in response.json()["detail"]


@pytest.mark.slow
def test_resuming_pins_the_concrete_checkpoint_and_protects_it(
    client: TestClient, ckpts: CheckpointStore, runs: RunStore
) -> None:
    save_checkpoint(ckpts, "exp", step=30)

    run = submit(client, "train", CPU_TRAIN | {"resume_from": "latest"}).json()

    assert run["spec"]["resume_from"] == {"experiment": "exp", "tag": "step_30"}
    assert ("exp", "step_30") in runs.protected_checkpoints()


def test_resuming_a_checkpoint_of_another_model_is_422_naming_the_difference(
    client: TestClient, ckpts: CheckpointStore
) -> None:
    other = get_preset("tiny").replace(n_layers=3).to_dict()
    save_checkpoint(ckpts, "exp", step=30, model_config=other)

    response = submit(client, "train", CPU_TRAIN | {"resume_from": "latest"})

    assert response.status_code == 422
    assert "n_layers: checkpoint 3 vs requested 2" in response.json()["detail"]


# --- read, list, cancel ---------------------------------------------------------------------


def test_an_unknown_run_is_404_everywhere(client: TestClient) -> None:
    for method, path in [
        ("GET", "/runs/nope"),
        ("POST", "/runs/nope/cancel"),
        ("GET", "/runs/nope/events"),
        ("GET", "/runs/nope/metrics"),
        ("GET", "/runs/nope/logs"),
    ]:
        response = client.request(method, path)
        assert response.status_code == 404, path
        assert response.json()["detail"].startswith("run 'nope' does not exist")


def test_runs_are_listed_newest_first_with_filters(client: TestClient) -> None:
    train = submit(client, "train", CPU_TRAIN).json()
    bench = submit(client, "benchmark", {"steps": 1, "device": "cpu"}).json()

    everything = client.get("/runs").json()
    benchmarks = client.get("/runs", params={"kind": "benchmark"}).json()
    of_exp = client.get("/runs", params={"experiment": "exp", "state": "queued"}).json()

    assert [r["id"] for r in everything["items"]] == [bench["id"], train["id"]]
    assert everything["next_cursor"] is None
    assert [r["id"] for r in benchmarks["items"]] == [bench["id"]]
    assert [r["id"] for r in of_exp["items"]] == [train["id"]]


def test_run_pages_follow_the_cursor_to_the_end(client: TestClient) -> None:
    ids = [submit(client, "benchmark", {"steps": n, "device": "cpu"}).json()["id"] for n in
           range(1, 6)]  # fmt: skip
    seen, cursor = [], None
    while True:
        params: dict[str, Any] = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = client.get("/runs", params=params).json()
        seen += [r["id"] for r in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break

    assert seen == ids[::-1]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (
            {"kind": "nap"},
            "query.kind: Input should be 'train', 'validate', 'benchmark', 'prepare', 'sample', "
            "'export' or 'evaluate'",
        ),
        ({"state": "done"}, "query.state"),
        ({"limit": 0}, "query.limit: Input should be greater than or equal to 1"),
        ({"limit": 501}, "query.limit: Input should be less than or equal to 500"),
        ({"cursor": "garbage!"}, "invalid cursor"),
        # Found by fuzzing: a forged cursor whose number overflows SQLite's integers was a 500.
        (
            {"cursor": "WyIyMDI1LTAxLTAxVDAwOjAwOjAwKzAwOjAwIiwgMTAwMDAwMDAwMDAwMDAwMDAwMDAwXQ"},
            "invalid cursor",
        ),
    ],
)
def test_bad_list_parameters_are_422(
    client: TestClient, params: dict[str, Any], expected: str
) -> None:
    response = client.get("/runs", params=params)

    assert response.status_code == 422
    assert expected in response.json()["detail"]


def test_cancelling_a_queued_run_cancels_it_and_a_finished_one_is_409(
    client: TestClient,
) -> None:
    run = submit(client, "train", CPU_TRAIN).json()

    cancelled = client.post(f"/runs/{run['id']}/cancel")
    again = client.post(f"/runs/{run['id']}/cancel")

    assert cancelled.status_code == 200
    assert cancelled.json()["state"] == "cancelled"
    assert again.status_code == 409
    assert "already cancelled" in again.json()["detail"]


# --- events, metrics, logs ------------------------------------------------------------------


def read_sse(client: TestClient, url: str, **headers: str) -> list[tuple[str | None, str, Any]]:
    """(id, event, data) of each frame of a stream that ends (the run is finished)."""
    frames = []
    with client.stream("GET", url, headers=headers) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        text = "".join(response.iter_text())
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        frames.append((fields.get("id"), fields["event"], json.loads(fields["data"])))
    return frames


def test_the_event_stream_sends_every_event_in_order_then_end(
    client: TestClient, runs: RunStore
) -> None:
    run_id = submit(client, "train", CPU_TRAIN).json()["id"]
    runs.append_event(run_id, "log", {"level": "info", "message": "hello"})
    runs.append_event(run_id, "metrics", {"kind": "train", "step": 1, "loss": 5.0})
    finish(runs, run_id)

    frames = read_sse(client, f"/runs/{run_id}/events")

    types = [event for _, event, _ in frames]
    assert types == ["log", "metrics", "state", "state", "end"]  # ..., claimed, succeeded
    ids = [int(i) for i, _, _ in frames[:-1] if i is not None]
    assert ids == sorted(ids) and len(ids) == 4
    assert frames[0][2]["data"] == {"level": "info", "message": "hello"}
    assert frames[0][2]["run_id"] == run_id
    assert frames[3][2]["data"]["state"] == "succeeded"
    assert frames[-1] == (None, "end", {"run_id": run_id, "state": "succeeded"})


def test_the_event_stream_resumes_after_last_event_id(client: TestClient, runs: RunStore) -> None:
    run_id = submit(client, "train", CPU_TRAIN).json()["id"]
    first = runs.append_event(run_id, "log", {"level": "info", "message": "one"})
    runs.append_event(run_id, "log", {"level": "info", "message": "two"})
    finish(runs, run_id)

    by_header = read_sse(client, f"/runs/{run_id}/events", **{"Last-Event-ID": str(first)})
    by_query = read_sse(client, f"/runs/{run_id}/events?after={first}")

    assert by_header == by_query
    assert [d.get("data", {}).get("message") for _, e, d in by_header if e == "log"] == ["two"]
    assert all(int(i) > first for i, _, _ in by_header if i is not None)


@pytest.mark.parametrize(
    ("params", "headers"), [({"after": 2**63}, {}), ({}, {"Last-Event-ID": str(2**63)})]
)
def test_an_event_id_beyond_64_bits_is_422_not_a_crash(
    client: TestClient, params: dict[str, int], headers: dict[str, str]
) -> None:
    """Found by fuzzing: such an id overflowed SQLite's integers inside the stream."""
    run_id = submit(client, "train", CPU_TRAIN).json()["id"]

    response = client.get(f"/runs/{run_id}/events", params=params, headers=headers)

    assert response.status_code == 422
    assert "less than or equal to 9223372036854775807" in response.json()["detail"]


def test_the_event_stream_follows_a_live_run_until_it_finishes(
    client: TestClient, runs: RunStore
) -> None:
    run_id = submit(client, "benchmark", {"steps": 1, "device": "cpu"}).json()["id"]
    claimed = runs.claim("w", lease_seconds=60)
    assert claimed is not None
    seen = []
    with client.stream("GET", f"/runs/{run_id}/events") as response:
        for line in response.iter_lines():
            if not line.startswith("event: "):
                continue
            seen.append(line.removeprefix("event: "))
            if seen == ["state"]:  # the claim: the stream is following a live run; finish it
                runs.append_event(run_id, "metrics", {"kind": "measure", "step": 1})
                runs.finish(run_id, "w", claimed.attempt, "succeeded")

    assert seen == ["state", "metrics", "state", "end"]


def test_metrics_come_back_as_rows_filtered_by_kind_and_as_csv(
    client: TestClient, runs: RunStore
) -> None:
    run_id = submit(client, "train", CPU_TRAIN).json()["id"]
    runs.append_event(run_id, "metrics", {"kind": "train", "step": 1, "loss": 5.5, "lr/muon": 0.02})
    runs.append_event(run_id, "metrics", {"kind": "val", "step": 1, "val_loss": 5.9})
    runs.append_event(run_id, "log", {"level": "info", "message": "not a metric"})
    # An event log from before optimizers had names: its lr_muon reads as lr/muon.
    runs.append_event(run_id, "metrics", {"kind": "train", "step": 2, "loss": 5.4, "lr_muon": 0.01})

    rows = client.get(f"/runs/{run_id}/metrics").json()["items"]
    val = client.get(f"/runs/{run_id}/metrics", params={"kind": "val"}).json()["items"]
    csv = client.get(f"/runs/{run_id}/metrics", params={"format": "csv"})

    assert [r["kind"] for r in rows] == ["train", "val", "train"]
    assert rows[0]["loss"] == 5.5 and "event_id" in rows[0] and "created_at" in rows[0]
    assert rows[2]["lr/muon"] == 0.01 and "lr_muon" not in rows[2]
    assert [r["val_loss"] for r in val] == [5.9]
    assert csv.headers["content-type"].startswith("text/csv")
    lines = csv.text.splitlines()
    assert lines[0] == "event_id,created_at,kind,step,loss,lr/muon,val_loss"
    assert lines[1].endswith(",train,1,5.5,0.02,")
    assert lines[2].endswith(",val,1,,,5.9")
    assert lines[3].endswith(",train,2,5.4,0.01,")


def test_logs_come_back_as_json_and_as_text(client: TestClient, runs: RunStore) -> None:
    run_id = submit(client, "train", CPU_TRAIN).json()["id"]
    runs.append_event(run_id, "log", {"level": "warning", "message": "data is small"})

    items = client.get(f"/runs/{run_id}/logs").json()["items"]
    text = client.get(f"/runs/{run_id}/logs", params={"format": "text"})

    assert [(i["level"], i["message"]) for i in items] == [("warning", "data is small")]
    assert text.headers["content-type"].startswith("text/plain")
    assert text.text.rstrip("\n").endswith("WARNING data is small")


def test_an_idle_stream_sends_keepalive_comments(client: TestClient, runs: RunStore) -> None:
    run_id = submit(client, "train", CPU_TRAIN).json()["id"]

    async def first_frames() -> list[str]:
        feed = sse.EventFeed(runs, client.app.state.tokens)  # type: ignore[attr-defined]
        stream = sse.stream_events(feed, run_id, keepalive_seconds=0.0)
        frames = [await anext(stream), await anext(stream)]
        await stream.aclose()
        return frames

    assert anyio.run(first_frames) == [": keepalive\n\n", ": keepalive\n\n"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ('{"vocab_size": 300000000}', "model vocab_size must be between 1 and 1,048,576"),
        ('{"mtp_depth": 100000}', "model mtp_depth must be between 0 and 16"),
        ('{"rope_theta": NaN}', "model rope_theta must be between"),
        ('{"init_std": Infinity}', "model init_std must be between"),
        ('{"mtp_depth": 2, "mtp_loss_weights": [0.3, -Infinity]}', "mtp_loss_weights"),
        ('{"n_layers": 100000}', "model n_layers must be between 1 and 1,024"),
    ],
)
def test_absurd_or_non_finite_model_overrides_are_422_at_submit(
    client: TestClient, runs: RunStore, overrides: str, named: str
) -> None:
    body = (
        f'{{"steps": 10, "device": "cpu", "model": {{"preset": "tiny", "overrides": {overrides}}}}}'
    )
    for kind in ("train", "benchmark"):
        body_of_kind = body if kind == "train" else body.replace('"steps": 10, ', "")
        response = client.post(
            f"/runs/{kind}", content=body_of_kind, headers={"Content-Type": "application/json"}
        )

        assert response.status_code == 422, response.text
        assert named in response.json()["detail"]
    assert runs.list_runs()[0] == []


@pytest.mark.parametrize("paths", [["/"], ["/usr"], ["/proc/**"]])
def test_a_data_path_outside_the_roots_is_422_naming_only_the_pattern(
    tmp_path: Path, paths: list[str]
) -> None:
    (tmp_path / "datasets").mkdir()
    settings = Settings(data_dir=tmp_path / "data", workers=0, data_roots=[tmp_path / "datasets"])
    with TestClient(create_app(settings), base_url="http://localhost") as client:
        body = {**CPU_TRAIN, "data": {"source": "text", "paths": paths}}
        response = submit(client, "train", body)

    assert response.status_code == 422
    assert response.json()["detail"] == (
        f"data.paths: {paths[0]!r} is outside the data roots (TRAINCTL_DATA_ROOTS)"
    )


def test_a_run_that_fits_no_workers_memory_is_422_naming_both_numbers(
    client: TestClient, runs: RunStore
) -> None:
    # Inside every documented bound, yet about 2.4 TB of activations on a CPU.
    body = {
        "steps": 10,
        "device": "cpu",
        "model": {"preset": "base"},
        "batch": {"micro_batch_size": 4096, "seq_len": 256},
    }
    response = submit(client, "train", body)

    assert response.status_code == 422
    detail = response.json()["detail"]
    assert re.search(r"needs about [\d,]+\.\d GiB of memory \(.*activations [\d,.]+ GiB", detail)
    assert re.search(r"more than the largest worker has: [\d,]+\.\d GiB", detail)
    assert runs.list_runs()[0] == []


def test_the_memory_limit_is_what_the_live_workers_report(
    client: TestClient, runs: RunStore
) -> None:
    runs.workers.register("w1", host="n1", pid=1, device="cpu", info={"memory_bytes": 2 << 30})
    small = {"steps": 10, "device": "cpu", "model": {"preset": "small", "overrides": {}}}
    refused = submit(client, "benchmark", small | {"batch": {"micro_batch_size": 16}})
    accepted = submit(client, "train", {**CPU_TRAIN, "model": {"preset": "tiny"}})

    assert refused.status_code == 422
    assert "largest worker has: 2.0 GiB" in refused.json()["detail"]
    assert accepted.status_code == 202

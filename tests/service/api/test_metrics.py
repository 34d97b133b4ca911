"""/metrics in the Prometheus text format: the queue, workers, running runs, HTTP requests."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from trainctl.store.db.runs import RunStore

CPU_TRAIN = {"experiment": "exp", "steps": 100, "device": "cpu"}


def samples(client: TestClient) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def value(
    found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return found[(name, frozenset(labels.items()))]


@pytest.mark.slow
def test_metrics_count_runs_by_state_queue_depth_and_live_workers(
    client: TestClient, runs: RunStore
) -> None:
    for _ in range(3):
        client.post("/runs/train", json={**CPU_TRAIN, "experiment": f"e{_}"})
    runs.workers.register("w1", host="h", pid=1, device="cpu", info={})
    assert runs.claim("w1", lease_seconds=60) is not None

    found = samples(client)

    assert value(found, "trainctl_runs", state="queued") == 2
    assert value(found, "trainctl_runs", state="running") == 1
    assert value(found, "trainctl_runs", state="failed") == 0
    assert value(found, "trainctl_queue_depth") == 2
    assert value(found, "trainctl_workers_alive") == 1


def test_running_runs_report_loss_speed_step_times_and_checkpoint_saves(
    client: TestClient, runs: RunStore
) -> None:
    run_id = client.post("/runs/train", json=CPU_TRAIN).json()["id"]
    claimed = runs.claim("w1", lease_seconds=60)
    assert claimed is not None
    for step, loss in ((1, 5.0), (2, 4.5)):
        runs.append_event(run_id, "metrics", {
            "kind": "train", "step": step, "total_steps": 100, "loss": loss,
            "tokens_per_sec": 1000.0 * step, "step_time_sec": 0.2,
        })  # fmt: skip
    saved = {"experiment": "exp", "tag": "step_2", "step": 2, "save_seconds": 0.4}
    runs.append_event(run_id, "log", {"level": "info", "message": "saved", "checkpoint": saved})
    labels = {"run_id": run_id, "experiment": "exp", "kind": "train"}

    first = samples(client)
    runs.append_event(run_id, "metrics", {
        "kind": "train", "step": 3, "total_steps": 100, "loss": 4.0,
        "tokens_per_sec": 3000.0, "step_time_sec": 0.3,
    })  # fmt: skip
    second = samples(client)

    assert value(first, "trainctl_run_loss", **labels) == 4.5
    assert value(first, "trainctl_run_tokens_per_second", **labels) == 2000.0
    assert value(first, "trainctl_step_time_seconds_count", kind="train") == 2
    assert value(first, "trainctl_checkpoint_save_seconds_count") == 1
    assert value(first, "trainctl_checkpoint_save_seconds_sum") == pytest.approx(0.4)
    # A scrape observes only the events since the previous one.
    assert value(second, "trainctl_step_time_seconds_count", kind="train") == 3
    assert value(second, "trainctl_step_time_seconds_sum", kind="train") == pytest.approx(0.7)
    assert value(second, "trainctl_run_step", **labels) == 3

    runs.finish(run_id, "w1", claimed.attempt, "succeeded", result={})
    assert ("trainctl_run_loss", frozenset(labels.items())) not in samples(client)


def test_stragglers_are_a_gauge_by_rank_until_they_catch_up_and_hangs_are_counted(
    client: TestClient, runs: RunStore
) -> None:
    run_id = client.post("/runs/train", json=CPU_TRAIN).json()["id"]
    assert runs.claim("w1", lease_seconds=60) is not None
    report = {"step": 20, "slowdowns": {"1": 0.5}, "nodes": {"1": "n1"}, "threshold": 0.2,
              "window": 20}  # fmt: skip
    runs.append_event(run_id, "log", {"level": "warning", "message": "slow", "straggler": report})
    hang = {"ranks": [1, 0], "step": 30, "phase": "a training step", "late_seconds": 0.1}
    runs.append_event(run_id, "log", {"level": "error", "message": "hang", "hang": hang})
    rank_1 = {"run_id": run_id, "experiment": "exp", "kind": "train", "rank": "1"}

    slow = samples(client)
    caught_up = {**report, "step": 40, "slowdowns": {}, "nodes": {}}
    runs.append_event(run_id, "log", {"level": "info", "message": "none", "straggler": caught_up})
    fast = samples(client)

    assert value(slow, "trainctl_run_straggler_slowdown", **rank_1) == 0.5
    assert value(slow, "trainctl_run_hangs_total") == 1
    assert ("trainctl_run_straggler_slowdown", frozenset(rank_1.items())) not in fast
    logs = client.get(f"/runs/{run_id}/logs").json()["items"]
    # avoid_nodes: null, for a run that does not avoid its stragglers' nodes
    assert [line.get("straggler") for line in logs][-1] == {**caught_up, "avoid_nodes": None}
    assert [line["hang"] for line in logs if line.get("hang")] == [hang]


def test_http_requests_are_counted_by_route_template_and_status(client: TestClient) -> None:
    client.get("/runs/one")
    client.get("/runs/two")
    client.get("/no/such/path")

    found = samples(client)

    assert value(found, "trainctl_http_requests_total",
                 method="GET", route="/runs/{run_id}", status="404") == 2  # fmt: skip
    assert value(found, "trainctl_http_requests_total",
                 method="GET", route="unmatched", status="404") == 1  # fmt: skip
    assert value(found, "trainctl_http_request_duration_seconds_count",
                 method="GET", route="/runs/{run_id}", status="404") == 2  # fmt: skip


def test_loss_health_interventions_are_counted_by_action(
    client: TestClient, runs: RunStore
) -> None:
    run_id = client.post("/runs/train", json=CPU_TRAIN).json()["id"]
    assert runs.claim("w1", lease_seconds=60) is not None
    for step, action in ((7, "skip"), (9, "rewind"), (12, "skip")):
        health = {"step": step, "loss": 9.0, "reason": "spike", "action": action}
        runs.append_event(
            run_id, "log", {"level": "warning", "message": "health", "health": health}
        )

    found = samples(client)

    assert value(found, "trainctl_health_interventions_total", action="skip") == 2
    assert value(found, "trainctl_health_interventions_total", action="rewind") == 1

"""Down-sampled metrics (`GET /runs/{id}/metrics?max_points=N`): what the compare view and the
run page chart a long run from, instead of shipping every step to the browser."""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.service.api.submits import CPU_TRAIN, submit
from trainctl.service.deps import get_runs
from trainctl.service.history import downsample, fair_shares
from trainctl.store.db.records import Event
from trainctl.store.db.runs import RunStore


def train_rows(n: int) -> list[dict[str, Any]]:
    return [
        {"event_id": i + 1, "kind": "train", "step": i + 1, "loss": 10 / (i + 1)} for i in range(n)
    ]


# --- the function ----------------------------------------------------------------------------


def test_a_history_within_max_points_comes_back_whole() -> None:
    rows = train_rows(10)

    assert downsample(rows, 10) == rows
    assert downsample(rows, 500) == rows


@pytest.mark.parametrize("max_points", [2, 3, 4, 5, 17, 100, 999])
@pytest.mark.parametrize("size", [1000, 1001, 5003])
def test_down_sampling_keeps_the_first_and_last_rows_in_order_and_at_most_max_points(
    max_points: int, size: int
) -> None:
    rows = train_rows(size)

    out = downsample(rows, max_points)

    assert 2 <= len(out) <= max_points
    assert out[0] is rows[0] and out[-1] is rows[-1]
    steps = [r["step"] for r in out]
    assert steps == sorted(set(steps))


def test_down_sampling_keeps_a_loss_spike_that_a_stride_would_drop() -> None:
    rows = train_rows(100_000)
    rows[51_237]["loss"] = 1e6  # one diverging step
    rows[73_001]["loss"] = -1.0  # and one impossible dip

    out = downsample(rows, 200)

    assert rows[51_237] in out and rows[73_001] in out
    assert len(out) <= 200


def test_non_numbers_and_non_finite_values_do_not_count_as_extremes() -> None:
    rows = train_rows(1000)
    rows[10]["loss"] = math.inf
    rows[11]["loss"] = True  # not a number to a chart, whatever Python says
    for row in rows[100:900]:
        del row["loss"]

    out = downsample(rows, 20)

    assert rows[10] not in out and rows[11] not in out
    assert len(out) <= 20 and out[-1] is rows[-1]


def test_each_kind_gets_a_share_and_a_train_runs_few_val_rows_all_stay() -> None:
    rows = train_rows(10_000)
    val = [
        {"event_id": 20_000 + i, "kind": "val", "step": i * 1000, "val_loss": 3.0}
        for i in range(10)
    ]
    rows = sorted(rows + val, key=lambda r: (r["step"], r["event_id"]))

    out = downsample(rows, 100)

    assert [r for r in out if r["kind"] == "val"] == val
    assert len(out) == 100  # the train rows take the share the val rows left
    assert out[0] is rows[0] and out[-1] is rows[-1]


@pytest.mark.parametrize(
    ("sizes", "budget", "shares"),
    [
        ([1000], 50, [50]),
        ([1000, 10], 50, [40, 10]),
        ([10, 1000], 50, [10, 40]),
        ([1000, 1000], 51, [25, 26]),
        ([1000, 1000, 1000], 10, [3, 3, 4]),
        ([5, 5, 5], 2, [0, 1, 1]),
        ([3, 4], 100, [3, 4]),
    ],
)
def test_fair_shares(sizes: list[int], budget: int, shares: list[int]) -> None:
    assert fair_shares(sizes, budget) == shares
    assert sum(shares) <= budget


# --- the endpoint ----------------------------------------------------------------------------


def test_max_points_thins_a_runs_metrics_keeping_first_last_and_val_rows(
    client: TestClient, runs: RunStore
) -> None:
    run_id = submit(client, "train", CPU_TRAIN).json()["id"]
    for step in range(1, 301):
        runs.append_event(
            run_id, "metrics", {"kind": "train", "step": step, "loss": 9 - step / 100}
        )
        if step % 100 == 0:
            runs.append_event(run_id, "metrics", {"kind": "val", "step": step, "val_loss": 6.0})

    rows = client.get(f"/runs/{run_id}/metrics", params={"max_points": 40}).json()["items"]
    csv = client.get(f"/runs/{run_id}/metrics", params={"max_points": 40, "format": "csv"})
    whole = client.get(f"/runs/{run_id}/metrics").json()["items"]

    assert len(whole) == 303
    assert 36 <= len(rows) <= 40 and len(csv.text.splitlines()) == 1 + len(rows)
    train = [r["step"] for r in rows if r["kind"] == "train"]
    assert train[0] == 1 and train[-1] == 300
    assert [r["step"] for r in rows if r["kind"] == "val"] == [100, 200, 300]
    assert [r["event_id"] for r in rows] == sorted(r["event_id"] for r in rows)


class LongRun:
    """A run store holding one run of 100,000 logged steps, generated as they are read."""

    STEPS = 100_000
    CREATED = datetime(2025, 1, 1, tzinfo=UTC)

    def resolve_id(self, id_or_prefix: str) -> str:
        return id_or_prefix  # its one run is named "long"

    def events(
        self, run_id: str, *, after_id: int = 0, limit: int = 1000, type: str | None = None
    ) -> list[Event]:
        ids = range(after_id + 1, min(after_id + limit, self.STEPS) + 1)
        return [
            Event(
                i,
                run_id,
                "metrics",
                {"kind": "train", "step": i, "loss": 5 + math.sin(i)},
                self.CREATED,
            )
            for i in ids
        ]


@pytest.fixture
def long_run_app(app: FastAPI) -> Iterator[FastAPI]:
    app.dependency_overrides[get_runs] = LongRun
    yield app
    app.dependency_overrides.clear()


def test_a_100000_step_history_ships_at_most_max_points_rows(
    long_run_app: FastAPI, client: TestClient
) -> None:
    response = client.get("/runs/long/metrics", params={"kind": "train", "max_points": 1000})

    rows = response.json()["items"]
    assert response.status_code == 200
    assert 2 <= len(rows) <= 1000
    assert rows[0]["step"] == 1 and rows[-1]["step"] == LongRun.STEPS
    assert len(response.content) < 200_000  # not the ~9 MB of every step


@pytest.mark.slow
@pytest.mark.parametrize("value", ["0", "1", "-5", "1.5", "abc", "1000001", "", "1e9"])
def test_a_bad_max_points_is_a_422_naming_it(client: TestClient, value: str) -> None:
    run_id = submit(client, "train", CPU_TRAIN).json()["id"]

    response = client.get(f"/runs/{run_id}/metrics?max_points={value}")

    assert response.status_code == 422
    assert "query.max_points" in response.json()["detail"]


def test_max_points_is_read_as_a_json_number(client: TestClient) -> None:
    run_id = submit(client, "train", CPU_TRAIN).json()["id"]

    assert client.get(f"/runs/{run_id}/metrics?max_points=2.0").status_code == 200
    assert client.get(f"/runs/{run_id}/metrics?max_points=5e2").status_code == 200

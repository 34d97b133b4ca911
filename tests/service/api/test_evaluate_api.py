"""The evaluate run kind's contract (docs/evals.md): `GET /evals/tasks` lists the catalog, a
good request is queued with its checkpoint and tokenizer pinned, and a request that cannot
work is a 422 naming what is wrong, before any worker sees it."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.service.fakes import save_checkpoint
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.evals.tasks import EVAL_TASKS
from trainctl.store.specs import MAX_FEWSHOT, MAX_LIMIT

BYTES = {"tokenizer": {"kind": "bytes", "sha256": None}}


@pytest.fixture
def scored(client: TestClient, ckpts: CheckpointStore) -> TestClient:
    """A byte-level checkpoint to evaluate, lm/step_10, and one without a tokenizer,
    synthetic/step_10."""
    save_checkpoint(ckpts, "lm", step=10, metadata=BYTES)
    save_checkpoint(ckpts, "synthetic", step=10)
    return client


def test_the_task_list_has_every_task_with_its_size_and_metrics(client: TestClient) -> None:
    response = client.get("/evals/tasks")

    assert response.status_code == 200
    tasks = {t["name"]: t for t in response.json()["items"]}
    assert list(tasks) == list(EVAL_TASKS)
    assert tasks["arc_easy"] == {
        "name": "arc_easy", "size": 570, "split": "validation", "fewshot_split": "validation",
        "max_fewshot": MAX_FEWSHOT, "metrics": ["acc", "acc_norm", "bits_per_byte"],
    }  # fmt: skip
    assert (tasks["mmlu_anatomy"]["fewshot_split"], tasks["mmlu_anatomy"]["max_fewshot"]) == (
        "dev", 5,
    )  # fmt: skip


def test_an_evaluate_run_is_queued_with_its_checkpoint_and_tokenizer_pinned(
    scored: TestClient,
) -> None:
    body = {"checkpoint": "latest", "experiment": "lm", "tasks": ["arc_easy", "mmlu_anatomy"],
            "limit": 8, "num_fewshot": 1}  # fmt: skip
    response = scored.post("/runs/evaluate", json=body)

    assert response.status_code == 202, response.text
    run = response.json()
    assert (run["kind"], run["experiment"], run["state"]) == ("evaluate", "lm", "queued")
    spec = run["spec"]
    assert spec["checkpoint"] == {"experiment": "lm", "tag": "step_10"}
    assert (spec["tasks"], spec["limit"], spec["num_fewshot"], spec["seed"]) == (
        ["arc_easy", "mmlu_anatomy"], 8, 1, 1234,
    )  # fmt: skip
    assert spec["tokenizer"]["kind"] == "bytes" and spec["device"] == "cpu"
    listed = scored.get("/runs", params={"kind": "evaluate"}).json()["items"]
    assert [r["id"] for r in listed] == [run["id"]]
    # Queued, it protects the checkpoint it reads, as every kind that reads one does.
    assert scored.delete("/checkpoints/lm/step_10").status_code == 409
    cancelled = scored.post(f"/runs/{run['id']}/cancel").json()
    assert cancelled["state"] == "cancelled"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"tasks": ["arc_easy", "nope"]}, "tasks: unknown eval task 'nope': GET /evals/tasks"),
        ({"tasks": ["piqa", "piqa"]}, "tasks: 'piqa' named more than once"),
        ({"tasks": []}, "body.tasks: List should have at least 1 item"),
        ({"limit": 0}, "body.limit: Input should be greater than or equal to 1"),
        (
            {"limit": MAX_LIMIT + 1},
            f"body.limit: Input should be less than or equal to {MAX_LIMIT}",
        ),
        ({"limit": "8"}, "body.limit: Input should be a valid integer"),
        ({"num_fewshot": -1}, "body.num_fewshot: Input should be greater than or equal to 0"),
        ({"num_fewshot": MAX_FEWSHOT + 1}, "body.num_fewshot: Input should be less than or equal"),
        (
            {"tasks": ["arc_easy", "mmlu_anatomy"], "num_fewshot": 6},
            "num_fewshot: mmlu_anatomy has at most 5 few-shot examples per item, and 6 were "
            "asked for",
        ),
        ({"checkpoint": "lm/step_99"}, "checkpoint: "),
        ({"checkpoint": "latest", "experiment": "nowhere"}, "nothing to evaluate"),
        ({"checkpoint": "synthetic/step_10"}, "records no tokenizer"),
        ({"checkpoint": "lm/../x"}, "body.checkpoint"),
    ],
)
def test_a_request_that_cannot_work_is_a_422_naming_the_problem(
    scored: TestClient, change: dict[str, Any], expected: str
) -> None:
    body = {"checkpoint": "lm/step_10", "tasks": ["arc_easy"], **change}
    response = scored.post("/runs/evaluate", json=body)

    assert response.status_code == 422, response.text
    assert expected in response.json()["detail"]
    assert scored.get("/runs").json()["items"] == []  # nothing was queued

"""A train run's `evals` (docs/evals.md, "Evaluations during training"): checked at submit as
POST /runs/evaluate checks its tasks, limit and few-shot count, plus what only a train run can
get wrong (data whose tokens have no text, an `every` that misses the checkpoints), each a
422 naming the problem before any worker sees the run."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.service.api.submits import CPU_TRAIN, submit
from trainctl.store.specs import MAX_FEWSHOT, MAX_LIMIT

EVALS = {"tasks": ["arc_easy"], "limit": 4}


def test_a_train_run_with_evals_is_queued_with_them_in_its_plan(client: TestClient) -> None:
    body = {**CPU_TRAIN, "checkpoint_every": 20,
            "evals": {**EVALS, "num_fewshot": 1, "every": 40}}  # fmt: skip
    response = submit(client, "train", body)

    assert response.status_code == 202, response.text
    evals = response.json()["spec"]["evals"]
    assert evals == {"tasks": ["arc_easy"], "limit": 4, "num_fewshot": 1, "seed": 1234,
                     "batch_size": 32, "every": 40}  # fmt: skip


def test_a_train_run_without_evals_has_none_in_its_plan(client: TestClient) -> None:
    response = submit(client, "train", CPU_TRAIN)

    assert response.status_code == 202, response.text
    assert response.json()["spec"]["evals"] is None


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"evals": {**EVALS, "tasks": ["arc_easy", "nope"]}},
         "evals.tasks: unknown eval task 'nope': GET /evals/tasks"),
        ({"evals": {**EVALS, "tasks": ["piqa", "piqa"]}},
         "evals.tasks: 'piqa' named more than once"),
        ({"evals": {**EVALS, "tasks": []}}, "body.evals.tasks: List should have at least 1 item"),
        ({"evals": {**EVALS, "limit": 0}},
         "body.evals.limit: Input should be greater than or equal to 1"),
        ({"evals": {**EVALS, "limit": MAX_LIMIT + 1}},
         f"body.evals.limit: Input should be less than or equal to {MAX_LIMIT}"),
        ({"evals": {**EVALS, "num_fewshot": -1}},
         "body.evals.num_fewshot: Input should be greater than or equal to 0"),
        ({"evals": {**EVALS, "num_fewshot": MAX_FEWSHOT + 1}},
         "body.evals.num_fewshot: Input should be less than or equal"),
        ({"evals": {**EVALS, "tasks": ["mmlu_anatomy"], "num_fewshot": 6}},
         "evals.num_fewshot: mmlu_anatomy has at most 5 few-shot examples per item, and 6 "
         "were asked for"),
        ({"data": {"source": "synthetic"}, "evals": EVALS},
         "evals: the run's data (source 'synthetic') records no tokenizer"),
        ({"checkpoint_every": 20, "evals": {**EVALS, "every": 30}},
         "evals.every: 30 steps is not a multiple of checkpoint_every (20)"),
        ({"evals": {**EVALS, "every": 200}}, "evals.every: 200 steps is more than the run's 100"),
        ({"evals": {**EVALS, "every": "sometimes"}}, "body.evals.every"),
        ({"evals": {**EVALS, "every": 0}}, "body.evals.every"),
        ({"evals": {**EVALS, "checkpoint": "latest"}}, "body.evals.checkpoint: Extra inputs"),
    ],
)  # fmt: skip
def test_evals_that_cannot_work_are_a_422_naming_the_problem(
    client: TestClient, change: dict[str, Any], expected: str
) -> None:
    response = submit(client, "train", {**CPU_TRAIN, **change})

    assert response.status_code == 422, response.text
    assert expected in response.json()["detail"]
    assert client.get("/runs").json()["items"] == []  # nothing was queued

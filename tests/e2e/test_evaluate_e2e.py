"""Evaluate runs end to end (issue 27): a `tiny` model trained a few steps on the standard
library's source saves a byte-level checkpoint; an evaluate run scores it on ARC-Easy and an
MMLU subject, from the shipped data, offline. The scores are the run's result and
`eval/<task>/<metric>` metrics events at the checkpoint's step, on the evaluate run and on
the train run that wrote the checkpoint; `trainctl evaluate` prints them."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.service.cli.invoke import trainctl
from tests.service_process import Service, finished, submit
from trainctl.store.evals import METRICS

STEPS = 2
TASKS = ["arc_easy", "mmlu_anatomy"]
LIMIT = 8


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    service = Service(tmp_path_factory.mktemp("evaluate"))
    service.extra_env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    service.start()
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture(scope="module")
def trained(service: Service) -> dict[str, Any]:
    """A finished train run of `tiny`, two steps on stdlib source (bytes): it saved
    evals/step_2."""
    run = submit(
        service, "train", experiment="evals", steps=STEPS, checkpoint_every=STEPS,
        val_every=STEPS, val_batches=1, batch={"micro_batch_size": 2, "seq_len": 32},
    )  # fmt: skip
    done = finished(service, run["id"])
    assert done["state"] == "succeeded", done["error"]
    return done


def eval_rows(service: Service, run_id: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{service.url}/runs/{run_id}/metrics", params={"kind": "eval"}, timeout=60)
    assert r.status_code == 200, r.text
    rows: list[dict[str, Any]] = r.json()["items"]
    return rows


@pytest.mark.slow
def test_an_evaluate_run_scores_a_checkpoint_and_records_the_scores_on_both_runs(
    service: Service, trained: dict[str, Any]
) -> None:
    run = submit(service, "evaluate", checkpoint="latest", experiment="evals", tasks=TASKS,
                 limit=LIMIT, num_fewshot=1)  # fmt: skip
    done = finished(service, run["id"])
    assert done["state"] == "succeeded", done["error"]

    result = done["result"]
    assert result["checkpoint"] == {"experiment": "evals", "tag": f"step_{STEPS}", "step": STEPS}
    assert (result["source_run"], result["num_fewshot"], result["limit"]) == (
        trained["id"], 1, LIMIT,
    )  # fmt: skip
    assert list(result["tasks"]) == TASKS
    for scores in result["tasks"].values():
        assert scores["items"] == LIMIT
        assert 0 <= scores["acc"] <= 1 and 0 <= scores["acc_norm"] <= 1
        assert math.isfinite(scores["bits_per_byte"]) and scores["bits_per_byte"] > 0

    expected = {f"eval/{t}/{m}": result["tasks"][t][m] for t in TASKS for m in METRICS}
    own = eval_rows(service, run["id"])
    assert [row["step"] for row in own] == [STEPS, STEPS]  # one event per task, as it ends
    assert {k: v for row in own for k, v in row.items() if k.startswith("eval/")} == expected
    on_train = eval_rows(service, trained["id"])
    assert len(on_train) == 1 and on_train[0]["step"] == STEPS
    assert on_train[0]["evaluate_run"] == run["id"]
    assert {k: v for k, v in on_train[0].items() if k.startswith("eval/")} == expected


@pytest.mark.slow
def test_trainctl_evaluate_waits_for_the_scores_and_prints_them_as_a_table(
    service: Service, trained: dict[str, Any]
) -> None:
    code, out, err = trainctl(
        service, "evaluate", "evals", "latest", "--tasks", "arc_easy", "--limit", "4"
    )

    assert code == 0, err
    header, row = out.splitlines()
    assert header.split() == ["TASK", "ITEMS", "ACC", "ACC_NORM", "BITS_PER_BYTE"]
    assert row.split()[:2] == ["arc_easy", "4"] and len(row.split()) == 5
    assert f"checkpoint evals/step_{STEPS} (step {STEPS}), 0-shot, seed 1234" in " ".join(
        err.split()
    )

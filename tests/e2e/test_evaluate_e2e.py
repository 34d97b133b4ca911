"""Evaluate runs end to end (issue 27): a `tiny` model trained a few steps on the standard
library's source saves a byte-level checkpoint; an evaluate run scores it on ARC-Easy and an
MMLU subject, from the shipped data, offline. The scores are the run's result and
`eval/<task>/<metric>` metrics events at the checkpoint's step, on the evaluate run and on
the train run that wrote the checkpoint, whose TensorBoard mirror shows them though the run
had ended; `trainctl evaluate` prints them, and an export's model card lists them. A train run
with `evals` queues an evaluate run per checkpoint, which keeps its checkpoint from the run's
own retention until it is scored."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.polling import poll
from tests.support.service_process import Service, finished, submit
from tests.support.tensorboard_files import float32, tensorboard_rows
from trainctl.store.evals.tasks import METRICS

# tbparse 0.0.9 sorts with pandas' `inplace=`, which pandas 3.1 deprecates; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:The inplace keyword:DeprecationWarning")

STEPS = 2
TASKS = ["arc_easy", "mmlu_anatomy"]
LIMIT = 8


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    service = Service(tmp_path_factory.mktemp("evaluate"))
    service.extra_env = {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRAINCTL_TRACKERS": "tensorboard",  # the train run is mirrored, scores and all
        "TRAINCTL_SINK_POLL_SECONDS": "0.2",
    }
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
    # The train run had ended before it was scored: its TensorBoard mirror takes them still.
    folder = service.data_dir / "tensorboard" / "evals" / trained["id"]
    mirrored = {(name, STEPS, float32(value)) for name, value in expected.items()}
    poll(lambda: mirrored <= set(tensorboard_rows(folder)), 30, "the scores in TensorBoard")


def item_pages(service: Service, run_id: str, task: str, limit: int) -> list[dict[str, Any]]:
    """Every page of GET /runs/{id}/evals/items for the task, following next_offset."""
    pages, offset = [], 0
    while offset is not None:
        params: dict[str, Any] = {"task": task, "offset": offset, "limit": limit}
        r = httpx.get(f"{service.url}/runs/{run_id}/evals/items", params=params, timeout=60)
        assert r.status_code == 200, r.text
        pages.append(r.json())
        offset = pages[-1]["next_offset"]
    return pages


@pytest.mark.slow
def test_each_item_s_prediction_is_read_from_the_api_and_the_cli_and_adds_up_to_the_scores(
    service: Service, trained: dict[str, Any]
) -> None:
    run = submit(service, "evaluate", checkpoint="latest", experiment="evals", tasks=TASKS,
                 limit=LIMIT)  # fmt: skip
    done = finished(service, run["id"])
    assert done["state"] == "succeeded", done["error"]

    for task in TASKS:
        pages = item_pages(service, run["id"], task, limit=3)
        assert [len(p["items"]) for p in pages] == [3, 3, 2]
        assert {p["total"] for p in pages} == {LIMIT}
        items = [item for page in pages for item in page["items"]]
        assert [item["doc_id"] for item in items] == list(range(LIMIT))
        scores = done["result"]["tasks"][task]
        for metric in ("acc", "acc_norm"):
            assert sum(item[metric] for item in items) / LIMIT == pytest.approx(scores[metric])
        for item in items:
            lls = item["loglikelihoods"]
            assert item["pred"] == lls.index(max(lls)) and all(math.isfinite(v) for v in lls)
            assert item["acc"] == float(item["pred"] == item["gold"])

        cli = [sys.executable, "-m", "trainctl.service.cli", "runs", "evals-items", run["id"][:8],
               "--task", task]  # fmt: skip
        env = {**os.environ, "TRAINCTL_URL": service.url}
        printed = subprocess.run(cli, capture_output=True, text=True, check=True, env=env)
        assert [json.loads(line) for line in printed.stdout.splitlines()] == items

    url = f"{service.url}/runs/{run['id']}/evals/items"
    refused = httpx.get(url, params={"task": "hellaswag"}, timeout=60)
    assert refused.status_code == 404 and "does not score 'hellaswag'" in refused.json()["detail"]
    first = httpx.get(url, timeout=60).json()  # no task: the run's first
    assert first["task"] == TASKS[0] and first["total"] == LIMIT
    other = httpx.get(f"{service.url}/runs/{trained['id']}/evals/items", params={"task": "x"})
    assert other.status_code == 409 and "only evaluate runs" in other.json()["detail"]
    missing = httpx.get(f"{service.url}/runs/nosuchrun/evals/items", params={"task": "x"})
    assert missing.status_code == 404


@pytest.mark.slow
def test_an_export_s_model_card_lists_the_finished_evaluations_of_its_checkpoint(
    service: Service, trained: dict[str, Any]
) -> None:
    run = submit(service, "evaluate", checkpoint=f"evals/step_{STEPS}", tasks=["arc_easy"],
                 limit=4)  # fmt: skip
    scored = finished(service, run["id"])
    assert scored["state"] == "succeeded", scored["error"]

    export = finished(service, submit(service, "export", checkpoint=f"evals/step_{STEPS}")["id"])

    assert export["state"] == "succeeded", export["error"]
    card = (service.data_dir / "exports" / "evals" / f"step_{STEPS}" / "README.md").read_text()
    acc = scored["result"]["tasks"]["arc_easy"]["acc"]
    assert f"| arc_easy | acc | {acc:.4f} | 0 | 4 | {run['id']} |" in card


@pytest.mark.slow
def test_a_train_run_with_evals_has_each_checkpoint_scored_before_retention_deletes_it(
    service: Service,
) -> None:
    # Two checkpoints, of which the run keeps one: step_2 survives only through its eval.
    evals = {"tasks": ["arc_easy"], "limit": 4, "every": "checkpoint"}
    run = submit(
        service, "train", experiment="evaltrain", steps=4, checkpoint_every=2, val_every=4,
        val_batches=1, max_keep=1, batch={"micro_batch_size": 2, "seq_len": 32}, evals=evals,
    )  # fmt: skip
    trained = finished(service, run["id"])
    assert trained["state"] == "succeeded", trained["error"]

    queued = trained["result"]["evaluate_runs"]
    listed = httpx.get(
        f"{service.url}/runs", params={"experiment": "evaltrain", "kind": "evaluate"}, timeout=60
    ).json()["items"]
    assert sorted(r["id"] for r in listed) == sorted(queued) and len(queued) == 2
    logs = httpx.get(f"{service.url}/runs/{run['id']}/logs", params={"format": "text"},
                     timeout=60).text  # fmt: skip
    scored = [finished(service, run_id) for run_id in queued]
    for step, done in zip((2, 4), scored, strict=True):
        assert done["state"] == "succeeded", done["error"]
        assert done["result"]["checkpoint"] == {
            "experiment": "evaltrain", "tag": f"step_{step}", "step": step,
        }  # fmt: skip
        assert done["result"]["source_run"] == run["id"]
        assert done["result"]["tasks"]["arc_easy"]["items"] == 4
        assert f"queued evaluate run {done['id'][:8]} for step_{step}" in logs
    on_train = eval_rows(service, run["id"])
    assert [(row["step"], row["evaluate_run"]) for row in on_train] == list(
        zip((2, 4), queued, strict=True)
    )
    for row, done in zip(on_train, scored, strict=True):
        assert row["eval/arc_easy/acc"] == done["result"]["tasks"]["arc_easy"]["acc"]
    # And in the train run's TensorBoard mirror, at each checkpoint's step.
    folder = service.data_dir / "tensorboard" / "evaltrain" / run["id"]
    mirrored = {
        (f"eval/arc_easy/{m}", step, float32(done["result"]["tasks"]["arc_easy"][m]))
        for step, done in zip((2, 4), scored, strict=True)
        for m in METRICS
    }
    poll(lambda: mirrored <= set(tensorboard_rows(folder)), 30, "the scores in TensorBoard")

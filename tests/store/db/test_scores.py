"""Eval scores read back from the run database (store/db/scores.py), on SQLite and on a real
PostgreSQL server: the runs and events written as evaluate runs write them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from trainctl.store.db.records import Run
from trainctl.store.db.runs import RunStore
from trainctl.store.db.scores import checkpoint_results, eval_items, latest_scores
from trainctl.store.evals import items as items_module
from trainctl.store.evals.items import item_record
from trainctl.store.evals.tasks import EvalResult, TaskScores
from trainctl.store.exceptions import Conflict, NotFound, RunNotFound

WORKER = "w"


@pytest.fixture
def store(database_url: str) -> Iterator[RunStore]:
    with RunStore(database_url) as run_store:
        run_store.create_all()
        yield run_store


def claimed(store: RunStore, kind: str, spec: dict[str, Any]) -> Run:
    store.enqueue(kind, "exp", spec)
    run = store.claim(WORKER, lease_seconds=60)
    assert run is not None
    return run


def evaluated(
    store: RunStore, tag: str, step: int, source: str | None, state: str = "succeeded", **kw: Any
) -> Run:
    """An evaluate run of exp/`tag` that ended in `state`, with the result the worker gives."""
    run = claimed(store, "evaluate", {"checkpoint": {"experiment": "exp", "tag": tag}})
    result = {
        "checkpoint": {"experiment": "exp", "tag": tag, "step": step},
        "source_run": source,
        "tasks": {"arc_easy": {"items": 8, "acc": 0.5, "acc_norm": 0.625, "bits_per_byte": 1.5}},
        "num_fewshot": kw.get("num_fewshot", 0),
        "limit": kw.get("limit"),
        "seed": 1234,
        "items_per_sec": 10.0,
    }
    return store.finish(run.id, WORKER, run.attempt, state, result=result)


def test_the_latest_scores_are_each_tasks_at_the_newest_step_it_was_scored(
    store: RunStore,
) -> None:
    run = claimed(store, "train", {"steps": 30})
    for data in (
        {"kind": "eval", "step": 20, "evaluate_run": "a", "eval/arc_easy/acc": 0.5,
         "eval/mmlu_anatomy/acc": 0.25},
        {"kind": "eval", "step": 10, "evaluate_run": "b", "eval/arc_easy/acc": 0.125},
        {"kind": "train", "step": 25, "loss": 1.0},
        {"kind": "eval", "step": 20, "evaluate_run": "c", "eval/arc_easy/acc": 0.75},
    ):  # fmt: skip
        store.append_event(run.id, "metrics", data, worker_id=WORKER, attempt=run.attempt)

    assert latest_scores(store, run.id) == {
        "arc_easy": TaskScores("arc_easy", 20, {"acc": 0.75}),  # step 20's newest, not 10's
        "mmlu_anatomy": TaskScores("mmlu_anatomy", 20, {"acc": 0.25}),
    }
    assert latest_scores(store, claimed(store, "benchmark", {"steps": 1}).id) == {}


def test_a_checkpoints_results_are_the_finished_evaluations_of_its_run_and_step(
    store: RunStore,
) -> None:
    ok = evaluated(store, "step_20", 20, "train-1", num_fewshot=1, limit=8)
    best = evaluated(store, "best", 20, "train-1")  # the same weights under another tag
    evaluated(store, "best", 30, "train-1")  # `best` saved again since: other weights
    evaluated(store, "step_20", 20, "train-2")  # another run's step 20
    evaluated(store, "step_20", 20, "train-1", state="failed")

    results = checkpoint_results(store, "exp", "step_20", 20, "train-1")

    assert results[:3] == [
        EvalResult("arc_easy", "acc", 0.5, 1, 8, ok.id),
        EvalResult("arc_easy", "acc_norm", 0.625, 1, 8, ok.id),
        EvalResult("arc_easy", "bits_per_byte", 1.5, 1, 8, ok.id),
    ]
    assert [r.evaluate_run for r in results[3:]] == [best.id] * 3
    assert checkpoint_results(store, "exp", "step_40", 40, "train-1") == []
    # A checkpoint that records no run is matched by its tag.
    assert {r.evaluate_run for r in checkpoint_results(store, "exp", "best", 20, None)} == {best.id}


def items_of(start: int, count: int, attempt: int) -> list[dict[str, Any]]:
    """Items whose log-likelihoods say which attempt wrote them."""
    return [item_record(i, [-1.0, -float(attempt)], 0, 1, 0) for i in range(start, start + count)]


def test_eval_items_are_paged_across_events_from_the_latest_attempt_only(
    store: RunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(items_module, "ITEMS_PER_EVENT", 3)
    run = claimed(store, "evaluate", {"tasks": ["arc_easy", "mmlu_anatomy"]})
    for attempt, count in ((1, 7), (2, 8)):  # a retried run writes every item again
        for data in items_module.item_events("arc_easy", attempt, items_of(0, count, attempt)):
            store.append_event(run.id, "eval_items", data)
    [other] = items_module.item_events("mmlu_anatomy", 2, items_of(0, 2, 2))
    store.append_event(run.id, "eval_items", other)

    pages = [eval_items(store, run.id, "arc_easy", offset, 3) for offset in (0, 3, 6)]

    assert [p.total for p in pages] == [8, 8, 8]
    items = [item for page in pages for item in page.items]
    assert [i["doc_id"] for i in items] == list(range(8))
    assert {i["loglikelihoods"][1] for i in items} == {-2.0}
    middle = eval_items(store, run.id, "arc_easy", 2, 3)  # across two events
    assert [i["doc_id"] for i in middle.items] == [2, 3, 4]
    assert eval_items(store, run.id, "arc_easy", 8, 3).items == []
    assert eval_items(store, run.id, "mmlu_anatomy", 0, 100).total == 2


def test_eval_items_are_refused_for_a_task_the_run_does_not_score_or_another_kind(
    store: RunStore,
) -> None:
    evaluate = claimed(store, "evaluate", {"tasks": ["arc_easy"]})
    train = claimed(store, "train", {"steps": 3})

    with pytest.raises(NotFound, match="does not score 'hellaswag'; it scores arc_easy"):
        eval_items(store, evaluate.id, "hellaswag", 0, 10)
    with pytest.raises(Conflict, match="is a train run: only evaluate runs score items"):
        eval_items(store, train.id, "arc_easy", 0, 10)
    with pytest.raises(RunNotFound):
        eval_items(store, "nope", "arc_easy", 0, 10)
    assert eval_items(store, evaluate.id, "arc_easy", 0, 10).total == 0  # none written yet
    assert eval_items(store, evaluate.id, None, 0, 10).task == "arc_easy"  # the run's first

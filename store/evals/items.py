"""Each item's prediction in an evaluate run, for comparing with lm-evaluation-harness's
per-sample log (docs/evals.md, "Reading the results").

The worker writes them as events of type `eval_items`: a chunk of at most `ITEMS_PER_EVENT`
consecutive items of one task each, tagged with the attempt that scored them, as each task
ends. `store.db.scores.eval_items` reads a page back from the latest attempt that wrote the
task, so a retried run's items are its last attempt's, never two attempts' mixed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

EVAL_ITEMS_EVENT = "eval_items"
ITEMS_PER_EVENT = 500
"""Items in one event: about 100 bytes each, so an event stays near 50 KB."""
MAX_ITEMS_PAGE = 1000
"""The most items one page of `GET /runs/{id}/evals/items` holds."""


def item_record(
    doc_id: int, loglikelihoods: Sequence[float], pred: int, pred_norm: int, gold: int
) -> dict[str, Any]:
    """One item's prediction, named as the harness's samples name them (`doc_id`, `acc`,
    `acc_norm`, and the log-likelihoods of its choices in order)."""
    return {
        "doc_id": doc_id,
        "gold": gold,
        "pred": pred,
        "pred_norm": pred_norm,
        "acc": float(pred == gold),
        "acc_norm": float(pred_norm == gold),
        "loglikelihoods": list(loglikelihoods),
    }


def item_events(task: str, attempt: int, items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The data of the events that hold a task's items, in order."""
    return [
        {
            "task": task,
            "attempt": attempt,
            "start": start,
            "count": len(chunk),
            "items": chunk,
        }
        for start in range(0, len(items), ITEMS_PER_EVENT)
        if (chunk := list(items[start : start + ITEMS_PER_EVENT]))
    ]

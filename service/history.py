"""A run's history from its event log: every event, the metrics table and the log lines."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterator, Sequence
from typing import Any

from trainctl.store.db.records import Event
from trainctl.store.db.runs import RunStore
from trainctl.store.training.optim import current_metric_names

PAGE = 1000
"""Events fetched per query; a long run has one metrics event per step."""

HEADLINES = ("loss", "val_loss", "tokens_per_sec", "documents")
"""The value whose extremes down-sampling keeps: a kind's first of these that its first row
has (train and measure: loss; val: val_loss; prepare: documents)."""


def iter_events(
    runs: RunStore, run_id: str, *, type: str | None = None, after_id: int = 0
) -> Iterator[Event]:
    """Every event of a run after `after_id`, oldest first, a page at a time."""
    while True:
        page = runs.events(run_id, after_id=after_id, limit=PAGE, type=type)
        yield from page
        if len(page) < PAGE:
            return
        after_id = page[-1].id


def metric_rows(runs: RunStore, run_id: str, kind: str | None = None) -> list[dict[str, Any]]:
    """Metrics events as flat rows `{event_id, created_at, **data}`, optionally of one kind.

    Metrics of old event logs appear under today's names (`lr_muon` as `lr/muon`), so a table
    or a chart of runs old and new has one column of each."""
    return [
        {"event_id": e.id, "created_at": e.created_at.isoformat(), **current_metric_names(e.data)}
        for e in iter_events(runs, run_id, type="metrics")
        if kind is None or e.data.get("kind") == kind
    ]


def downsample(rows: list[dict[str, Any]], max_points: int) -> list[dict[str, Any]]:
    """At most `max_points` of the metrics rows, in their order, for a chart of a long run.

    Each kind (train, val, ...) gets an equal share of `max_points`; a kind with fewer rows
    keeps them all and leaves the rest to the others, so the few val rows of a train run all
    stay. Within its share a kind keeps its first and last rows and splits the rows between
    into buckets, keeping the rows of each bucket's smallest and largest headline value
    (`HEADLINES`): a loss spike or a dip survives, which a plain stride would drop. A share of
    2 or 3 is evenly spaced rows, a share of 1 the last row.
    """
    if len(rows) <= max_points:
        return rows
    by_kind: dict[Any, list[int]] = {}
    for i, row in enumerate(rows):
        by_kind.setdefault(row.get("kind"), []).append(i)
    groups = list(by_kind.values())
    shares = fair_shares([len(group) for group in groups], max_points)
    kept = sorted(i for group, n in zip(groups, shares, strict=True) for i in thin(rows, group, n))
    return [rows[i] for i in kept]


def fair_shares(sizes: Sequence[int], budget: int) -> list[int]:
    """Split `budget` evenly over groups of these sizes, a small group's unused share going to
    the larger ones; the shares add up to at most `budget`."""
    shares = [0] * len(sizes)
    left = budget
    smallest_first = sorted(range(len(sizes)), key=lambda i: sizes[i])
    for done, i in enumerate(smallest_first):
        shares[i] = min(sizes[i], left // (len(sizes) - done))
        left -= shares[i]
    return shares


def thin(rows: list[dict[str, Any]], group: list[int], n: int) -> list[int]:
    """At most `n` of the indices `group` (one kind's rows, in order): see `downsample`."""
    if len(group) <= n:
        return group
    if n <= 1:
        return group[len(group) - n :]  # the latest row, or none
    if n < 4:  # no room for a bucket's two extremes between the ends: evenly spaced
        stride = (len(group) - 1) / (n - 1)
        return [group[round(k * stride)] for k in range(n)]
    key = next((k for k in HEADLINES if k in rows[group[0]]), None)
    inner, buckets = group[1:-1], (n - 2) // 2
    kept = [group[0]]
    for b in range(buckets):
        bucket = inner[b * len(inner) // buckets : (b + 1) * len(inner) // buckets]
        kept.extend(_extremes(rows, bucket, key))
    kept.append(group[-1])
    return kept


def _extremes(rows: list[dict[str, Any]], bucket: list[int], key: str | None) -> list[int]:
    """The bucket's rows with the smallest and the largest `key` (one row if they are the
    same); its middle row when no row has a finite number there."""
    values = [(rows[i][key], i) for i in bucket if key is not None and _finite(rows[i].get(key))]
    if not values:
        return [bucket[len(bucket) // 2]]
    low, high = min(values)[1], max(values)[1]
    return sorted({low, high})


def _finite(value: Any) -> bool:
    # bool is an int to Python, not a number to a chart.
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def metrics_csv(rows: list[dict[str, Any]]) -> str:
    """CSV of the rows; the header is the union of their keys in first-seen order."""
    columns = {"event_id": None, "created_at": None}
    for row in rows:
        columns.update(dict.fromkeys(row))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def log_entries(runs: RunStore, run_id: str) -> list[dict[str, Any]]:
    return [
        {
            "event_id": e.id,
            "created_at": e.created_at.isoformat(),
            "level": str(e.data.get("level", "info")),
            "message": str(e.data.get("message", "")),
            # what the hang and straggler watches add (worker.training.hangs)
            **{
                k: e.data[k]
                for k in ("straggler", "hang", "health")
                if isinstance(e.data.get(k), dict)
            },
        }
        for e in iter_events(runs, run_id, type="log")
    ]


def logs_text(entries: list[dict[str, Any]]) -> str:
    return "".join(f"{e['created_at']} {e['level'].upper():<7} {e['message']}\n" for e in entries)

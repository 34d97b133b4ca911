"""A run's history from its event log: every event, the metrics table and the log lines."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from typing import Any

from trainctl.store.runs import Event, RunStore

PAGE = 1000
"""Events fetched per query; a long run has one metrics event per step."""


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
    """Metrics events as flat rows `{event_id, created_at, **data}`, optionally of one kind."""
    return [
        {"event_id": e.id, "created_at": e.created_at.isoformat(), **e.data}
        for e in iter_events(runs, run_id, type="metrics")
        if kind is None or e.data.get("kind") == kind
    ]


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
        }
        for e in iter_events(runs, run_id, type="log")
    ]


def logs_text(entries: list[dict[str, Any]]) -> str:
    return "".join(f"{e['created_at']} {e['level'].upper():<7} {e['message']}\n" for e in entries)

"""Aggregate, read-only queries for monitoring (the service's /metrics)."""

from __future__ import annotations

from sqlalchemy import func, select

from trainctl.store.db.runs import RunStore
from trainctl.store.db.schema import read_transaction, runs


def count_runs_by_state(store: RunStore) -> dict[str, int]:
    """How many runs are in each state; states with none are absent. One indexed GROUP BY."""
    query = select(runs.c.state, func.count()).group_by(runs.c.state)
    with read_transaction(store.engine) as conn:
        return {state: int(n) for state, n in conn.execute(query)}

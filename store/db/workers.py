"""The worker registry (docs/design/runs.md, "Runs"; docs/design/placement.md, "Placement and
gangs"): `WorkerStore`, the `workers` table of the run database, each method one short transaction.

A worker process registers what it has (its node, device, GPUs and CPUs, the plug-in models
and transformers model types it builds), heartbeats while it lives, may be asked to drain,
becomes idle again when it stops working on a run, and deregisters when it exits. What it
runs is the runs' business, in their own transactions (`store.db.runs.RunStore`): a claim
marks its worker busy in the transaction that starts the run, and a dead worker's runs are
recovered by `RunStore.fail_worker_runs`. The registry shares its `RunStore`'s engine (one
pool, one database): `RunStore.workers`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Row, func, insert, literal, select, update
from sqlalchemy.engine import Engine

from trainctl.store.db.placement import Capacity
from trainctl.store.db.queue import plugins_of
from trainctl.store.db.rows import RowReader, as_json, storable_json
from trainctl.store.db.schema import (
    UTCDateTime,
    read_transaction,
    runs,
    workers,
    write_transaction,
)
from trainctl.store.exceptions import WorkerNotFound

LIST_WORKERS = "GET /workers (trainctl workers) lists those that are"


@dataclass(frozen=True)
class Worker:
    """A registered worker process; `current_run_id` is the run it is executing, if any."""

    id: str
    host: str
    pid: int
    device: str
    info: dict[str, Any]
    started_at: datetime
    last_seen_at: datetime
    current_run_id: str | None
    node_name: str = ""
    gpus: int = 0
    cpus: int = 1
    address: str | None = None
    model_plugins: tuple[str, ...] = ()
    """The plug-in models installed where it runs (store/models/plugin.py)."""
    hf_model_types: tuple[str, ...] = ()
    """The transformers model types it builds (those of the transformers installed there)."""
    drain_requested_at: datetime | None = None
    """When it was asked to drain (`WorkerStore.drain`); None: it was not."""

    @property
    def capacity(self) -> Capacity:
        return Capacity(
            self.id, self.node_name, self.gpus, self.cpus, frozenset(self.model_plugins)
        )


class WorkerStore:
    """The registered workers, in the run database (SQLite or PostgreSQL)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def register(
        self,
        worker_id: str,
        *,
        host: str,
        pid: int,
        device: str,
        info: dict[str, Any],
        node_name: str | None = None,
        gpus: int = 0,
        cpus: int = 1,
        address: str | None = None,
        model_plugins: Iterable[str] = (),
        hf_model_types: Iterable[str] = (),
    ) -> None:
        """Record a worker process and what it has (store/db/placement.py), with the plug-in
        models installed where it runs and the transformers model types it builds;
        registering an id again replaces its record (a restart), idle."""
        now = _utcnow()
        values = {"host": host, "pid": pid, "device": device, "info": storable_json(as_json(info))}
        values |= {"started_at": now, "last_seen_at": now, "run_id": None}
        values["drain_requested_at"] = None  # a restart under the same id starts afresh
        values |= {"node_name": node_name or host, "gpus": gpus, "cpus": cpus, "address": address}
        values["model_plugins"] = sorted(model_plugins)
        values["hf_model_types"] = sorted(hf_model_types)
        with write_transaction(self.engine) as conn:
            # Update-then-insert instead of a dialect-specific upsert: the write transaction
            # makes it atomic on SQLite; on PostgreSQL a racing insert fails loudly.
            updated = conn.execute(update(workers).where(workers.c.id == worker_id).values(values))
            if updated.rowcount == 0:
                conn.execute(insert(workers).values(id=worker_id, **values))

    def heartbeat(self, worker_id: str) -> bool:
        """Mark the worker alive now; return whether it was asked to drain (`drain`).
        Raises `WorkerNotFound` if it was deregistered."""
        statement = (
            update(workers)
            .where(workers.c.id == worker_id)
            .values(last_seen_at=_utcnow())
            .returning(workers.c.drain_requested_at)
        )
        with write_transaction(self.engine) as conn:
            row = conn.execute(statement).one_or_none()
        if row is None:
            raise WorkerNotFound(worker_id)
        return row.drain_requested_at is not None

    def release(self, worker_id: str) -> None:
        """The worker has stopped working on its run: it is idle, a gang may take it."""
        with write_transaction(self.engine) as conn:
            conn.execute(update(workers).where(workers.c.id == worker_id).values(run_id=None))

    def drain(self, worker_id: str) -> Worker:
        """Ask a worker to drain: its running run saves and goes back to the queue, and the
        worker claims nothing more and exits (docs/operations.md, "Preemption and drain").
        Asking again keeps the first request's time. Raises `WorkerNotFound`."""
        statement = (
            update(workers)
            .where(workers.c.id == worker_id)
            .values(
                drain_requested_at=func.coalesce(
                    workers.c.drain_requested_at, literal(_utcnow(), UTCDateTime())
                )
            )
        )
        with write_transaction(self.engine) as conn:
            if conn.execute(statement).rowcount == 0:
                raise WorkerNotFound(worker_id, LIST_WORKERS)
        found = [w for w in self.list_workers() if w.id == worker_id]
        if not found:  # it exited between the two transactions
            raise WorkerNotFound(worker_id, LIST_WORKERS)
        return found[0]

    def list_workers(self) -> list[Worker]:
        running = select(runs.c.worker_id, runs.c.id).where(runs.c.state == "running")
        with read_transaction(self.engine) as conn:
            rows = conn.execute(select(workers).order_by(workers.c.started_at)).all()
            current = {worker: run for worker, run in conn.execute(running)}
        return [_worker_from_row(r, current.get(r.id) or r.run_id) for r in rows]

    def deregister(self, worker_id: str) -> None:
        """Forget a worker (it exited). Its running runs are recovered by
        `RunStore.fail_worker_runs`."""
        with write_transaction(self.engine) as conn:
            conn.execute(workers.delete().where(workers.c.id == worker_id))


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _worker_from_row(row: Row[Any], current_run_id: str | None) -> Worker:
    reader = RowReader(f"worker {row.id}")
    return Worker(
        row.id,
        reader.text("host", row.host) or "",
        row.pid,
        row.device,
        reader.json("info", row.info),
        row.started_at,
        row.last_seen_at,
        current_run_id,
        reader.text("node_name", row.node_name) or "",
        row.gpus,
        row.cpus,
        reader.text("address", row.address),
        tuple(sorted(plugins_of(row.model_plugins))),
        tuple(sorted(plugins_of(row.hf_model_types))),  # a list of names, read alike
        row.drain_requested_at,
    )

"""The jobs launch backends submit for runs (docs/design/backends.md): a backend records
each job it submits, what its scheduler says of it, and the worker inside it claims the run
through here. The rules of the run's life cycle (fencing, attempts, recovery) stay the run
store's: a job that ends without its run having ended costs an attempt as a dead worker does
(`RunStore._recover`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Row, insert, select, update

from trainctl.store.db.queue import place_gang, sizes_allow
from trainctl.store.db.records import Run, leader_place, run_from_row, utcnow
from trainctl.store.db.schema import launches, read_transaction, runs, write_transaction
from trainctl.store.text import column_text

if TYPE_CHECKING:
    from trainctl.store.db.runs import RunStore


@dataclass(frozen=True)
class Launch:
    """One job a backend submitted for a run."""

    run_id: str
    attempt: int
    backend: str
    job_id: str
    state: str
    """The scheduler's state as last seen (PENDING, RUNNING, COMPLETED, ... or GONE)."""
    reason: str | None
    nodes: str | None
    submitted_at: datetime
    claimed_at: datetime | None
    ended_at: datetime | None


def launch_worker_id(backend: str, job_id: str, node_rank: int) -> str:
    """The worker id of a job's task on one node: whose writes the run store fences, and
    how a job's worker is recognised when the job is gone."""
    return f"{backend}-{job_id}-n{node_rank}"


def _launch(row: Row[Any]) -> Launch:
    return Launch(
        row.run_id, row.attempt, row.backend, row.job_id, row.state, row.reason, row.nodes,
        row.submitted_at, row.claimed_at, row.ended_at,
    )  # fmt: skip


class Launches:
    """The run store's jobs (`RunStore.launches`)."""

    def __init__(self, runs: RunStore) -> None:
        self.runs, self.engine = runs, runs.engine

    # ---- the backend's side ------------------------------------------------------------

    def needing_launch(self) -> list[Run]:
        """Queued runs with no job that may still start them: none submitted, or every one
        claimed (by an earlier attempt) or ended. Highest priority first, then the oldest."""
        waiting = (
            select(launches.c.id)
            .where(
                launches.c.run_id == runs.c.id,
                launches.c.claimed_at.is_(None),
                launches.c.ended_at.is_(None),
            )
            .exists()
        )
        query = (
            select(runs)
            .where(runs.c.state == "queued", ~waiting)
            .order_by(runs.c.priority.desc(), runs.c.created_at, runs.c.seq)
        )
        with read_transaction(self.engine) as conn:
            return [run_from_row(row) for row in conn.execute(query)]

    def submitted(self, run: Run, backend: str, job_id: str) -> None:
        with write_transaction(self.engine) as conn:
            conn.execute(
                insert(launches).values(
                    run_id=run.id, attempt=run.attempt, backend=backend, job_id=job_id,
                    state="PENDING", submitted_at=utcnow(),
                )
            )  # fmt: skip

    def open(self, backend: str) -> list[Launch]:
        """The jobs of `backend` not known to have ended."""
        query = select(launches).where(launches.c.backend == backend, launches.c.ended_at.is_(None))
        with read_transaction(self.engine) as conn:
            return [_launch(row) for row in conn.execute(query.order_by(launches.c.id))]

    def observe(
        self, backend: str, job_id: str, state: str, reason: str | None, nodes: str | None
    ) -> None:
        """What the scheduler says of a job now."""
        with write_transaction(self.engine) as conn:
            conn.execute(
                update(launches)
                .where(launches.c.backend == backend, launches.c.job_id == job_id)
                .values(state=state, reason=reason, nodes=nodes)
            )

    def of_runs(self, run_ids: Iterable[str]) -> dict[str, list[Launch]]:
        """Each run's jobs, oldest first."""
        wanted = list(dict.fromkeys(run_ids))
        found: dict[str, list[Launch]] = {}
        with read_transaction(self.engine) as conn:
            for start in range(0, len(wanted), 500):
                query = select(launches).where(launches.c.run_id.in_(wanted[start : start + 500]))
                for row in conn.execute(query.order_by(launches.c.id)):
                    found.setdefault(row.run_id, []).append(_launch(row))
        return found

    def ended(self, launch: Launch, state: str, reason: str) -> Run | None:
        """The job ended (`state`, as the scheduler last said, or GONE). If its run was still
        running on it, or still waiting for it, the attempt is lost: requeued as a new one
        while attempts remain, else failed (cancelled if a cancel was requested). Returns the
        run so moved, or None."""
        now = utcnow()
        with write_transaction(self.engine) as conn:
            moved = conn.execute(
                update(launches)
                .where(
                    launches.c.backend == launch.backend,
                    launches.c.job_id == launch.job_id,
                    launches.c.ended_at.is_(None),
                )
                .values(state=state, ended_at=now)
            ).rowcount
            if not moved:
                return None  # another service ended it first
            row = conn.execute(
                select(runs).where(runs.c.id == launch.run_id).with_for_update()
            ).one()
            prefix = launch_worker_id(launch.backend, launch.job_id, 0)[:-1]
            ran_it = (
                row.state == "running"
                and launch.claimed_at is not None
                and (row.worker_id or "").startswith(prefix)
            )
            waited = (
                row.state == "queued"
                and launch.claimed_at is None
                and row.attempt == launch.attempt
            )
            if not (ran_it or waited):
                return None
            what = "while the run was running in it" if ran_it else "before the run started"
            cause = column_text(f"{launch.backend} job {launch.job_id} ended ({reason}) {what}")
            return self.runs._recover(conn, row, requeue_cause=cause, fail_cause=cause, now=now)

    def refuse(self, run: Run, error: str) -> Run | None:
        """The backend cannot submit the run, and never will (its options are refused):
        failed, with the scheduler's words. None if the run moved meanwhile."""
        with write_transaction(self.engine) as conn:
            row = conn.execute(
                select(runs)
                .where(runs.c.id == run.id, runs.c.state == "queued", runs.c.attempt == run.attempt)
                .with_for_update()
            ).one_or_none()
            if row is None:
                return None
            return self.runs._transition(conn, row, "failed", error, error=error, finished=True)

    # ---- the worker's side -------------------------------------------------------------

    def claim(
        self,
        run_id: str,
        backend: str,
        job_id: str,
        members: Sequence[str],
        rendezvous: str,
        lease_seconds: float,
        nodes: str | None = None,
    ) -> Run | None:
        """The run, claimed by the job's first task (`members[0]`; a gang's other tasks are
        given their places), or None when this job may not start it: another job claimed
        it, or it is no longer queued (cancelled meanwhile)."""
        now = utcnow()
        lease_until = now + timedelta(seconds=lease_seconds)
        with write_transaction(self.engine) as conn:
            launch = conn.execute(
                select(launches)
                .where(launches.c.backend == backend, launches.c.job_id == job_id)
                .with_for_update()
            ).one_or_none()
            if (
                launch is None
                or launch.run_id != run_id
                or launch.claimed_at is not None
                or launch.ended_at is not None
            ):
                return None
            row = conn.execute(
                select(runs).where(runs.c.id == run_id, runs.c.state == "queued").with_for_update()
            ).one_or_none()
            if row is None or not sizes_allow(row, len(members)):
                return None
            conn.execute(
                update(launches)
                .where(launches.c.id == launch.id)
                .values(claimed_at=now, state="RUNNING", nodes=nodes, attempt=row.attempt)
            )
            where = f"{backend} job {job_id}" + (f" on {nodes}" if nodes else "")
            if row.nnodes == 1:
                return self.runs._start(
                    conn, row, members[0], now, lease_until, f"claimed by {members[0]} ({where})"
                )
            place_gang(conn, row, members, rendezvous, lease_until)
            reason = f"claimed by a gang of {len(members)} ({', '.join(members)}; {where})"
            started = self.runs._start(conn, row, members[0], now, lease_until, reason)
            return dataclasses.replace(started, gang=leader_place(row, len(members), rendezvous))

    def place(self, worker_id: str) -> Run | None:
        """A gang member's place, once the job's first task has claimed the run."""
        with read_transaction(self.engine) as conn:
            return self.runs._given_place(conn, worker_id)

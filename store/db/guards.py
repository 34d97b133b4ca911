"""The guard of an experiment in an object store, as a lease in the run database
(docs/design/checkpoints.md, "Object storage", "Protection").

A bucket has no lock, so "a run starts to depend on a checkpoint" and "a checkpoint is
deleted" take turns through a row per experiment: whoever holds an unexpired lease on it has
the guard. The lease is renewed while it is held, so a long prune keeps it, and it runs out
on its own when its holder dies, so a killed process never leaves an experiment locked.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, delete, insert, or_, update
from sqlalchemy.exc import IntegrityError

from trainctl.store.db.schema import checkpoint_guards, write_transaction

log = logging.getLogger(__name__)

GUARD_LEASE_SECONDS = 30.0
"""A guard's lease: a holder not heard from for this long has lost it."""
POLL_SECONDS = 0.05


def _utcnow() -> datetime:
    return datetime.now(UTC)


class GuardLeases:
    """Leases on experiments, held by this process (`holder`)."""

    def __init__(
        self,
        engine: Engine,
        *,
        lease_seconds: float = GUARD_LEASE_SECONDS,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        self.engine = engine
        self.holder = f"guard-{uuid.uuid4().hex}"
        self.lease_seconds = lease_seconds
        self.clock = clock

    def try_take(self, experiment: str) -> bool:
        """Take (or renew) the lease on `experiment` (a storage's name for it, such as
        ``s3://bucket/prefix/checkpoints/exp``); False while another holder has it."""
        now = self.clock()
        values = {
            "holder": self.holder,
            "lease_expires_at": now + timedelta(seconds=self.lease_seconds),
        }
        t = checkpoint_guards.c
        with write_transaction(self.engine) as conn:
            # One UPDATE that re-checks its condition: of two holders racing for an expired
            # lease, one changes the row and the other changes none.
            taken = conn.execute(
                update(checkpoint_guards)
                .where(t.experiment == experiment)
                .where(or_(t.holder == self.holder, t.lease_expires_at <= now))
                .values(values)
            )
            if taken.rowcount == 1:
                return True
        try:
            with write_transaction(self.engine) as conn:
                conn.execute(insert(checkpoint_guards).values(experiment=experiment, **values))
            return True
        except IntegrityError:  # the row is there: another holder has it
            return False

    def take(self, experiment: str) -> None:
        """Wait for the lease on `experiment`, then hold it."""
        while not self.try_take(experiment):
            time.sleep(POLL_SECONDS)

    def release(self, experiment: str) -> None:
        t = checkpoint_guards.c
        with write_transaction(self.engine) as conn:
            conn.execute(
                delete(checkpoint_guards)
                .where(t.experiment == experiment)
                .where(t.holder == self.holder)
            )

    def keep(self, experiment: str) -> Callable[[], None]:
        """Renew the lease on `experiment` until the returned function is called (which
        stops the renewals and releases it)."""
        stop = threading.Event()

        def renew() -> None:
            while not stop.wait(self.lease_seconds / 3):
                try:
                    if not self.try_take(experiment):
                        log.error("lost the guard of experiment %r to another holder", experiment)
                        return
                except Exception:  # the database is away: the lease may run out; say so
                    log.exception("could not renew the guard of experiment %r", experiment)

        renewer = threading.Thread(target=renew, name=f"guard-{experiment}", daemon=True)
        renewer.start()

        def done() -> None:
            stop.set()
            renewer.join()
            self.release(experiment)

        return done

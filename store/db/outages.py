"""A run database that does not answer, as its clients see it, and waiting one out
(docs/design/runs.md, "Runs", "Database outages").

A restarted or unreachable server raises at once (refused, reset, terminated connections:
`OperationalError`), or after the pool has waited for a connection (`TimeoutError`). A stopped
one (SIGSTOP, a frozen VM) raises nothing: its kernel still acknowledges TCP, so a query on an
open connection waits until it answers. Only the client's own deadline bounds that wait, which
is why a worker's training thread makes no query of its own (worker/context.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from trainctl.store.db.schema import build_engine
from trainctl.store.exceptions import DatabaseStalled

T = TypeVar("T")

UNAVAILABLE: tuple[type[Exception], ...] = (OperationalError, PoolTimeout)
"""What the database's absence raises: worth retrying, never the caller's fault."""

FIRST_RETRY_SECONDS = 0.25
LAST_RETRY_SECONDS = 2.0


def until_answered(
    call: Callable[[], T],
    what: str,
    log: logging.Logger,
    *,
    stop: threading.Event | None = None,
) -> T:
    """`call()`, retried with a growing pause (to LAST_RETRY_SECONDS) while the database is
    unavailable; one log line when it first fails and one when it answers again. Other errors
    (LeaseLost: the answer was no) are the caller's. `stop` set: give up, raising the last
    error."""
    pause, failures = FIRST_RETRY_SECONDS, 0
    while True:
        try:
            value = call()
        except UNAVAILABLE as exc:
            failures += 1
            if failures == 1:
                log.warning("%s: the run database does not answer (%s); retrying", what, exc)
            if stop is not None and stop.is_set():
                raise
            (stop or threading.Event()).wait(pause)
            pause = min(pause * 2, LAST_RETRY_SECONDS)
            continue
        if failures:
            log.warning(
                "%s: the run database answers again (after %d failed tries)", what, failures
            )
        return value


def within(seconds: float, call: Callable[[], T], what: str) -> T:
    """`call()`, or `TimeoutError` once `seconds` have passed without an answer. The call goes
    on in its thread until the database answers; the caller no longer waits for it."""
    done = threading.Event()
    values: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            values.append(call())
        except BaseException as exc:  # handed to the caller, who raises it
            errors.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="trainctl-deadline", daemon=True).start()
    if not done.wait(max(seconds, 0.0)):
        raise TimeoutError(f"{what}: the run database did not answer within {seconds:.1f} s")
    if errors:
        raise errors[0]
    return values[0]


STALL_PROBE_SECONDS = 1.0
STALL_PATIENCE_SECONDS = 3.0
"""How long a probe of the run database may go unanswered before the service says it is
unavailable: a query there takes milliseconds, and a request's own query would wait as long
as the pause."""


class StallWatch:
    """Probes the run database (`SELECT 1`) every STALL_PROBE_SECONDS on an engine of its own,
    so that a busy pool never looks like a stall. A paused server raises nothing (see the
    module): its queries just wait. While a probe has been waiting longer than the patience,
    `check` refuses (DatabaseStalled), and the service answers 503 at once instead of holding
    every request for as long as the pause lasts. A request already waiting waits on."""

    def __init__(
        self,
        probe: Callable[[], object],
        interval: float = STALL_PROBE_SECONDS,
        patience: float = STALL_PATIENCE_SECONDS,
    ) -> None:
        self.probe, self.interval, self.patience = probe, interval, patience
        self._since: float | None = None  # when the probe in flight began
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="trainctl-db-watch", daemon=True)
        self._dispose: Callable[[], None] = lambda: None

    @classmethod
    def of_database(cls, url: str) -> StallWatch:
        """A watch of the database at `url`, on an engine of its own (one connection): a
        pool that requests keep busy is no stall."""
        engine = build_engine(url, pool_size=1, max_overflow=0)

        def probe() -> None:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))

        watch = cls(probe)
        watch._dispose = engine.dispose
        return watch

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._dispose()

    def stalled_for(self) -> float | None:
        """Seconds the probe in flight has waited, past the patience; None otherwise."""
        with self._lock:
            since = self._since
        waited = None if since is None else time.monotonic() - since
        return waited if waited is not None and waited > self.patience else None

    def check(self) -> None:
        waited = self.stalled_for()
        if waited is not None:
            raise DatabaseStalled(
                f"the run database has not answered for {waited:.0f} s (a paused or frozen "
                "server); try again shortly"
            )

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                if self._since is not None:
                    continue  # the last probe still waits: that is what `check` reads
                self._since = time.monotonic()
            threading.Thread(target=self._probe, name="trainctl-db-probe", daemon=True).start()

    def _probe(self) -> None:
        try:
            self.probe()
        except Exception:
            pass  # refused or cut off at once: the requests' own queries fail, and say so
        finally:
            with self._lock:
                self._since = None

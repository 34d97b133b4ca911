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
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

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

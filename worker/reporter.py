"""A run's reports to the database, written from a thread of their own, so that the training
thread never waits on the database (docs/design/runs.md, "Database outages").

The training thread hands over events and progress and reads the cancel flag as this thread
last saw it. Events are written in the order they came, each retried until the database
answers; progress is a value, so only the newest waiting one is written. Nothing is lost while
the lease holds, and memory is bounded: past MAX_HELD_EVENTS waiting events, new ones are
dropped, with one log line saying so. Once the run's lease is lost, what waits is dropped:
the run belongs to another attempt.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainctl.store.db.outages import until_answered
from trainctl.store.exceptions import LeaseLost
from trainctl.store.vocabulary import EventType

if TYPE_CHECKING:
    from trainctl.worker.context import RunContext

log = logging.getLogger("trainctl.worker")
MAX_HELD_EVENTS = 10_000
"""Events that may wait for the database: a lease's worth of metrics at hundreds a second."""
CANCEL_POLL_INTERVAL = 0.5
SLOW_WRITE_SECONDS = 1.0
"""A write that took longer gets a log line: how much training went on meanwhile."""


class Reporter:
    """One run's reports on their way to the database; `cancelled` as last read there."""

    def __init__(self, ctx: RunContext, max_held: int = MAX_HELD_EVENTS) -> None:
        self.ctx, self.max_held = ctx, max_held
        self.cancelled = False
        self._held: deque[tuple[EventType, dict[str, Any]]] = deque()
        self._progress: tuple[int, int | None] | None = None
        self._step: int | None = None  # the newest step handed over, for the log
        self._busy = False
        self._dropped = 0
        self._closing = threading.Event()
        self._give_up = threading.Event()  # closing a run whose lease is gone: drop the rest
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        # The flag is read once before the run's first unit of work: a cancel that came
        # between the claim and the start stops the run at once, even one that ends sooner
        # than this thread's first turn (an export under load).
        self._check_cancel()
        self._thread = threading.Thread(target=self._work, name="trainctl-reporter", daemon=True)
        self._thread.start()

    def event(self, type: EventType, data: dict[str, Any]) -> None:
        with self._changed:
            if len(self._held) >= self.max_held:
                self._dropped += 1
                if self._dropped == 1:
                    log.error(
                        "run %s: %d events wait for the run database; dropping new ones until "
                        "it answers",
                        self.ctx.run.id,
                        len(self._held),
                    )
                return
            if self._dropped:
                log.warning("run %s: %d events were dropped", self.ctx.run.id, self._dropped)
                self._dropped = 0
            self._held.append((type, data))
            self._changed.notify()

    def progress(self, step: int, total_steps: int | None) -> None:
        with self._changed:
            self._progress, self._step = (step, total_steps), step
            self._changed.notify()

    def flush(self) -> None:
        """Wait until everything handed over is written, or the lease is lost; however long
        the database takes to answer."""
        with self._changed:
            while (self._held or self._progress or self._busy) and self._writing():
                self._changed.wait(CANCEL_POLL_INTERVAL)

    def close(self, *, keep: bool) -> None:
        """Stop the thread: after everything is written where `keep` (an outcome to report),
        else after the write under way (the lease is gone: what waits would be fenced)."""
        if self._thread is None:
            return
        if keep:
            self.flush()
        else:
            self._give_up.set()
        self._closing.set()
        with self._changed:
            self._changed.notify()
        self._thread.join()

    def _writing(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _work(self) -> None:
        last_cancel_check = 0.0
        while True:
            write = self._take()
            started = time.monotonic()
            if write is not None:
                self._write(write)
            elif self._closing.is_set():
                return
            if time.monotonic() - last_cancel_check >= CANCEL_POLL_INTERVAL:
                last_cancel_check = time.monotonic()
                self._check_cancel()
            if time.monotonic() - started >= SLOW_WRITE_SECONDS:
                self._tell_slow(time.monotonic() - started)

    def _tell_slow(self, waited: float) -> None:
        with self._changed:
            step, held = self._step, len(self._held)
        log.warning(
            "run %s: the run database took %.1f s to answer; meanwhile training went on to "
            "step %s, and %d events waited",
            self.ctx.run.id,
            waited,
            step,
            held,
        )

    def _take(self) -> Callable[[], Any] | None:
        """The oldest waiting event, else the newest progress, else None (after a wait)."""
        ctx = self.ctx
        with self._changed:
            self._busy = False
            self._changed.notify_all()
            if not (self._held or self._progress or self._closing.is_set()):
                self._changed.wait(CANCEL_POLL_INTERVAL)
            if self._give_up.is_set() or ctx.lease_lost.is_set():
                self._held.clear()
                self._progress = None
                return None
            self._busy = bool(self._held or self._progress)
            if self._held:
                type, data = self._held.popleft()
                return lambda: ctx.runs.append_event(
                    ctx.run.id, type, data, worker_id=ctx.worker_id, attempt=ctx.attempt
                )
            if self._progress:
                (step, total), self._progress = self._progress, None
                return lambda: ctx.runs.set_progress(
                    ctx.run.id, ctx.worker_id, ctx.attempt, step, total
                )
        return None

    def _write(self, write: Callable[[], Any]) -> None:
        try:
            until_answered(write, f"run {self.ctx.run.id}", log, stop=self._give_up)
        except LeaseLost as exc:
            log.warning("run %s: lease lost, stopping: %s", self.ctx.run.id, exc)
            self.ctx.lease_lost.set()
        except Exception:
            if not self._give_up.is_set():  # a report the store refused: the next one may do
                log.exception("run %s: a report could not be written", self.ctx.run.id)
            return

    def _check_cancel(self) -> None:
        if self.cancelled or self.ctx.lease_lost.is_set():
            return
        try:
            self.cancelled = self.ctx.runs.is_cancel_requested(self.ctx.run.id)
        except Exception as exc:  # the database is away: the flag keeps its last value
            log.debug("run %s: cancel check failed: %s", self.ctx.run.id, exc)

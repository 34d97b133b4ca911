"""Each metrics sink fed from the event log, in a thread of the service (docs/design/sinks.md,
"Metrics sinks").

A `SinkMirror` per sink, so a tracking server that hangs holds up only its own sink. Every
`sink_poll_seconds` it asks the store, with a read, whether anything awaits the sink; if so it
takes the sink's lease (one service per deployment mirrors a sink), opens cursors for new runs
that name it, and moves each open cursor on by at most `BATCH_EVENTS` events. A tick's work is
bounded, so a long backlog is worked off a slice at a time, never in one go that would hold the
database or the interpreter for long; while one is left, ticks follow each other at once.

A sink that fails never touches the run: the events stay in the log and the cursor stays
where it was. The sink is offered them again after 1 s, then 2, 4, ... up to
`sink_retry_max_seconds`; the run's log says once per outage what was not mirrored, and once
more when the sink has caught up.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from trainctl.service.settings import Settings
from trainctl.service.sinks.base import Sink, SinkRefused, SinkUnavailable
from trainctl.service.sinks.mlflow import MlflowSink
from trainctl.service.sinks.tensorboard import TensorBoardSink
from trainctl.service.sinks.wandb import WandbSink, wandb_config
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.db.records import Event, Run
from trainctl.store.db.runs import RunStore
from trainctl.store.db.sinks import REFUSED, Cursor, SinkStore
from trainctl.store.exceptions import LeaseLost, RunNotFound
from trainctl.store.vocabulary import TERMINAL_STATES

log = logging.getLogger("trainctl.sinks")

BATCH_EVENTS = 500
"""Events one run offers a sink per tick."""
CURSORS_PER_TICK = 100
"""Runs served per tick, least recently served first."""
FIRST_RETRY_SECONDS = 1.0


@dataclass
class _Backoff:
    failures: int = 0
    next_try: float = 0.0


class SinkMirror:
    """Follows the event log into one sink until stopped."""

    def __init__(
        self,
        sink: Sink,
        runs: RunStore,
        cursors: SinkStore,
        *,
        poll_seconds: float,
        retry_max_seconds: float,
    ) -> None:
        self.sink, self.runs, self.cursors = sink, runs, cursors
        self.poll_seconds, self.retry_max_seconds = poll_seconds, retry_max_seconds
        self._backoff: dict[str, _Backoff] = {}
        self._held = False
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name=f"trainctl-sink-{sink.name}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the tick in progress (its cursors are saved), then let the sink go."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._held:
            self.cursors.release()  # another service may take the sink over at once
        self.sink.close()

    def _loop(self) -> None:
        busy = False
        while not self._stop.wait(0 if busy else self.poll_seconds):
            try:
                busy = self.tick()
            except LeaseLost as exc:
                log.warning("%s sink: %s", self.sink.name, exc)
                busy = False
            except Exception:  # keep mirroring; the next tick tries again
                log.exception("%s sink: tick failed", self.sink.name)
                busy = False

    def tick(self) -> bool:
        """One round of work; True when events are left for the next one."""
        if not self.cursors.has_work():
            return False
        self._held = self.cursors.acquire()
        if not self._held:
            return False  # another service mirrors this sink
        self.cursors.discover()
        cursors = self.cursors.open_cursors(CURSORS_PER_TICK)
        # A full page may hide runs behind idle ones: those are touched to the back.
        touch = len(cursors) == CURSORS_PER_TICK
        busy = False
        for cursor in cursors:
            if self._stop.is_set():
                break
            busy |= self._follow(cursor, touch)
        return busy

    def _follow(self, cursor: Cursor, touch: bool) -> bool:
        """Offer the run's next events to the sink; True when more are waiting."""
        backoff = self._backoff.get(cursor.run_id)
        if backoff is not None and time.monotonic() < backoff.next_try:
            return False
        try:
            # The state before the events, as the SSE stream does: a run read as ended has
            # written its last event by then, so a short batch after it is the end.
            run = self.runs.get(cursor.run_id)
            events = self.runs.events(
                cursor.run_id, after_id=cursor.last_event_id, limit=BATCH_EVENTS
            )
        except RunNotFound:
            return False  # runs are never deleted; nothing to mirror if one were
        ended = run.state in TERMINAL_STATES and len(events) < BATCH_EVENTS
        memo = dict(cursor.memo)
        try:
            if events:
                self.sink.write(run, events, memo)
            if ended:
                self.sink.finish(run, memo)
        except SinkUnavailable as exc:
            self._unavailable(cursor, run, events, memo, exc)
            return False
        except SinkRefused as exc:
            self._refused(cursor, run, events, memo, exc)
            return False
        except Exception as exc:  # a bug or a surprise: kept from the other runs, and retried
            log.exception("%s sink: run %s", self.sink.name, run.id)
            self._unavailable(cursor, run, events, memo, SinkUnavailable(repr(exc)))
            return False
        self._backoff.pop(cursor.run_id, None)
        if cursor.outage_since is not None:
            self._recovered(cursor, run)
        elif not (events or ended or touch):
            return False  # nothing new: no write
        last = events[-1].id if events else cursor.last_event_id
        self.cursors.save(cursor, last_event_id=last, memo=memo, outage_since=None, done=ended)
        return len(events) == BATCH_EVENTS

    def _unavailable(
        self,
        cursor: Cursor,
        run: Run,
        events: Sequence[Event],
        memo: dict[str, Any],
        exc: SinkUnavailable,
    ) -> None:
        backoff = self._backoff.setdefault(cursor.run_id, _Backoff())
        backoff.failures += 1
        delay = min(
            FIRST_RETRY_SECONDS * 2 ** min(backoff.failures - 1, 30), self.retry_max_seconds
        )
        backoff.next_try = time.monotonic() + delay
        outage_since = cursor.outage_since
        if outage_since is None:  # the first failure of this outage: say so, once
            outage_since = datetime.now(UTC)
            name = self.sink.name
            message = (
                f"{name}: {_what(events)} not mirrored: {exc}. The log keeps everything, "
                f"and {name} gets what it missed when it is back (retried after 1 s, then at "
                f"growing intervals up to {self.retry_max_seconds:g} s)"
            )
            log.warning("run %s: %s", run.id, message)
            self.runs.append_event(run.id, "log", _log_line(message, "warning", name))
        if outage_since != cursor.outage_since or memo != cursor.memo:
            self.cursors.save(
                cursor, last_event_id=cursor.last_event_id, memo=memo, outage_since=outage_since
            )

    def _refused(
        self,
        cursor: Cursor,
        run: Run,
        events: Sequence[Event],
        memo: dict[str, Any],
        exc: SinkRefused,
    ) -> None:
        name = self.sink.name
        message = (
            f"{name}: refused {_what(events)}: {exc}. This run is no longer mirrored to "
            f"{name}; its event log has everything"
        )
        log.error("run %s: %s", run.id, message)
        self.runs.append_event(run.id, "log", _log_line(message, "error", name))
        self._backoff.pop(cursor.run_id, None)
        self.cursors.save(
            cursor,
            last_event_id=cursor.last_event_id,
            memo=memo | {REFUSED: True},  # a score recorded later does not reopen it
            outage_since=None,
            done=True,
        )

    def _recovered(self, cursor: Cursor, run: Run) -> None:
        assert cursor.outage_since is not None
        waited = (datetime.now(UTC) - cursor.outage_since).total_seconds()
        message = (
            f"{self.sink.name}: mirroring again after {waited:.0f} s; what it had missed is "
            "mirrored now"
        )
        log.info("run %s: %s", run.id, message)
        self.runs.append_event(run.id, "log", _log_line(message, "info", self.sink.name))


class SinkMirrors:
    """Every sink's mirror, started and stopped with the service (service/app.py)."""

    def __init__(self, mirrors: list[SinkMirror]) -> None:
        self.mirrors = mirrors

    @classmethod
    def build(cls, settings: Settings, runs: RunStore, checkpoints: CheckpointStore) -> SinkMirrors:
        holder = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        sinks: list[Sink] = [
            TensorBoardSink(settings.tensorboard_dir, settings.data_roots),
            # Without TRAINCTL_MLFLOW_URI it waits: a run that names mlflow is told so in its
            # log and mirrored once a service with a server takes the sink over.
            MlflowSink(settings.mlflow_uri, checkpoints, settings.mlflow_timeout_seconds),
        ]
        wandb = wandb_config(settings)
        if wandb is not None:  # off: no thread, and wandb never imported
            sinks.append(WandbSink(wandb, checkpoints, runs))
        return cls(
            [
                SinkMirror(
                    sink,
                    runs,
                    SinkStore(runs.engine, sink.name, holder, settings.lease_seconds),
                    poll_seconds=settings.sink_poll_seconds,
                    retry_max_seconds=settings.sink_retry_max_seconds,
                )
                for sink in sinks
            ]
        )

    def start(self) -> None:
        for mirror in self.mirrors:
            mirror.start()

    def stop(self) -> None:
        for mirror in self.mirrors:
            mirror.stop()


def _what(events: Sequence[Event]) -> str:
    """What a failed offer held, as the run's log tells it."""
    if not events:
        return "the run's end"
    steps = [e.data["step"] for e in events if e.type == "metrics" and "step" in e.data]
    since = f" (step {steps[0]} on)" if steps else ""
    return f"this run's events from id {events[0].id} on{since}"


def _log_line(message: str, level: str, sink: str) -> dict[str, Any]:
    """A `log` event as the worker writes them (worker/context.py), marked as the sink's."""
    return {"level": level, "message": message, "sink": sink}

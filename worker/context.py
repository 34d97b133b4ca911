"""What an executing run may do: report events and progress, and learn that it must stop.

Every write is fenced by (run id, worker id, attempt) in the store. Once the lease is lost
(the supervisor reaped the run), writes raise LeaseLost; the context then turns quiet and
asks the run to stop, because the run belongs to someone else now.

In a worker, events and progress go through a thread of their own (worker/reporter.py), so
the training thread never waits on the database; and the worker keeps the monotonic time of
its last lease renewal, so that an outage longer than the lease stops the run at a step
(`lease_expired`) before anyone can have reaped it (docs/design/runs.md, "Database outages").
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from trainctl.store.checkpoints.store import Protected
from trainctl.store.db.outages import until_answered, within
from trainctl.store.db.records import Run
from trainctl.store.db.runs import RunStore
from trainctl.store.exceptions import LeaseLost
from trainctl.store.vocabulary import EventType
from trainctl.worker.exceptions import LeaseExpired
from trainctl.worker.reporter import CANCEL_POLL_INTERVAL, Reporter

log = logging.getLogger("trainctl.worker")
StopReason = Literal["cancel", "shutdown", "lease_lost", "lease_expired", "grow"]
PROGRESS_INTERVAL = 0.5  # seconds between progress writes; metrics are all kept


class RunContext:
    def __init__(
        self,
        run: Run,
        runs: RunStore,
        worker_id: str,
        shutdown: threading.Event,
        lease_seconds: float = 30.0,
        renewed_at: float | None = None,
    ) -> None:
        self.run, self.runs, self.worker_id = run, runs, worker_id
        self.shutdown, self.lease_seconds = shutdown, lease_seconds
        self.lease_lost = threading.Event()
        self.renewed_at = renewed_at
        """When the lease was last renewed (time.monotonic() before the claim or heartbeat
        that renewed it); None where this process does not watch the lease (a rank of a
        torchrun launch: its worker does)."""
        self.reporter = Reporter(self)
        self._expired = self._expiry_told = False
        self._cancelled = False
        self._last_cancel_check = 0.0
        self._last_progress = 0.0

    @property
    def attempt(self) -> int:
        return self.run.attempt

    def __enter__(self) -> RunContext:
        self.reporter.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.reporter.close(keep=not self.lease_gone())

    def lease_left(self) -> float | None:
        """Seconds until the lease this worker last renewed runs out (None: not watched)."""
        if self.renewed_at is None:
            return None
        return self.renewed_at + self.lease_seconds - time.monotonic()

    def lease_expired(self) -> bool:
        """Whether the lease ran out unrenewed; once seen, for good: the run is stopping, and
        a renewal the database answers late must not start it again."""
        left = self.lease_left()
        self._expired = self._expired or (left is not None and left <= 0)
        return self._expired

    def lease_gone(self) -> bool:
        return self.lease_lost.is_set() or self.lease_expired()

    def _fenced(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self.lease_lost.is_set():
            return None
        try:
            return fn(*args, **kwargs)
        except LeaseLost as exc:
            log.warning("run %s: lease lost, stopping: %s", self.run.id, exc)
            self.lease_lost.set()
            return None

    def log(self, message: str, level: str = "info", **fields: Any) -> None:
        """A log event; `fields` are data for programs beside the message for people."""
        log.log(logging.getLevelName(level.upper()), "run %s: %s", self.run.id, message)
        self._event("log", {"level": level, "message": message, **fields})

    def log_checkpoint(self, saved: dict[str, Any]) -> None:
        """A Trainer's `on_checkpoint`: the saved checkpoint, in words and as data (the
        service's /metrics reads `checkpoint.save_seconds`)."""
        checkpoint = {k: saved[k] for k in ("experiment", "tag", "step", "save_seconds")}
        where = f"{saved['experiment']}/{saved['tag']}"
        self.log(f"saved checkpoint {where} at step {saved['step']}", checkpoint=checkpoint)

    def log_health(self, record: dict[str, Any]) -> None:
        """A Trainer's `on_health`: a loss-health intervention, in words and as data (the
        service's /metrics counts `health.action`, webhooks and the dashboard read it)."""
        health = {k: v for k, v in record.items() if k != "message"}
        self.log(record["message"], level="warning", health=health)

    def metrics(self, data: dict[str, Any]) -> None:
        self._event("metrics", data)
        if "step" in data and "total_steps" in data:
            self.progress(int(data["step"]), int(data["total_steps"]))

    def sample(self, data: dict[str, Any]) -> None:
        """Generated text: a training sample, or a piece of a sample run's completion."""
        self._event("sample", data)

    def eval_items(self, data: dict[str, Any]) -> None:
        """A chunk of an evaluate run's per-item predictions (store.evals.items)."""
        self._event("eval_items", data)

    def _event(self, type: EventType, data: dict[str, Any]) -> None:
        if self.reporter.started:
            self.reporter.event(type, data)
            return
        self._fenced(
            self.runs.append_event,
            self.run.id,
            type,
            data,
            worker_id=self.worker_id,
            attempt=self.attempt,
        )

    def progress(self, step: int, total_steps: int | None, force: bool = False) -> None:
        """`step` of `total_steps` (None: not known, as a prepare's documents)."""
        now = time.monotonic()
        done = total_steps is not None and step >= total_steps
        if force or done or now - self._last_progress >= PROGRESS_INTERVAL:
            self._last_progress = now
            if self.reporter.started:
                self.reporter.progress(step, total_steps)
                return
            self._fenced(
                self.runs.set_progress, self.run.id, self.worker_id, self.attempt, step, total_steps
            )

    def cancel_requested(self) -> bool:
        if self.reporter.started:
            return self.reporter.cancelled
        now = time.monotonic()
        if not self._cancelled and now - self._last_cancel_check >= CANCEL_POLL_INTERVAL:
            self._last_cancel_check = now
            self._cancelled = bool(self._fenced(self.runs.is_cancel_requested, self.run.id))
        return self._cancelled

    def should_stop(self) -> bool:
        return self.stop_reason() is not None

    def stop_reason(self) -> StopReason | None:
        if self.lease_lost.is_set():
            return "lease_lost"
        if self.lease_expired():
            if not self._expiry_told:
                self._expiry_told = True
                log.warning(
                    "run %s: no lease renewal for %.0f s (the run database does not answer): "
                    "stopping at this step, committing nothing",
                    self.run.id,
                    self.lease_seconds,
                )
            return "lease_expired"
        if self.shutdown.is_set():
            return "shutdown"
        if self.cancel_requested():
            return "cancel"
        return None

    def heartbeat(self, lease_seconds: float) -> None:
        started = time.monotonic()
        self._fenced(self.runs.heartbeat, self.run.id, self.worker_id, self.attempt, lease_seconds)
        self._renewed(started)

    def _renewed(self, started: float) -> None:
        # The store dates the new lease from a moment after `started`: counting from
        # `started` errs on the safe side. Renewals answered out of order never go back.
        if self.renewed_at is not None and not self.lease_gone():
            self.renewed_at = max(self.renewed_at, started)

    def while_owned(self, protected: Callable[[], Protected]) -> Callable[[], Protected]:
        """`protected` for the retention after a save, asked only after `confirm_lease`: a
        worker that was stalled between its commit and its retention, and fenced out
        meanwhile, deletes nothing of what the run's next attempt works with."""

        def ask() -> Protected:
            self.confirm_lease()
            return protected()

        return ask

    def confirm_lease(self) -> None:
        """Raise LeaseLost unless this worker still owns the run, and extend the lease.

        Called just before a checkpoint becomes visible: a worker that was stalled (stopped,
        swapped out, partitioned) past its lease and reaped must not publish a checkpoint the
        run's new attempt would resume from. Extending the lease closes the window between
        this check and the commit. Where the worker watches its lease, it waits for the
        database no longer than the lease has left, and refuses at once once it has run out
        (`LeaseExpired`): the run may be reaped, and its next attempt must not see this save.
        """
        if self.lease_lost.is_set():
            raise LeaseLost(f"run {self.run.id}: this worker lost its lease; not saving")
        left, started = self.lease_left(), time.monotonic()
        renew = lambda: self.runs.heartbeat(  # noqa: E731
            self.run.id, self.worker_id, self.attempt, self.lease_seconds
        )
        # A paused server may also refuse a new connection (its connect timeout) before the
        # lease runs out: that is the database's absence too, tried again until then, never
        # the run's error (which would spend an attempt on a pause the lease covers).
        gave_up = threading.Event()
        what = f"run {self.run.id}: confirming the lease"
        try:
            if left is None:
                renew()
            else:
                if self.lease_expired():
                    raise TimeoutError(f"no renewal for {self.lease_seconds:.0f} s")
                within(left, lambda: until_answered(renew, what, log, stop=gave_up), what)
        except LeaseLost:
            self.lease_lost.set()
            raise
        except TimeoutError as exc:
            raise LeaseExpired(
                f"the lease ran out while the run database did not answer ({exc}); not saving"
            ) from None
        finally:
            gave_up.set()  # a renewal still trying in its thread stops at its next failure
        self._renewed(started)


class Heartbeat:
    """Extends the run's lease from a thread while the main thread trains."""

    def __init__(self, ctx: RunContext, interval: float, lease_seconds: float) -> None:
        self.ctx, self.interval, self.lease_seconds = ctx, interval, lease_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="trainctl-heartbeat", daemon=True)

    def _beat(self) -> None:
        failures = 0
        while not self._stop.wait(self.interval):
            try:
                self.ctx.heartbeat(self.lease_seconds)
                if self.ctx.runs.workers.heartbeat(self.ctx.worker_id):
                    self.ctx.shutdown.set()  # asked to drain: stop as on SIGTERM (worker.drain)
                if self.ctx.run.gang is not None:
                    # A gang's members may be all the workers there are, and a busy worker
                    # reaps nothing: each member watches the others' leases itself, so a
                    # stalled member gets the gang requeued and the rest stop.
                    self.ctx.runs.reap_expired()
            except Exception:  # a database hiccup: log it once, the next beat retries
                failures += 1
                if failures == 1:
                    log.exception("heartbeat of run %s failed", self.ctx.run.id)
                continue
            if failures:
                log.warning(
                    "run %s: heartbeat renewed after %d failures", self.ctx.run.id, failures
                )
                failures = 0

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        # A beat the database holds up (a paused server) is not waited for: it lands, or is
        # fenced, when the database answers, and dates the lease from its own start.
        self._thread.join(timeout=self.interval)

"""What an executing run may do: report events and progress, and learn that it must stop.

Every write is fenced by (run id, worker id, attempt) in the store. Once the lease is lost
(the supervisor reaped the run), writes raise LeaseLost; the context then turns quiet and
asks the run to stop, because the run belongs to someone else now.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Literal

from trainctl.store.db.runs import Run, RunStore
from trainctl.store.exceptions import LeaseLost
from trainctl.store.vocabulary import EventType

log = logging.getLogger("trainctl.worker")
StopReason = Literal["cancel", "shutdown", "lease_lost"]
PROGRESS_INTERVAL = 0.5  # seconds between progress writes; metrics are all kept
CANCEL_POLL_INTERVAL = 0.5


class RunContext:
    def __init__(
        self,
        run: Run,
        runs: RunStore,
        worker_id: str,
        shutdown: threading.Event,
        lease_seconds: float = 30.0,
    ) -> None:
        self.run, self.runs, self.worker_id = run, runs, worker_id
        self.shutdown, self.lease_seconds = shutdown, lease_seconds
        self.lease_lost = threading.Event()
        self._cancelled = False
        self._last_cancel_check = 0.0
        self._last_progress = 0.0

    @property
    def attempt(self) -> int:
        return self.run.attempt

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

    def metrics(self, data: dict[str, Any]) -> None:
        self._event("metrics", data)
        if "step" in data and "total_steps" in data:
            self.progress(int(data["step"]), int(data["total_steps"]))

    def sample(self, data: dict[str, Any]) -> None:
        """Generated text: a training sample, or a piece of a sample run's completion."""
        self._event("sample", data)

    def _event(self, type: EventType, data: dict[str, Any]) -> None:
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
            self._fenced(
                self.runs.set_progress, self.run.id, self.worker_id, self.attempt, step, total_steps
            )

    def cancel_requested(self) -> bool:
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
        if self.shutdown.is_set():
            return "shutdown"
        if self.cancel_requested():
            return "cancel"
        return None

    def heartbeat(self, lease_seconds: float) -> None:
        self._fenced(self.runs.heartbeat, self.run.id, self.worker_id, self.attempt, lease_seconds)

    def confirm_lease(self) -> None:
        """Raise LeaseLost unless this worker still owns the run, and extend the lease.

        Called just before a checkpoint becomes visible: a worker that was stalled (stopped,
        swapped out, partitioned) past its lease and reaped must not publish a checkpoint the
        run's new attempt would resume from. Extending the lease closes the window between
        this check and the commit.
        """
        if self.lease_lost.is_set():
            raise LeaseLost(f"run {self.run.id}: this worker lost its lease; not saving")
        try:
            self.runs.heartbeat(self.run.id, self.worker_id, self.attempt, self.lease_seconds)
        except LeaseLost:
            self.lease_lost.set()
            raise


class Heartbeat:
    """Extends the run's lease from a thread while the main thread trains."""

    def __init__(self, ctx: RunContext, interval: float, lease_seconds: float) -> None:
        self.ctx, self.interval, self.lease_seconds = ctx, interval, lease_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="trainctl-heartbeat", daemon=True)

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.ctx.heartbeat(self.lease_seconds)
                if self.ctx.runs.worker_heartbeat(self.ctx.worker_id):
                    self.ctx.shutdown.set()  # asked to drain: stop as on SIGTERM (worker.drain)
                if self.ctx.run.gang is not None:
                    # A gang's members may be all the workers there are, and a busy worker
                    # reaps nothing: each member watches the others' leases itself, so a
                    # stalled member gets the gang requeued and the rest stop.
                    self.ctx.runs.reap_expired()
            except Exception:  # a database hiccup: log it, the next beat retries
                log.exception("heartbeat of run %s failed", self.ctx.run.id)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

"""The worker's stop, and the deadline its run has to hand back by (docs/operations.md,
"Preemption and drain").

SIGTERM, SIGINT and a drain request (POST /workers/{id}/drain, read by the heartbeat) all set
one `Shutdown`. The moment it is first set starts the deadline, `TRAINCTL_DRAIN_SECONDS`
later (store.layout.DRAIN_SECONDS by default): a train run stops at
the next step boundary, stages its state to host memory and stops its ranks, and the write
goes on in the background until the deadline. A save that cannot commit by then is
abandoned: the checkpoint before it stays the latest, and nothing of it is listed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from trainctl.store.layout import DRAIN_SECONDS

HANDBACK_GRACE_SECONDS = 1.0
"""After the deadline, how long a run that stops by itself (a train run, at its deadline) has
to hand back before the worker's `DeadlineWatch` does it for the run."""
POLL_SECONDS = 0.1


class Shutdown(threading.Event):
    """An Event that remembers when it was first set (`time.monotonic()`, a clock every
    process of the node shares, so the ranks of a run measure from the same signal)."""

    def __init__(self, seconds: float = DRAIN_SECONDS) -> None:
        super().__init__()
        if not seconds > 0:
            raise ValueError(f"TRAINCTL_DRAIN_SECONDS must be above 0, got {seconds}")
        self.seconds = seconds
        self.since: float | None = None

    def set(self, since: float | None = None) -> None:
        """Stop now (or, in a rank, since the moment its worker was told: `since`)."""
        if self.since is None:
            self.since = time.monotonic() if since is None else since
        super().set()

    @property
    def deadline(self) -> float | None:
        """When the run must have handed back (`time.monotonic()`); None until set."""
        return None if self.since is None else self.since + self.seconds

    def elapsed(self) -> float | None:
        """Seconds since the stop began; None until set."""
        return None if self.since is None else time.monotonic() - self.since


def as_shutdown(event: threading.Event) -> Shutdown | None:
    """`event` if it carries a deadline; None for a plain Event (tests, scripts)."""
    return event if isinstance(event, Shutdown) else None


class DeadlineWatch:
    """Hands the run back at the deadline if it has not stopped by then.

    Every built-in kind stops within a unit of its work and hands back by itself
    (worker/stops.py); a unit that outlasts the deadline (a plug-in that never checks) or a
    run stuck (a synchronous save to a store that stopped answering) would hold the node past
    its preemption. `hand_back` runs on this thread, once the
    deadline and the grace have passed with the run still going: it requeues the run (fenced,
    so a run that handed back meanwhile is left alone) and ends the process.
    """

    def __init__(self, shutdown: Shutdown, hand_back: Callable[[], None]) -> None:
        self.shutdown, self.hand_back = shutdown, hand_back
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="trainctl-drain", daemon=True)

    def _watch(self) -> None:
        while not self.shutdown.is_set():
            if self.done.wait(POLL_SECONDS):
                return
        deadline = self.shutdown.deadline
        assert deadline is not None  # set with the shutdown
        late = deadline + HANDBACK_GRACE_SECONDS - time.monotonic()
        if not self.done.wait(max(0.0, late)):
            self.hand_back()

    def __enter__(self) -> DeadlineWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()

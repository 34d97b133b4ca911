"""The worker's stop, and the deadline its run has to hand back by (docs/operations.md,
"Preemption and drain").

SIGTERM, SIGINT and a drain request (POST /workers/{id}/drain, read by the heartbeat) all set
one `Shutdown`. The moment it is first set starts the deadline, `TRAINCTL_DRAIN_SECONDS`
later (30 s by default, the warning GCP gives; AWS gives two minutes): a train run stops at
the next step boundary, stages its state to host memory and stops its ranks, and the write
goes on in the background until the deadline. A save that cannot commit by then is
abandoned: the checkpoint before it stays the latest, and nothing of it is listed.
"""

from __future__ import annotations

import threading
import time

DRAIN_SECONDS = 30.0


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

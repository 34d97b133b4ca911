"""Bounds on what requests may hold at once: store requests, and open event streams.

Counted on the event loop, which is one thread, so no lock is needed. Beyond a bound the
answer is an `Overloaded` error (service/errors.py), with Retry-After
(docs/design/access.md, "Admission and access").
"""

from __future__ import annotations

import asyncio
from collections import Counter

from trainctl.service.errors import Overloaded

RETRY_SECONDS = 1


class Slots:
    """At most `limit` requests at once; one more waits up to `wait_seconds` for a slot,
    then gets a 503. A request stuck in the store (a file that never answers) then holds
    one slot, and one thread of the pool, but never all of them."""

    def __init__(self, limit: int, wait_seconds: float, what: str) -> None:
        self.limit, self.wait_seconds, self.what = limit, wait_seconds, what
        self._free = asyncio.Semaphore(limit)

    async def take(self) -> None:
        try:
            await asyncio.wait_for(self._free.acquire(), self.wait_seconds)
        except TimeoutError:
            raise Overloaded(
                f"all {self.limit} slots for {self.what} are taken and none freed up within "
                f"{self.wait_seconds:g} s (TRAINCTL_STORE_CONCURRENCY); retry later",
                status=503,
                retry_after=RETRY_SECONDS,
            ) from None

    def give(self) -> None:
        self._free.release()


class StreamSlots:
    """At most `per_token` open event streams for each token (the loopback service's
    requests share one), and `total` in all; beyond, 429 and 503."""

    def __init__(self, total: int, per_token: int) -> None:
        self.total, self.per_token = total, per_token
        self.open: Counter[str | None] = Counter()

    def take(self, token: str | None) -> None:
        if self.open[token] >= self.per_token:
            who = f"token {token!r}" if token is not None else "this service"
            raise Overloaded(
                f"{who} has {self.per_token} event streams open, the most one token may "
                "(TRAINCTL_MAX_EVENT_STREAMS_PER_TOKEN); close one, or retry later",
                status=429,
                retry_after=RETRY_SECONDS,
            )
        if self.open.total() >= self.total:
            raise Overloaded(
                f"{self.total} event streams are open, the most this service keeps "
                "(TRAINCTL_MAX_EVENT_STREAMS); retry later",
                status=503,
                retry_after=RETRY_SECONDS,
            )
        self.open[token] += 1

    def give(self, token: str | None) -> None:
        self.open[token] -= 1
        if not self.open[token]:
            del self.open[token]

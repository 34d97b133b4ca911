"""Waiting without fixed sleeps: poll a condition until it holds or a deadline passes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def poll(
    predicate: Callable[[], Any],
    timeout: float = 120.0,
    what: str = "condition",
    interval: float = 0.05,
) -> Any:
    """Return the first truthy value of `predicate()`; fail the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def holds_throughout(predicate: Callable[[], bool], seconds: float, what: str) -> None:
    """Assert `predicate` over a whole window: a claim that something does NOT happen can only
    be watched for a while, never waited for."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert predicate(), what
        time.sleep(0.05)

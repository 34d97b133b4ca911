"""Fixtures: a real webhook receiver (receiver.py), and the served app it hears from (live.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.service.webhooks.live import Live, fast_settings, live
from tests.service.webhooks.receiver import Receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Live]:
    with live(fast_settings(tmp_path)) as s:
        yield s

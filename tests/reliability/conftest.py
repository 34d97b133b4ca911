"""Fixtures of the reliability tests: a pool of worker processes (the run store they share
is tests/conftest.py's `runs`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability.workers import Workers


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    pool = Workers(tmp_path)
    yield pool
    pool.close()

"""Fixtures of the reliability tests: a SQLite run store and a pool of worker processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability.workers import Workers
from trainctl.store.db.runs import RunStore


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[RunStore]:
    store = RunStore(f"sqlite:///{tmp_path / 'trainctl.db'}")
    store.create_all()
    yield store
    store.close()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    pool = Workers(tmp_path)
    yield pool
    pool.close()

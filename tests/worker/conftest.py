"""Fixtures of the worker's tests: `runs`, a run store on a SQLite file in the test's
tmp_path, as a worker on one node has (a test file may define its own instead)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from trainctl.store.db.runs import RunStore


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[RunStore]:
    store = RunStore(f"sqlite:///{tmp_path / 'trainctl.db'}")
    store.create_all()
    yield store
    store.close()

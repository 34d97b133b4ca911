"""The databases a store test runs on, each fresh: SQLite and PostgreSQL (tests/support/pg.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.pg import PostgresServer

BACKENDS = ["sqlite", "postgresql"]


@contextmanager
def fresh_database(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> Iterator[str]:
    """The URL of a fresh, empty database of `backend`, dropped afterwards (PostgreSQL)."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'trainctl.db'}"
        return
    server: PostgresServer = request.getfixturevalue("postgres")
    with server.database() as url:
        yield url

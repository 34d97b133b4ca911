"""End-to-end fixtures: `service`, the real service (tests/support/service_process.py: `python -m
trainctl.service` on a free port, with its real worker process(es)) in the test's tmp_path, not
yet started.

It runs on SQLite unless a test asks for PostgreSQL with
`@pytest.mark.parametrize("service", ["postgresql"], indirect=True)`: then the service and
its workers share a fresh database on the session's PostgreSQL server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.databases import fresh_database
from tests.support.service_process import Service


@pytest.fixture
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Service]:
    backend = getattr(request, "param", "sqlite")
    with fresh_database(request, backend, tmp_path) as url:
        svc = Service(tmp_path)
        if backend != "sqlite":
            svc.extra_env["TRAINCTL_DATABASE_URL"] = url
        yield svc
        if svc.process is not None and svc.process.poll() is None:
            svc.stop()

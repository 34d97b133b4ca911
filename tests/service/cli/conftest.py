"""Fixtures: the real service (tests/support/service_process.py) for the CLI to talk to, one per
test module, started by one factory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.leftovers import RunsToStop
from tests.support.service_process import Service, StartService


@pytest.fixture(scope="module")
def start_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartService]:
    """start_service(workers=0, data_dir=None, **env): the real service, started in
    `data_dir` (else a fresh folder) with `env` set on top of the test's environment; each
    one stopped when the module's tests are done."""
    started: list[Service] = []

    def start(workers: int = 0, data_dir: Path | None = None, **env: str) -> Service:
        svc = Service(data_dir or tmp_path_factory.mktemp("service"), workers=workers)
        svc.extra_env = env
        started.append(svc)
        return svc.start()

    yield start
    for svc in started:
        if svc.process is not None and svc.process.poll() is None:
            svc.stop()


@pytest.fixture(scope="module")
def service(start_service: StartService) -> Service:
    """The real service with no workers: submitted runs stay queued."""
    return start_service()


@pytest.fixture
def stop_runs(service: Service) -> Iterator[RunsToStop]:
    """stop_runs.track(run_id): a run this test starts and means to stop; cancelled after the
    test if it is still active, so that a failure leaves the module's worker free
    (tests/support/leftovers.py)."""
    runs = RunsToStop(service.url, service.extra_env.get("TRAINCTL_API_TOKEN"))
    yield runs
    runs.stop()

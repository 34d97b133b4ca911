"""Fixtures of the training tests: a worker that runs a queued run in the test's process."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainctl.store.db.runs import RunStore
from trainctl.store.worker_settings import WorkerSettings
from trainctl.worker.runner import Worker


@pytest.fixture
def worker(runs: RunStore, tmp_path: Path) -> Worker:
    """The worker of the data dir `tmp_path`, as its process is (without its loop)."""
    return Worker(
        WorkerSettings(
            database_url=runs.engine.url.render_as_string(), data_dir=tmp_path, worker_id="w1"
        ),
        runs,
    )

"""The main end-to-end flow again with the service and its worker on PostgreSQL.

The other end-to-end tests run on SQLite only: the store tests already cover every query on
both databases, and each end-to-end test costs tens of seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e import test_service_e2e as flows
from tests.service_process import Service


@pytest.mark.parametrize("service", ["postgresql"], indirect=True)
def test_benchmark_train_validate_and_checkpoints_work_on_postgresql(
    service: Service, tmp_path: Path
) -> None:
    flows.test_benchmark_then_train_then_checkpoints_work_after_one_command(service, tmp_path)

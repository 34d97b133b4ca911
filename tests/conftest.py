"""Shared fixtures. GPU tests are skipped cleanly where CUDA is absent.

`database_url` runs a test once on SQLite (a file in its tmp_path) and once on PostgreSQL
(a fresh database on a real PostgreSQL 15 server that the session starts on first use).
`runs` is a run store on SQLite where a worker on one node keeps it: the data dir's
trainctl.db, the data dir being the test's tmp_path (the service's tests have their own,
their app's). `slurm_cluster` is a real Slurm cluster of three nodes on loopback
(tests/support/slurm.py) for a test module.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.support.databases import BACKENDS, fresh_database
from tests.support.mlflow_server import MlflowServer
from tests.support.pg import PostgresServer, PostgresUnavailable
from tests.support.s3server import S3Server, running_rclone_server, running_s3_server
from tests.support.slurm import SlurmCluster, SlurmUnavailable, unavailable_reason
from tests.support.soak import SKIP_REASON, SOAK
from trainctl.store.db.runs import RunStore
from trainctl.store.layout import DataLayout


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skips = {"gpu": None if torch.cuda.is_available() else "needs a CUDA device",
             "soak": None if SOAK else SKIP_REASON}  # fmt: skip
    for item in items:
        for marker, reason in skips.items():
            if reason and marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server for the whole session; the tests fail, not skip, without one."""
    try:
        server = PostgresServer().start()
    except PostgresUnavailable as exc:
        pytest.fail(f"cannot start PostgreSQL for the tests: {exc}", pytrace=False)
    yield server
    server.stop()


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[RunStore]:
    with RunStore(DataLayout(tmp_path).sqlite_url) as store:
        store.create_all()
        yield store


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with fresh_database(request, request.param, tmp_path) as url:
        yield url


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real S3 server (SeaweedFS on loopback, credentials enforced) for the whole session,
    started on first use; each test makes its own bucket (`S3Server.new_bucket`)."""
    with running_s3_server(tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture(scope="session")
def rclone_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A second S3 server, `rclone serve s3` over a folder (credentials enforced), for the
    session: the storage's conformance tests run on both (docs/design/checkpoints.md,
    "Object storage")."""
    with running_rclone_server(tmp_path_factory.mktemp("rclone")) as server:
        yield server


@pytest.fixture
def mlflow_server(tmp_path: Path) -> Iterator[MlflowServer]:
    """A real `mlflow server` of the test's own, launched by the test (`launch`), killed after."""
    server = MlflowServer(tmp_path / "mlflow")
    yield server
    server.kill()


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A Slurm cluster (n1, n2, n3 in the partition `debug`) for the module. It skips only
    where Slurm cannot be installed; where apt could install it, a missing Slurm fails."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except SlurmUnavailable as exc:
        pytest.fail(f"cannot start the Slurm cluster for the tests: {exc}", pytrace=False)
    yield cluster
    cluster.stop()

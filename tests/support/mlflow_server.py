"""A real `mlflow server` for the tests that mirror into MLflow (tests/e2e/test_sinks_e2e.py,
tests/service/sinks/test_sinks_mlflow.py), read back with MLflow's own client."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.polling import poll
from tests.support.ports import free_port


class MlflowServer:
    """`mlflow server` on a SQLite file and a fixed loopback port, stopped and started again
    at will (the same port and database: the same server, back after an outage)."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.port = folder, free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(self) -> None:
        """Start it without waiting; `wait_ready` waits."""
        self.folder.mkdir(exist_ok=True)
        mlflow = Path(sys.executable).with_name("mlflow")
        command = [
            str(mlflow), "server", "--host", "127.0.0.1", "--port", str(self.port),
            "--workers", "1", "--backend-store-uri", f"sqlite:///{self.folder / 'mlflow.db'}",
            "--artifacts-destination", str(self.folder / "artifacts"),
        ]  # fmt: skip
        # Its background job runner (a pool of huey consumers) serves features these tests
        # do not use, and would take the CPU the run needs.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        log = open(self.folder / "server.log", "ab")  # noqa: SIM115 - lives with the process
        # A session of its own: `mlflow server` runs uvicorn as a child, stopped with it.
        self.process = subprocess.Popen(
            command, cwd=self.folder, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        log.close()

    def wait_ready(self) -> None:
        poll(self._ready, timeout=120, what="mlflow server to answer")

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            log = (self.folder / "server.log").read_text(errors="replace")[-3000:]
            raise AssertionError(f"mlflow server exited: {log}")
        try:
            return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def kill(self) -> None:
        """Down at once, mid-request or not: what a crash or a lost node looks like."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        with pytest.raises(httpx.TransportError):  # down: connections are refused
            httpx.get(f"{self.url}/health", timeout=2)

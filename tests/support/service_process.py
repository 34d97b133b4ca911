"""The real service as a process: `python -m trainctl.service` on a free loopback port, with
its real worker process(es) and SQLite in a folder of the test's, driven over HTTP. The
end-to-end tests and the CLI's tests start it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.support.polling import poll
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Service:
    data_dir: Path
    port: int = field(default_factory=free_port)
    workers: int = 1
    process: subprocess.Popen[bytes] | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    cwd: Path = REPO
    argv: list[str] = field(default_factory=lambda: [sys.executable, "-m", "trainctl.service"])
    """How the service is started: another interpreter, or the console script."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, workers: int | None = None) -> Service:
        if workers is not None:
            self.workers = workers
        env = {
            **os.environ,
            "TRAINCTL_HOST": "127.0.0.1",
            "TRAINCTL_PORT": str(self.port),
            "TRAINCTL_DATA_DIR": str(self.data_dir),
            "TRAINCTL_WORKERS": str(self.workers),
            "TRAINCTL_LEASE_SECONDS": "5",
            "TRAINCTL_HEARTBEAT_SECONDS": "0.5",
            "TRAINCTL_REAP_SECONDS": "0.5",
            # Not niced as in production (10): beside a second pytest process (xdist) a niced
            # worker gets a tenth of a core and the test waiting on it times out.
            "TRAINCTL_WORKER_NICE": "0",
            **self.extra_env,
        }
        log = open(self.data_dir / "service.log", "ab")  # noqa: SIM115 - lives with the process
        self.process = subprocess.Popen(
            self.argv,
            cwd=self.cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        try:
            poll(self._ready, timeout=60, what="the service to be ready")
        except AssertionError as exc:
            # A service that never got ready is not left running (or unreaped: its Popen
            # would warn in whichever later test collects it, and fail that one instead).
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"{exc}; its log ends: {self.log_tail()}") from None
        return self

    def _ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"service exited: {self.log_tail()}")
        token = self.extra_env.get("TRAINCTL_API_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            r = httpx.get(f"{self.url}/readyz", headers=headers, timeout=2)
        except httpx.TransportError:
            return False
        return r.status_code == 200 and (self.workers == 0 or r.json()["workers_alive"] >= 1)

    def stop(self, timeout: float = 90) -> bool:
        """SIGTERM and wait; True when the service shut down gracefully.

        uvicorn re-raises the signal once its shutdown (our lifespan) has finished, so a
        graceful stop ends with -SIGTERM as often as with 0.
        """
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout) in (0, -signal.SIGTERM)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(
                f"service did not stop in {timeout} s: {self.log_tail()}"
            ) from None

    def log_tail(self, n: int = 4000) -> str:
        text = "".join(
            p.read_text(errors="replace")[-n:]
            for p in [
                self.data_dir / "service.log",
                *sorted((self.data_dir / "logs").glob("*.log")),
            ]
            if p.exists()
        )
        return text[-n:]


StartService = Callable[..., Service]
"""What a factory fixture of started services hands a test (tests/service/cli/conftest.py)."""


def submit(service: Service, kind: str, **body: Any) -> dict[str, Any]:
    """POST /runs/<kind> with `body`; the run as queued (202)."""
    r = httpx.post(f"{service.url}/runs/{kind}", json=body, timeout=60)
    assert r.status_code == 202, r.text
    run: dict[str, Any] = r.json()
    return run


def finished(service: Service, run_id: str, timeout: float = 900) -> dict[str, Any]:
    """The run once it has ended; past `timeout` the test fails with the service's log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run: dict[str, Any] = httpx.get(f"{service.url}/runs/{run_id}", timeout=60).json()
        if run["state"] in ("succeeded", "failed", "cancelled"):
            return run
        time.sleep(0.3)
    raise AssertionError(f"run {run_id} did not finish in {timeout} s:\n{service.log_tail()}")

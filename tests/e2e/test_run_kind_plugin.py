"""A run kind that only a plug-in defines runs through the real API and a real worker
(docs/design/kinds.md, "Run kinds"): `echo`, from tests/plugins/trainctl_echo, installed by
pip as a distribution declaring the entry-point groups, and discovered by the service and
its worker processes, with no other module edited.

The service's workers start isolated (store/processes.py: `python -I`, no PYTHONPATH), so the
plug-in must be installed where an interpreter finds it by itself: the site-packages of the
environment the service runs in (tests/e2e/plugin_env.py makes one)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.e2e.plugin_env import ECHO, install_plugin
from tests.support.polling import poll
from tests.support.service_process import Service


@pytest.fixture(scope="module")
def plugin_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of an environment where trainctl-echo is installed (by pip, offline)."""
    env, source = tmp_path_factory.mktemp("plugin-env"), tmp_path_factory.mktemp("plugin-src")
    return install_plugin(env, source, "trainctl_echo", ECHO)


@pytest.fixture
def echo_service(service: Service, plugin_python: Path) -> Service:
    service.argv = [str(plugin_python), "-m", "trainctl.service"]
    return service.start()


def finished(url: str, run_id: str) -> dict:
    def done() -> dict | None:
        run = httpx.get(f"{url}/runs/{run_id}", timeout=10).json()
        return run if run["state"] in ("succeeded", "failed", "cancelled") else None

    return poll(done, timeout=120, what=f"run {run_id} to finish")


def test_a_kind_only_a_plugin_defines_is_submitted_run_and_listed(echo_service: Service) -> None:
    url = echo_service.url
    answer = httpx.post(f"{url}/runs/echo", json={"message": "hello", "steps": 3}, timeout=30)
    assert answer.status_code == 202, answer.text
    assert answer.headers["Location"] == f"/runs/{answer.json()['id']}"

    run = finished(url, answer.json()["id"])
    assert run["state"] == "succeeded", echo_service.log_tail()
    assert run["kind"] == "echo" and run["experiment"] == "echo"
    assert run["result"] == {"said": 3, "message": "hello"}
    assert run["progress"] == {"step": 3, "total_steps": 3}
    assert run["spec"] == {"message": "hello", "steps": 3, "experiment": "echo", "hold_seconds": 0}
    logs = httpx.get(f"{url}/runs/{run['id']}/logs", params={"format": "text"}, timeout=10).text
    assert "echo 3/3: hello" in logs

    listed = httpx.get(f"{url}/runs", params={"kind": "echo"}, timeout=10).json()["items"]
    assert [r["id"] for r in listed] == [run["id"]]
    schema = httpx.get(f"{url}/openapi.json", timeout=10).json()
    assert "/runs/echo" in schema["paths"]
    assert "echo" in schema["components"]["schemas"]["RunPublic"]["properties"]["kind"]["enum"]


def test_a_plugin_kind_refuses_bad_requests_at_submit(echo_service: Service) -> None:
    url = echo_service.url
    refused = httpx.post(f"{url}/runs/echo", json={"message": "say forbidden"}, timeout=30)
    assert refused.status_code == 422
    assert "refuses to say 'forbidden'" in refused.json()["detail"]

    unknown = httpx.post(f"{url}/runs/echo", json={"message": "hi", "loud": True}, timeout=30)
    assert unknown.status_code == 422 and "loud" in unknown.text
    assert httpx.get(f"{url}/runs", params={"kind": "echo"}, timeout=10).json()["items"] == []


def test_the_cli_submits_a_kind_it_does_not_know_itself(echo_service: Service) -> None:
    """The laptop's CLI has no plug-in: `submit run KIND` hands the spec to the server."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cli = [sys.executable, "-m", "trainctl.service.cli", "--url", echo_service.url]
    submit = [*cli, "submit", "run", "echo", "--set", 'message="from the cli"', "--set", "steps=2"]
    done = subprocess.run(
        [*submit, "--watch"], capture_output=True, text=True, env=env, timeout=180
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "submitted echo run" in done.stdout
    assert "succeeded" in done.stdout

    bad = subprocess.run(
        [*cli, "submit", "run", "echo", "--set", 'message="forbidden"'],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert bad.returncode != 0
    assert "forbidden" in bad.stdout + bad.stderr

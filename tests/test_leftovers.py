"""The finalizer that keeps one failing test from holding a shared worker
(tests/support/leftovers.py) cancels exactly the runs its test tracked and left active, against the
real served app, and a failing test's tracked run is cancelled by its conftest's fixture (a pytest
of its own)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from tests.service.serving import serve
from tests.support.leftovers import RunsToStop
from trainctl.service.app import create_app
from trainctl.service.settings import Settings

LONG = {"steps": 100_000, "warmup_steps": 0}
REPO = Path(__file__).resolve().parents[1]


def test_stop_cancels_the_tracked_runs_still_active_and_nothing_else(tmp_path: Path) -> None:
    app = create_app(Settings(data_dir=tmp_path, workers=0))
    with serve(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        left, ended, other = (client.post("/runs/benchmark", json=LONG).json() for _ in "abc")
        client.post(f"/runs/{ended['id']}/cancel").raise_for_status()
        runs = RunsToStop(url)
        runs.track(left["id"])
        runs.track(ended["id"])

        assert runs.stop() == [left["id"]]

        state = {r["id"]: client.get(f"/runs/{r['id']}").json()["state"] for r in (left, other)}
        assert state == {left["id"]: "cancelled", other["id"]: "queued"}


FAILING_TEST = """
import httpx, os, pytest
from tests.support.leftovers import RunsToStop

@pytest.fixture
def stop_runs():
    runs = RunsToStop(os.environ["URL"])
    yield runs
    runs.stop()

def test_that_fails_holding_a_run(stop_runs):
    run = httpx.post(os.environ["URL"] + "/runs/benchmark", json={LONG}).json()
    stop_runs.track(run["id"])
    print("RUN", run["id"])
    assert False, "it broke"
"""


def test_a_test_that_fails_holding_a_tracked_run_leaves_it_cancelled(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(FAILING_TEST.replace("{LONG}", repr(LONG)))
    with serve(create_app(Settings(data_dir=tmp_path / "data", workers=0))) as url:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "test_inner.py"],
            cwd=tmp_path,
            env={"URL": url, "PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 1 and "it broke" in done.stdout, done.stdout + done.stderr
        run_id = done.stdout.split("RUN ", 1)[1].split()[0]
        assert httpx.get(f"{url}/runs/{run_id}", timeout=30).json()["state"] == "cancelled"

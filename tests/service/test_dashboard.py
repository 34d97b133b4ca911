"""The dashboard in a real headless browser (Debian's chromium, driven by playwright), against
the real service with a worker process and the API token on."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.polling import poll
from tests.service.serving import serve
from trainctl.service.app import create_app
from trainctl.service.client import TrainctlClient
from trainctl.service.settings import Settings

TOKEN = "dashboard-secret"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM = os.environ.get("TRAINCTL_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# Root in a container needs --no-sandbox; the rest keeps a closed network from stalling it.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

playwright = pytest.importorskip("playwright.sync_api")
pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="no chromium (make test installs it: make browser)"
)


@pytest.fixture
def base_url(tmp_path: Path) -> Iterator[str]:
    """The app with one worker process and a token, served by uvicorn on a free port."""
    settings = Settings(data_dir=tmp_path, workers=1, api_token=TOKEN, heartbeat_seconds=0.5)
    with serve(create_app(settings), stop_timeout=60) as url:
        yield url


def points(page: playwright.Page, chart: str) -> int:
    return int(page.get_attribute(f"#chart-{chart}", "data-points") or 0)


def test_the_dashboard_charts_a_running_run_live_and_lists_its_checkpoints(
    base_url: str,
) -> None:
    with TrainctlClient(base_url, token=TOKEN) as api:
        poll(lambda: api.readiness().workers_alive >= 1, timeout=120, what="a worker")
        body = {"experiment": "web", "steps": 5000, "checkpoint_every": 10, "log_every": 1}
        run = api.submit("train", body)
        with playwright.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{base_url}/#/runs/{run.id}")

            page.fill("#token-input", TOKEN)  # the first 401 asks for the token
            page.click("#token-form button")
            # Polled from here rather than with wait_for_function: that evaluates a string in
            # the page, which the dashboard's Content-Security-Policy rightly refuses.
            before = poll(lambda: (n := points(page, "loss")) > 2 and n, what="loss points")
            poll(lambda: points(page, "loss") > before, timeout=60, what="a new loss point")
            assert points(page, "tps") == points(page, "lr") >= before  # all fed by one stream
            assert page.text_content("#run-summary .state") == "running"
            # Byte-level text: a token is a byte, so each validation knows its bits per byte.
            page.wait_for_selector("#run-summary .bpb")
            assert 0 < float(page.text_content("#run-summary .bpb") or "0") < 10
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)

            page.goto(f"{base_url}/#/runs")
            page.wait_for_selector(f"tr[data-run='{run.id}'] .state.running")
            assert "web" in page.text_content("#runs")

            poll(lambda: api.list_checkpoints("web"), what="a checkpoint")
            page.goto(f"{base_url}/#/checkpoints")
            page.wait_for_selector("table[data-experiment='web'] tr[data-tag] td.files a")
            links = [a.get_attribute("href") or "" for a in page.locator("td.files a").all()]
            assert any(h.endswith("/files/model.safetensors") for h in links)
            browser.close()
        api.cancel_run(run.id)
        assert api.wait(run.id, timeout=60).state == "cancelled"

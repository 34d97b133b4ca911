"""Fixtures: the app with a worker and its token, served by uvicorn, a client of it, and a
headless chromium that opens the dashboard's pages (pages.py). Each is one per test module:
a module's runs are trained once, for all of its tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.service.dashboard.pages import CHROMIUM, CHROMIUM_ARGS, TOKEN
from tests.service.serving import serve
from tests.support.leftovers import RunsToStop
from tests.support.polling import poll
from trainctl.service.app import create_app
from trainctl.service.sdk.client import TrainctlClient
from trainctl.service.settings import Settings


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """The served app's settings: one worker process and a token."""
    return Settings(
        data_dir=tmp_path_factory.mktemp("dashboard"),
        workers=1,
        api_token=TOKEN,
        heartbeat_seconds=0.5,
    )


@pytest.fixture(scope="module")
def base_url(settings: Settings) -> Iterator[str]:
    """The app served by uvicorn on a free port; one for the module, so that its finished
    runs are trained once."""
    with serve(create_app(settings), stop_timeout=60) as url:
        yield url


@pytest.fixture(scope="module")
def api(base_url: str) -> Iterator[TrainctlClient]:
    with TrainctlClient(base_url, token=TOKEN) as client:
        poll(lambda: client.readiness().workers_alive >= 1, timeout=120, what="a worker")
        yield client


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def open_page(browser: Any, base_url: str) -> Iterator[Any]:
    """open_page(hash, width): a fresh tab on the dashboard, token given; it fails the test
    if the page threw."""
    errors: list[str] = []
    pages: list[Any] = []

    def open_(hash: str, width: int = 1280) -> Any:
        page = browser.new_page(viewport={"width": width, "height": 900})
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("dialog", lambda dialog: dialog.accept())  # "Cancel run ...?": yes
        page.goto(f"{base_url}/{hash}")
        page.fill("#token-input", TOKEN)  # the first 401 asks for the token
        page.click("#token-form button")
        pages.append(page)
        return page

    yield open_
    for page in pages:
        page.close()
    assert errors == []


@pytest.fixture
def stop_runs(base_url: str) -> Iterator[RunsToStop]:
    """stop_runs.track(run_id): a run this test starts and means to stop; cancelled after the
    test if it is still active, so that a failure leaves the module's one worker free
    (tests/support/leftovers.py)."""
    runs = RunsToStop(base_url, TOKEN)
    yield runs
    runs.stop()

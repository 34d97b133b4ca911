"""Issue 23, class 10: /docs renders its operations in a real browser (Debian's chromium,
driven by playwright) with every request off the service refused, as on an offline node, and
under the service's own Content-Security-Policy, which allows only 'self'."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.service.serving import serve
from trainctl.service.app import create_app
from trainctl.service.settings import Settings

CHROMIUM = os.environ.get("TRAINCTL_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update"]  # fmt: skip

playwright = pytest.importorskip("playwright.sync_api")
pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="no chromium (make test installs it: make browser)"
)


@pytest.fixture
def base_url(tmp_path: Path) -> Iterator[str]:
    with serve(create_app(Settings(data_dir=tmp_path, workers=0))) as url:
        yield url.replace("127.0.0.1", "localhost")


@pytest.fixture
def page(base_url: str) -> Iterator[Any]:
    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser.new_page()
        finally:
            browser.close()


def test_the_docs_page_lists_the_operations_offline_under_the_csp(page: Any, base_url: str) -> None:
    elsewhere: list[str] = []
    problems: list[str] = []

    def only_the_service(route: Any) -> None:
        if route.request.url.startswith(base_url):
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    page.route("**/*", only_the_service)
    page.on("pageerror", lambda exc: problems.append(str(exc)))
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.goto(f"{base_url}/docs")
    page.wait_for_selector(".opblock", timeout=60_000)

    summaries = page.locator(".opblock-summary-description").all_inner_texts()
    assert (
        "Stream a run's events (SSE), resumable with Last-Event-ID, until the run finishes."
        in summaries
    )
    assert len(summaries) >= 30
    assert elsewhere == []
    assert problems == []

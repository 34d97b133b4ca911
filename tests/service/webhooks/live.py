"""The app served by uvicorn with its webhook dispatcher, quick to retry, and the calls the
webhook tests make of it; runs change state through the run store, as a worker changes them."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.service.serving import serve
from tests.support.polling import poll
from trainctl.service.app import create_app
from trainctl.service.settings import Settings
from trainctl.store.db.records import Run
from trainctl.store.db.runs import RunStore

ANSWER_SECONDS = 10.0
"""How long a send waits for the test's receiver. The receiver answers at once, but it is a
thread of the test's process on a machine that may be busy: a deadline it could miss would
make a retry (the same delivery sent twice) that the test did not ask for. A test of a
receiver that does not answer sets a short one of its own."""


def fast_settings(data_dir: Path, **overrides: Any) -> Settings:
    """Retries in a tenth of a second, a dispatcher that reads often, three attempts."""
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "workers": 0,
        "webhook_poll_seconds": 0.05,
        "webhook_retry_seconds": 0.1,
        "webhook_retry_max_seconds": 0.2,
        "webhook_timeout_seconds": ANSWER_SECONDS,
        "webhook_max_attempts": 3,
    }
    return Settings(**(values | overrides))


@dataclass
class Live:
    url: str
    runs: RunStore

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=10)

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, timeout=10)

    def add_webhook(self, url: str, **body: Any) -> dict[str, Any]:
        response = self.post("/webhooks", {"url": url, **body})
        assert response.status_code == 201, response.text
        created: dict[str, Any] = response.json()
        return created

    def deliveries(self, webhook_id: int) -> list[dict[str, Any]]:
        response = self.get(f"/webhooks/{webhook_id}/deliveries")
        assert response.status_code == 200, response.text
        items: list[dict[str, Any]] = response.json()["items"]
        return items

    def settled(self, webhook_id: int, count: int = 1) -> list[dict[str, Any]]:
        """The webhook's deliveries once `count` of them are no longer pending."""
        return poll(
            lambda: (
                len(items := self.deliveries(webhook_id)) >= count
                and all(d["state"] != "pending" for d in items)
                and items
            ),
            timeout=30,
            what=f"{count} deliveries of webhook {webhook_id} to settle",
        )

    def run_to_end(
        self,
        state: str = "succeeded",
        metrics: Sequence[dict[str, Any]] = (),
        logs: Sequence[dict[str, Any]] = (),
    ) -> Run:
        """A run claimed and finished as a worker would: running, its `metrics` events, its
        `logs` lines, then `state`."""
        run = self.runs.enqueue("benchmark", "hooks", {"steps": 1})
        claimed = self.runs.claim("test-worker", lease_seconds=60)
        assert claimed is not None and claimed.id == run.id
        for data in metrics:
            self.runs.append_event(run.id, "metrics", data, worker_id="test-worker", attempt=1)
        for data in logs:
            self.runs.append_event(run.id, "log", data, worker_id="test-worker", attempt=1)
        result = {"tokens_per_sec": 1.0} if state == "succeeded" else None
        error = None if state == "succeeded" else "it broke"
        return self.runs.finish(run.id, "test-worker", 1, state, result=result, error=error)


@contextmanager
def live(settings: Settings) -> Iterator[Live]:
    with serve(create_app(settings)) as url, RunStore(settings.db_url) as runs:
        yield Live(url, runs)

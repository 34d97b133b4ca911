"""No run outlives the test that started it, on a service that several tests share.

A module's tests share one service and its one worker (the dashboard's, the CLI's): a test
that failed before it cancelled its long run left that run holding the worker, so every later
test waited on it to its full timeout and one failure became many. A test that starts a run
meant to be stopped tracks it with the `stop_runs` fixture of its conftest (built on
`RunsToStop`); the fixture's finalizer cancels what is still active, pass or fail, and waits
until it has ended.
"""

from __future__ import annotations

import httpx

from tests.support.polling import poll
from trainctl.store.vocabulary import ACTIVE_STATES


class RunsToStop:
    """Runs of the service at `url` to cancel when the test is done."""

    def __init__(self, url: str, token: str | None = None) -> None:
        self.url = url
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.ids: list[str] = []

    def track(self, run_id: str) -> str:
        self.ids.append(run_id)
        return run_id

    def stop(self, timeout: float = 120) -> list[str]:
        """Cancel the tracked runs still queued or running and wait until each has ended:
        the ids it cancelled."""
        with httpx.Client(base_url=self.url, headers=self.headers, timeout=30) as client:

            def active() -> list[str]:
                states = {i: client.get(f"/runs/{i}").json()["state"] for i in self.ids}
                return [i for i, state in states.items() if state in ACTIVE_STATES]

            left = active()
            for run_id in left:
                client.post(f"/runs/{run_id}/cancel").raise_for_status()
            poll(lambda: not active(), timeout=timeout, what=f"the runs {left} to end")
        return left

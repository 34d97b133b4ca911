"""Waiting on a run of the real service, and reading its result, as the end-to-end tests do."""

from __future__ import annotations

from typing import Any

from tests.support.polling import poll
from trainctl.service.schemas import RunPublic
from trainctl.service.sdk.client import TrainctlClient
from trainctl.store.vocabulary import TERMINAL_STATES


def wait_done(client: TrainctlClient, run_id: str, timeout: float = 600) -> RunPublic:
    return poll(
        lambda: (r := client.get_run(run_id)).state in TERMINAL_STATES and r,
        timeout=timeout,
        what=f"run {run_id} to finish",
    )


def wait_step(client: TrainctlClient, run_id: str, step: int) -> RunPublic:
    return poll(
        lambda: ((r := client.get_run(run_id)).progress.step or 0) >= step and r,
        timeout=600,
        what=f"run {run_id} to reach step {step}",
    )


def result_of(run: RunPublic) -> dict[str, Any]:
    assert run.result is not None, f"run {run.id} is {run.state}: {run.error}"
    return run.result

"""The run page of a run mirrored to Weights & Biases links to its W&B run, in chromium: a
service of its own with TRAINCTL_WANDB_PROJECT and an entity, and no worker (a queued run
sends nothing, so nothing reaches for W&B's server)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.service.dashboard.pages import TOKEN, needs_chromium
from tests.service.serving import serve
from trainctl.service.app import create_app
from trainctl.service.sdk.client import TrainctlClient
from trainctl.service.settings import Settings
from trainctl.service.sinks.wandb import wandb_id

pytestmark = [needs_chromium, pytest.mark.slow]


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("dashboard-wandb"),
        workers=0,
        api_token=TOKEN,
        wandb_project="pretraining",
        wandb_entity="lab",
    )
    with serve(create_app(settings)) as url:
        yield url


def test_the_run_page_links_to_the_wandb_run_of_a_run_mirrored_there(
    base_url: str, open_page: Any
) -> None:
    with TrainctlClient(base_url, token=TOKEN) as api:
        spec = {"steps": 4, "device": "cpu", "data": {"source": "synthetic"}}
        mirrored = api.submit("train", {**spec, "experiment": "wb", "trackers": ["wandb"]})
        plain = api.submit("train", {**spec, "experiment": "tb", "trackers": ["tensorboard"]})

    page = open_page(f"#/runs/{mirrored.id}")
    page.wait_for_selector("#run-wandb a")
    url = f"https://wandb.ai/lab/pretraining/runs/{wandb_id(mirrored.id)}"
    assert page.get_attribute("#run-wandb a", "href") == url == mirrored.wandb_url

    other = open_page(f"#/runs/{plain.id}")
    other.wait_for_selector("#run-priority")
    assert other.locator("#run-wandb").count() == 0

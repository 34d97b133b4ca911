"""`trainctl models` and the SDK's `models()` over real HTTP, against the app served by uvicorn
in a thread (tests/service/serving.py): the cheapest real server, with no worker to start."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.service.cli.invoke import trainctl
from tests.service.serving import serve
from trainctl.service.app import create_app
from trainctl.service.sdk.client import TrainctlClient
from trainctl.service.settings import Settings
from trainctl.store.models.presets import PRESETS


@dataclass(frozen=True)
class At:
    url: str


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[At]:
    settings = Settings(data_dir=tmp_path_factory.mktemp("models"), workers=0)
    with serve(create_app(settings)) as url:
        yield At(url)


def test_models_lists_every_preset_and_the_transformers_types_in_a_table(served: At) -> None:
    code, out, err = trainctl(served, "models")

    assert code == 0 and err == ""
    rows = {line.split()[0]: line for line in out.splitlines()[1:] if line.strip()}
    for name in PRESETS.names():
        assert "preset" in rows[name] and "parameters" in rows[name]
    # The transformers types are one row's details, which rich wraps over many lines.
    transformers = out[out.index(rows["hf"]) :]
    assert "transformers" in rows["hf"] and re.search(r"\bllama\b", transformers)


def test_models_json_is_what_the_sdk_returns(served: At) -> None:
    code, out, _ = trainctl(served, "models", "--json")
    with TrainctlClient(served.url, timeout=10) as api:
        models = api.models()

    assert code == 0
    listed = json.loads(out)
    assert listed == models.model_dump(mode="json")
    assert {p["name"] for p in listed["presets"]} == set(PRESETS.names())
    assert {"llama", "qwen3"} <= set(listed["hf_model_types"])
    assert listed["plugins"] == []  # no live worker, so no plug-in


def test_models_says_when_the_service_cannot_be_reached() -> None:
    code, out, err = trainctl(None, "models")

    assert code == 3 and out == ""
    assert err.startswith("error: cannot reach trainctl at http://127.0.0.1:9/")
    assert err.count("\n") == 1  # one line, no traceback

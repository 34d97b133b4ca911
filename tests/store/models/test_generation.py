from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from trainctl.store.exceptions import InvalidRequest
from trainctl.store.models.generation import (
    MAX_STOP_LENGTH,
    MAX_STOP_STRINGS,
    GenerationSettings,
    check_context,
)


def refusal(**fields: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        GenerationSettings(**fields)
    return str(caught.value)


def test_defaults_sample_with_a_seed() -> None:
    s = GenerationSettings()
    assert (s.max_new_tokens, s.temperature, s.top_k, s.top_p, s.stop, s.seed) == (
        128,
        0.8,
        200,
        1.0,
        [],
        0,
    )


def test_a_negative_temperature_is_refused_saying_what_zero_means() -> None:
    assert "temperature must be >= 0 (0 decodes greedily" in refusal(temperature=-0.1)
    assert "temperature" in refusal(temperature=float("nan"))
    assert GenerationSettings(temperature=0).temperature == 0


def test_top_p_must_lie_in_zero_exclusive_to_one() -> None:
    assert "greater than 0" in refusal(top_p=0.0)
    assert "less than or equal to 1" in refusal(top_p=1.5)
    assert GenerationSettings(top_p=1).top_p == 1.0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_new_tokens": 0}, "greater than or equal to 1"),
        ({"top_k": 0}, "greater than or equal to 1"),
        ({"stop": [""]}, "each stop string must be 1 to 256 characters, got one of 0"),
        ({"stop": ["x" * (MAX_STOP_LENGTH + 1)]}, "got one of 257"),
        ({"stop": ["x"] * (MAX_STOP_STRINGS + 1)}, "at most 16 items"),
        ({"seed": -1}, "greater than or equal to 0"),
        ({"seed": True}, "valid integer"),
        ({"temperature": "0.5"}, "valid number"),
        ({"prompt": "hi"}, "Extra inputs are not permitted"),
    ],
)
def test_out_of_bounds_settings_are_refused_by_name(fields: dict[str, Any], message: str) -> None:
    text = refusal(**fields)
    assert next(iter(fields)) in text
    assert message in text


def test_top_k_may_be_left_unlimited() -> None:
    assert GenerationSettings(top_k=None).top_k is None


def test_the_schema_publishes_the_bounds() -> None:
    props = GenerationSettings.model_json_schema()["properties"]
    assert props["temperature"]["minimum"] == 0
    assert props["top_p"]["exclusiveMinimum"] == 0 and props["top_p"]["maximum"] == 1
    assert all(p.get("description") for p in props.values())


def test_a_prompt_and_its_new_tokens_must_fit_the_context() -> None:
    check_context(100, 412, 512)
    with pytest.raises(InvalidRequest, match=r"100 tokens \+ max_new_tokens 413 = 513 exceeds"):
        check_context(100, 413, 512)
    with pytest.raises(InvalidRequest, match="lower max_new_tokens to at most 412"):
        check_context(100, 413, 512)


def test_a_prompt_that_fills_the_context_is_refused_naming_the_limit() -> None:
    with pytest.raises(InvalidRequest, match=r"prompt of 600 tokens .* \(max_seq_len 512\)"):
        check_context(600, 1, 512)
    with pytest.raises(InvalidRequest, match="max_seq_len 512"):
        check_context(512, 1, 512)

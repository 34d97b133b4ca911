"""Settings from the environment: empty variables, and the token's whitespace."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from trainctl.service.settings import Settings

PREFIX = "TRAINCTL_"


def env_name(field: str) -> str:
    return PREFIX + field.upper()


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No TRAINCTL_* variable of the machine running the tests leaks into these."""
    for name in Settings.model_fields:
        monkeypatch.delenv(env_name(name), raising=False)


def test_every_setting_has_an_environment_variable_named_by_the_prefix() -> None:
    # The test below derives the variables from the fields; an alias would escape it.
    assert Settings.model_config["env_prefix"] == PREFIX
    assert all(
        f.alias is None and f.validation_alias is None for f in Settings.model_fields.values()
    )


def test_empty_variables_leave_every_setting_at_its_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What `TRAINCTL_WORKERS: ${TRAINCTL_WORKERS:-}` in a compose file hands the container.
    for name in Settings.model_fields:
        monkeypatch.setenv(env_name(name), "")

    settings = Settings()

    for name, field in Settings.model_fields.items():
        assert getattr(settings, name) == field.get_default(call_default_factory=True), name


def test_a_set_variable_still_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINCTL_WORKERS", "3")
    monkeypatch.setenv("TRAINCTL_DATABASE_URL", "")

    settings = Settings()

    assert settings.workers == 3 and settings.database_url is None


@pytest.mark.parametrize("blank", ["", " ", "\t", " \n "])
def test_a_blank_token_is_no_token(monkeypatch: pytest.MonkeyPatch, blank: str) -> None:
    monkeypatch.setenv("TRAINCTL_API_TOKEN", blank)

    assert Settings().api_token is None
    assert Settings(api_token=SecretStr(blank)).api_token is None


def test_whitespace_around_a_token_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    # A token read from a file often ends in a newline; no HTTP client can send one.
    monkeypatch.setenv("TRAINCTL_API_TOKEN", " s3cret token\n")

    token = Settings().api_token

    assert token is not None and token.get_secret_value() == "s3cret token"


@pytest.mark.parametrize(
    ("host", "allowed", "expected"),
    [
        ("127.0.0.1", "", ["localhost", "127.0.0.1", "::1"]),
        ("0.0.0.0", "", ["*"]),  # a public service needs a token; the token guards it
        ("0.0.0.0", "gpu-node.lab, gpu-node", ["gpu-node.lab", "gpu-node"]),
        ("127.0.0.1", "*", ["*"]),
    ],
)
def test_the_host_allow_list_defaults_to_the_loopback_names_on_loopback(
    monkeypatch: pytest.MonkeyPatch, host: str, allowed: str, expected: list[str]
) -> None:
    monkeypatch.setenv("TRAINCTL_HOST", host)
    monkeypatch.setenv("TRAINCTL_ALLOWED_HOSTS", allowed)

    assert Settings().host_allow_list == expected

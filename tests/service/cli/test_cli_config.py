"""Where `trainctl` gets its URL and token: flag > env var > profile of the config file > default,
against a real service that requires a token."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.service.cli import invoke
from tests.support.service_process import Service, StartService

TOKEN = "config-test-token"


@pytest.fixture(scope="module")
def service(start_service: StartService) -> Service:
    """The service with no workers, and a token it requires."""
    return start_service(TRAINCTL_API_TOKEN=TOKEN)


@pytest.fixture
def config_home(tmp_path: Path) -> Path:
    return tmp_path / "xdg"


def write_config(config_home: Path, text: str, mode: int = 0o600) -> Path:
    path = config_home / "trainctl" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def trainctl(config_home: Path, *args: str, **env: str | None) -> tuple[int, str, str]:
    """The CLI with only what `env` sets: no URL, token or profile from the test's own env."""
    return invoke.trainctl(
        None, *args, env={"TRAINCTL_URL": None, "XDG_CONFIG_HOME": str(config_home), **env}
    )


@pytest.mark.slow
def test_a_refused_token_exits_3_and_says_where_the_token_came_from(
    service: Service, config_home: Path
) -> None:
    url = service.url
    code, _, err = trainctl(config_home, "runs", "list", TRAINCTL_URL=url)
    assert code == 3 and err.startswith("error: missing or wrong API token")
    assert err.endswith("(HTTP 401; no token was sent)\n")

    code, _, err = trainctl(config_home, "runs", "list", TRAINCTL_URL=url, TRAINCTL_API_TOKEN="x")
    assert code == 3 and err.endswith("(HTTP 401; the token came from TRAINCTL_API_TOKEN)\n")

    code, _, err = trainctl(config_home, "--token", "x", "runs", "list", TRAINCTL_URL=url)
    assert code == 3 and err.endswith("(HTTP 401; the token came from --token)\n")


@pytest.mark.slow
def test_the_default_profile_gives_the_url_and_token(service: Service, config_home: Path) -> None:
    write_config(config_home, f'[profiles.default]\nurl = "{service.url}"\ntoken = "{TOKEN}"\n')

    code, out, err = trainctl(config_home, "runs", "list", "--json")

    assert code == 0 and out == "[]\n", err


@pytest.mark.slow
def test_a_named_profile_is_chosen_by_flag_or_env_var(service: Service, config_home: Path) -> None:
    write_config(
        config_home,
        f'[profiles.default]\nurl = "http://127.0.0.1:9"\n\n'
        f'[profiles.lab]\nurl = "{service.url}"\ntoken = "{TOKEN}"\n',
    )

    assert trainctl(config_home, "runs", "list")[0] == 3  # default: nothing listens there
    assert trainctl(config_home, "--profile", "lab", "runs", "list")[0] == 0
    assert trainctl(config_home, "runs", "list", TRAINCTL_PROFILE="lab")[0] == 0
    code, _, err = trainctl(config_home, "--profile", "nope", "runs", "list")
    assert code == 2 and "no profile 'nope' in " in err and "profiles there: default, lab" in err


@pytest.mark.slow
def test_a_flag_beats_the_env_var_which_beats_the_profile(
    service: Service, config_home: Path
) -> None:
    path = write_config(config_home, f'[profiles.default]\ntoken = "{TOKEN}"\n')
    url = service.url

    assert trainctl(config_home, "runs", "list", TRAINCTL_URL=url)[0] == 0  # the profile's
    code, _, err = trainctl(
        config_home, "runs", "list", TRAINCTL_URL=url, TRAINCTL_API_TOKEN="wrong"
    )
    assert code == 3 and "the token came from TRAINCTL_API_TOKEN" in err
    code, _, err = trainctl(
        config_home, "--token", TOKEN, "runs", "list", TRAINCTL_URL=url, TRAINCTL_API_TOKEN="no"
    )
    assert code == 0, err
    code, _, err = trainctl(
        config_home, "--url", url, "runs", "list", TRAINCTL_URL="http://127.0.0.1:9"
    )
    assert code == 0, err
    path.write_text('[profiles.default]\ntoken = "wrong"\n')
    code, _, err = trainctl(config_home, "runs", "list", TRAINCTL_URL=url)
    assert code == 3 and f"the token came from profile 'default' in {path}" in err


@pytest.mark.slow
def test_without_xdg_config_home_the_file_is_under_home_dot_config(
    service: Service, tmp_path: Path
) -> None:
    write_config(
        tmp_path / ".config", f'[profiles.default]\nurl = "{service.url}"\ntoken = "{TOKEN}"\n'
    )
    code, _, err = trainctl(tmp_path, "runs", "list", XDG_CONFIG_HOME=None, HOME=str(tmp_path))
    assert code == 0, err


@pytest.mark.slow
def test_a_config_file_with_a_token_that_others_can_read_is_refused(
    service: Service, config_home: Path
) -> None:
    text = f'[profiles.default]\nurl = "{service.url}"\ntoken = "{TOKEN}"\n'
    path = write_config(config_home, text, mode=0o644)

    code, out, err = trainctl(config_home, "runs", "list")

    assert code == 2 and out == ""
    assert err == (
        f"error: {path} holds a token and other users can read it (mode 644); "
        f"make it private with: chmod 600 {path}\n"
    )
    write_config(config_home, f'[profiles.default]\nurl = "{service.url}"\n', mode=0o644)
    code, _, err = trainctl(config_home, "runs", "list", TRAINCTL_API_TOKEN=TOKEN)
    assert code == 0, err  # no token in it: nothing to hide


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[profiles.default\n", "is not valid TOML: "),
        ('url = "http://x"\n', "unknown key 'url'; write profiles as [profiles.NAME]"),
        ('[profiles.default]\ntokn = "x"\n', "unknown key 'tokn' in [profiles.default]"),
        ("[profiles.default]\nurl = 8000\n", "profiles.default.url must be a string"),
    ],
)
def test_a_malformed_config_file_is_one_error_naming_the_file_and_the_problem(
    config_home: Path, text: str, problem: str
) -> None:
    path = write_config(config_home, text)

    code, _, err = trainctl(config_home, "runs", "list")

    assert code == 2 and err.startswith(f"error: {path}") and problem in err
    assert err.count("\n") == 1


def test_commands_that_do_not_call_the_service_never_read_the_config(config_home: Path) -> None:
    write_config(config_home, "not toml at all")

    code, out, _ = trainctl(config_home, "--version")

    assert code == 0 and out.startswith("trainctl ")


@pytest.mark.slow
def test_an_admin_makes_a_token_with_the_cli_and_its_holder_can_read_but_not_delete(
    service: Service, config_home: Path
) -> None:
    admin = {"TRAINCTL_URL": service.url, "TRAINCTL_API_TOKEN": TOKEN}
    create = ("tokens", "create", "viewer", "--scope", "read")
    code, token, err = trainctl(config_home, *create, **admin)
    assert code == 0 and "it is not shown again" in err
    token = token.strip()

    code, out, _ = trainctl(config_home, "tokens", "list", **admin)
    assert code == 0 and "viewer" in out and "read" in out and token not in out
    viewer = {"TRAINCTL_URL": service.url, "TRAINCTL_API_TOKEN": token}
    assert trainctl(config_home, "runs", "list", "--json", **viewer)[0] == 0
    code, _, err = trainctl(config_home, "tokens", "list", **viewer)
    assert code == 3 and "has scope 'read'; this needs 'admin'" in err

    assert trainctl(config_home, "tokens", "revoke", "viewer", **admin)[0] == 0
    assert trainctl(config_home, "runs", "list", **viewer)[0] == 3

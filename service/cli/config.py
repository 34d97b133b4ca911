"""Where `trainctl` finds its service and token: a flag, then the environment, then a profile.

Each of the URL and the token is taken from the first of: its flag (`--url`, `--token`), its
environment variable (TRAINCTL_URL, TRAINCTL_API_TOKEN), the chosen profile of the config
file, the default (http://127.0.0.1:8000; no token). The config file is
`$XDG_CONFIG_HOME/trainctl/config.toml` (`~/.config/trainctl/config.toml` by default):

    [profiles.default]               # used when no profile is named
    url = "http://127.0.0.1:8000"
    token = "..."

    [profiles.cluster]               # --profile cluster, or TRAINCTL_PROFILE=cluster
    url = "https://trainctl.internal:8443"
    token = "..."

A token belongs in the environment or in that file, not on the command line: every user of
the machine can read a process's arguments (`ps`), and the shell keeps them in its history.
So a config file that holds a token must be readable by its owner alone (`chmod 600`).
"""

from __future__ import annotations

import os
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from trainctl.service.cli.errors import BadInput

DEFAULT_PROFILE = "default"
PROFILE_KEYS = ("url", "token")


@dataclass(frozen=True)
class Connection:
    """The service to talk to, the token to send, and where that token came from."""

    url: str | None
    token: str | None
    token_source: str | None = None


def config_path() -> Path:
    # The XDG base directory spec ignores a relative XDG_CONFIG_HOME.
    base = os.environ.get("XDG_CONFIG_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".config"
    return root / "trainctl" / "config.toml"


def resolve_connection(ctx: typer.Context) -> Connection:
    """The URL and token for this invocation, each from its flag, env var or profile."""
    options = ctx.find_root().obj or {}
    url, token, profile = options.get("url"), options.get("token"), options.get("profile")
    source = None
    if token is not None:
        source = "--token" if given_as_flag(ctx, "token") else "TRAINCTL_API_TOKEN"
    if profile is None and url is not None and token is not None:
        return Connection(url, token, source)  # nothing left for a profile to give
    path = config_path()
    chosen = read_profile(path, profile)
    if url is None:
        url = chosen.get("url")
    if token is None and "token" in chosen:
        token, source = chosen["token"], f"profile {profile or DEFAULT_PROFILE!r} in {path}"
    return Connection(url, token, source)


def given_as_flag(ctx: typer.Context, name: str) -> bool:
    source = ctx.find_root().get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def read_profile(path: Path, name: str | None) -> dict[str, str]:
    """The named profile (an error if it is missing), else `default` if there is one."""
    profiles = read_profiles(path)
    if name is None:
        return profiles.get(DEFAULT_PROFILE, {})
    if name not in profiles:
        have = ", ".join(sorted(profiles)) or "none"
        where = path if path.exists() else f"{path} (no such file)"
        raise BadInput(f"no profile {name!r} in {where}; profiles there: {have}")
    return profiles[name]


def read_profiles(path: Path) -> dict[str, dict[str, str]]:
    """Every `[profiles.NAME]` table of the config file; none when there is no file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"cannot read {path}: {exc}") from exc
    try:
        config = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"{path} is not valid TOML: {exc}") from exc
    unknown = sorted(set(config) - {"profiles"})
    if unknown:
        raise BadInput(f"{path}: unknown key {unknown[0]!r}; write profiles as [profiles.NAME]")
    profiles = {
        name: check_profile(path, name, p) for name, p in config.get("profiles", {}).items()
    }
    if any("token" in p for p in profiles.values()):
        refuse_if_others_can_read(path)
    return profiles


def check_profile(path: Path, name: str, profile: Any) -> dict[str, str]:
    if not isinstance(profile, dict):
        raise BadInput(f"{path}: profiles.{name} must be a table ([profiles.{name}])")
    for key, value in profile.items():
        if key not in PROFILE_KEYS:
            raise BadInput(
                f"{path}: unknown key {key!r} in [profiles.{name}]; "
                f"a profile has {' and '.join(PROFILE_KEYS)}"
            )
        if not isinstance(value, str):
            raise BadInput(f"{path}: profiles.{name}.{key} must be a string")
    return dict(profile)


def refuse_if_others_can_read(path: Path) -> None:
    """A token others can read is a token others have: refuse it, as ssh refuses such keys."""
    if os.name != "posix":
        return
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        raise BadInput(
            f"{path} holds a token and other users can read it (mode {mode:o}); "
            f"make it private with: chmod 600 {path}"
        )

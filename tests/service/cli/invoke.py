"""`trainctl` run in-process for the CLI's tests, with nothing of the user's who runs them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from typer.testing import CliRunner

from tests.support.service_process import REPO
from trainctl.service.cli import app

NO_CONFIG = REPO / "tests" / "no-such-config-home"
"""An XDG_CONFIG_HOME with no trainctl/config.toml in it: no profile of the user's applies."""


class Served(Protocol):
    """A service the CLI can be pointed at: the real process, or the app served in a thread."""

    @property
    def url(self) -> str: ...


def trainctl(service: Served | None, *args: str | Path, **kwargs: Any) -> tuple[int, str, str]:
    """Run the CLI in-process: exit code, stdout, stderr. Only the service's URL comes from
    the environment (a port nothing listens on without one): no token, no profile, no config
    file, no TRAINCTL_DEBUG tracebacks of the user running the tests; `env=` adds or unsets
    variables on top, and the other keywords go to click's `invoke` (`input=`).

    The output is decoded as it is: click's `Result.stdout` would turn a completion's \\r\\n
    into \\n, and the text printed must be the text generated.
    """
    env = {
        "TRAINCTL_URL": service.url if service else "http://127.0.0.1:9",
        "TRAINCTL_API_TOKEN": None,
        "TRAINCTL_PROFILE": None,
        "TRAINCTL_DEBUG": None,
        "XDG_CONFIG_HOME": str(NO_CONFIG),
        **kwargs.pop("env", {}),
    }
    result = CliRunner().invoke(app, [str(a) for a in args], env=env, **kwargs)
    charset = result.runner.charset
    return (
        result.exit_code,
        result.stdout_bytes.decode(charset, "replace"),
        result.stderr_bytes.decode(charset, "replace"),
    )

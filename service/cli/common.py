"""What every `trainctl` command shares: the API client, output, and one-line errors.

Data goes to stdout and everything for the human at the terminal (progress bars, a run's
live events, hints, prompts, errors) to stderr, so `trainctl ... --json | jq` reads JSON only.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

import httpx
import typer
from pydantic import BaseModel
from rich.console import Console
from typer.core import TyperGroup

from trainctl.service.cli.config import Connection, resolve_connection
from trainctl.service.cli.errors import (
    AUTH_REFUSED,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NO_SERVICE,
    EXIT_USAGE,
    INVALID_REQUEST,
    BadInput,
    MissingExtra,
)
from trainctl.service.sdk.client import ApiError, TrainctlClient
from trainctl.store.exceptions import TrainctlError

# Click's ClickException, whether typer uses click itself (older typer) or a vendored copy.
USAGE_ERROR: Any = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
# Piped output keeps full-width tables (ids are 32 characters) instead of rich's 80 columns.
console = Console(width=None if sys.stdout.isatty() else 160, highlight=False)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 160, highlight=False)


class CliGroup(TyperGroup):
    """The top-level group: every failure becomes one `error: ...` line and its exit code
    (`cli.errors`).

    Overriding `main` (not `Typer.__call__`) catches usage errors too, and also applies when
    tests drive the command through typer's CliRunner. TRAINCTL_DEBUG=1 shows tracebacks.
    """

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            code = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        except (typer.Abort, KeyboardInterrupt):
            fail("interrupted", EXIT_INTERRUPTED)
        except USAGE_ERROR as exc:  # unknown command, bad option value
            if type(exc).__name__ == "NoArgsIsHelpError":  # `trainctl runs`: the help, whole
                exc.show()
                sys.exit(EXIT_USAGE)
            fail(exc.format_message(), EXIT_USAGE)
        except Exception as exc:
            if os.environ.get("TRAINCTL_DEBUG"):
                raise
            fail(describe(exc), exit_code(exc))
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: Any) -> Any:  # click's Context: typer's own copy, or click's
        try:
            return super().invoke(ctx)
        except ApiError as exc:
            connection = (ctx.obj or {}).get("connection")
            if exc.status_code in AUTH_REFUSED and isinstance(connection, Connection):
                # Which of flag, env var and profile supplied the token is what to fix.
                source = connection.token_source
                exc.add_note(f"the token came from {source}" if source else "no token was sent")
            raise


def exit_code(exc: Exception) -> int:
    if isinstance(exc, ApiError):
        if exc.status_code in AUTH_REFUSED:
            return EXIT_NO_SERVICE
        return EXIT_USAGE if exc.status_code in INVALID_REQUEST else EXIT_FAILED
    if isinstance(exc, httpx.TransportError):
        return EXIT_NO_SERVICE
    return EXIT_USAGE if isinstance(exc, BadInput) else EXIT_FAILED


def describe(exc: Exception) -> str:
    """One line a user can act on."""
    if isinstance(exc, ApiError):
        notes = "".join(f"; {note}" for note in getattr(exc, "__notes__", []))
        return f"{exc.detail} (HTTP {exc.status_code}{notes})"
    if isinstance(exc, httpx.TransportError):
        try:
            where = str(exc.request.url.copy_with(path="/", query=None))
        except RuntimeError:  # no request attached
            where = "the service"
        return f"cannot reach trainctl at {where} ({exc}); is it running? Set TRAINCTL_URL"
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.strerror}: {exc.filename}"
    if isinstance(exc, TrainctlError | BadInput | ValueError | OSError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    sys.exit(code)


def client(ctx: typer.Context) -> TrainctlClient:
    """A client for the service and token of this invocation (`cli.config`)."""
    connection = resolve_connection(ctx)
    root = ctx.find_root()
    root.obj = {**(root.obj or {}), "connection": connection}
    return TrainctlClient(connection.url, connection.token, timeout=60.0)


@contextmanager
def needs_extra(extra: str, command: str) -> Iterator[None]:
    """Around the imports of a command that needs an extra: a missing one is an error line
    saying what to install, not a traceback."""
    try:
        yield
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing in ("", "trainctl"):
            raise
        raise MissingExtra(
            f"trainctl {command} needs {missing}, which is not installed: "
            f'pip install "trainctl[{extra}]"'
        ) from exc


def checkpoint_choice(experiment: str, tag: str) -> dict[str, str]:
    """A request's `checkpoint` (and `experiment`) for EXP TAG as the commands take them:
    `latest` is the experiment's highest step, any other tag is that checkpoint."""
    if tag == "latest":
        return {"checkpoint": "latest", "experiment": experiment}
    return {"checkpoint": f"{experiment}/{tag}"}


def confirm(question: str) -> bool:
    """Ask on stderr and read a line from stdin: only y or yes agrees; end of input is no."""
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def print_json(
    value: BaseModel | Sequence[BaseModel] | dict[str, Any], *, one_line: bool = False
) -> None:
    """JSON on stdout: indented, or one document per line (a stream: --watch --json)."""
    if isinstance(value, Sequence):
        data: Any = [v.model_dump(mode="json") for v in value]
    elif isinstance(value, BaseModel):
        data = value.model_dump(mode="json")
    else:
        data = value
    print(json.dumps(data, indent=None if one_line else 2), flush=True)


def build_spec(
    base: dict[str, Any], flags: dict[str, Any], sets: list[str] | None
) -> dict[str, Any]:
    """A spec dict: the --spec file, then the flags given, then each --set key.path=value."""
    spec = json.loads(json.dumps(base))
    for path, value in flags.items():
        if value is not None and value != []:
            set_path(spec, path, value)
    for item in sets or []:
        path, sep, raw = item.partition("=")
        if not sep or not path:
            raise typer.BadParameter(f"--set takes key.path=value, got {item!r}")
        set_path(spec, path.strip(), parse_value(raw))
    return spec


def parse_value(raw: str) -> Any:
    """JSON when it parses (numbers, true, lists, objects), else the text itself."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def set_path(spec: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    node = spec
    for key in parents:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise typer.BadParameter(f"cannot set {path}: {key} is not an object")
        node = child
    node[leaf] = value

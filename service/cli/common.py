"""What every `trainctl` command shares: the API client, output, and one-line errors."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import httpx
import typer
from pydantic import BaseModel
from rich.console import Console
from typer.core import TyperGroup

from trainctl.service.client import ApiError, TrainctlClient
from trainctl.store.exceptions import TrainctlError

# Click's ClickException, whether typer uses click itself (older typer) or a vendored copy.
USAGE_ERROR: Any = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
# Piped output keeps full-width tables (ids are 32 characters) instead of rich's 80 columns.
console = Console(width=None if sys.stdout.isatty() else 160, highlight=False)


class CliGroup(TyperGroup):
    """The top-level group: every failure becomes one `error: ...` line and a non-zero exit.

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
            fail("interrupted", 130)
        except USAGE_ERROR as exc:  # unknown command, bad option value
            fail(exc.format_message(), exc.exit_code)
        except Exception as exc:
            if os.environ.get("TRAINCTL_DEBUG"):
                raise
            fail(describe(exc))
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)


def describe(exc: Exception) -> str:
    """One line a user can act on."""
    if isinstance(exc, ApiError):
        return f"{exc.detail} (HTTP {exc.status_code})"
    if isinstance(exc, httpx.TransportError):
        try:
            where = str(exc.request.url.copy_with(path="/", query=None))
        except RuntimeError:  # no request attached
            where = "the service"
        return f"cannot reach trainctl at {where} ({exc}); is it running? Set TRAINCTL_URL"
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.strerror}: {exc.filename}"
    if isinstance(exc, TrainctlError | ValueError | OSError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def fail(message: str, code: int = 1) -> NoReturn:
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    sys.exit(code)


def client(ctx: typer.Context) -> TrainctlClient:
    """A client for the URL and token given on the command line or in the environment."""
    options = ctx.find_root().obj or {}
    return TrainctlClient(options.get("url"), options.get("token"), timeout=60.0)


def print_json(value: BaseModel | Sequence[BaseModel] | dict[str, Any]) -> None:
    if isinstance(value, Sequence):
        data: Any = [v.model_dump(mode="json") for v in value]
    elif isinstance(value, BaseModel):
        data = value.model_dump(mode="json")
    else:
        data = value
    print(json.dumps(data, indent=2))


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

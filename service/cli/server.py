"""`trainctl serve` and `trainctl worker`: the processes, started from the CLI."""

from __future__ import annotations

import importlib.util
import os
from typing import Annotated

import typer

from trainctl.service.cli.common import needs_extra
from trainctl.service.cli.errors import MissingExtra
from trainctl.store.processes import isolated_env, python_command

CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}


def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (TRAINCTL_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (TRAINCTL_PORT).")] = None,
    insecure: Annotated[
        bool, typer.Option(help="Allow a non-loopback host without TRAINCTL_API_TOKEN.")
    ] = False,
) -> None:
    """Serve the API and supervise local workers (same as `python -m trainctl.service`)."""
    with needs_extra("server", "serve"):  # uvicorn and the app load only for this command
        from trainctl.service.__main__ import main

    argv = [*(["--host", host] if host else []), *(["--port", str(port)] if port else [])]
    raise typer.Exit(main([*argv, *(["--insecure"] if insecure else [])]))


def worker(ctx: typer.Context) -> None:
    """Run a worker process (`python -m trainctl.worker ARGS`; try `trainctl worker --help`)."""
    # exec, not import: the service side never imports torch or the worker package.
    if importlib.util.find_spec("torch") is None:
        raise MissingExtra(
            'trainctl worker needs torch, which is not installed: pip install "trainctl[worker]"'
        )
    # Isolated (store/processes.py): nothing from the working folder or PYTHONPATH.
    command = python_command("trainctl.worker", *ctx.args)
    os.execve(command[0], command, isolated_env(os.environ))


def register(app: typer.Typer) -> None:
    app.command()(serve)
    app.command(context_settings=CONTEXT, add_help_option=False)(worker)

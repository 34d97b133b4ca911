"""`trainctl workers`: the worker processes the service knows, alive or gone."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from trainctl.service.cli.common import client, console, err_console, print_json
from trainctl.service.schemas import WorkerPublic


def table(items: list[WorkerPublic]) -> Table:
    t = Table("ID", "HOST", "PID", "DEVICE", "STATE", "RUN", "LAST SEEN", box=None)
    for w in items:
        t.add_row(w.id, w.host, str(w.pid), w.device, "alive" if w.alive else "gone",
                  w.current_run_id or "", w.last_seen_at.strftime("%Y-%m-%d %H:%M:%S"))  # fmt: skip
    return t


def list_workers(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List workers: host, device, the run each is on, whether it is alive."""
    with client(ctx) as api:
        items = api.workers()
    if as_json:
        print_json(items)
    elif items:
        console.print(table(items))
    else:
        err_console.print("no workers")


def register(app: typer.Typer) -> None:
    app.command("workers")(list_workers)

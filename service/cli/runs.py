"""`trainctl runs list|show|cancel|watch`."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from trainctl.service.cli.common import client, console, print_json
from trainctl.service.cli.watch import watch_to_end
from trainctl.service.schemas import RunPublic

app = typer.Typer(no_args_is_help=True, help="List, inspect, cancel and follow runs.")
RunId = Annotated[str, typer.Argument(help="The run's id.", show_default=False)]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def progress_text(run: RunPublic) -> str:
    p = run.progress
    return f"{p.step}/{p.total_steps}" if p.total_steps else str(p.step)


@app.command("list")
def list_runs(
    ctx: typer.Context,
    kind: Annotated[str | None, typer.Option(help="train, validate or benchmark.")] = None,
    state: Annotated[str | None, typer.Option(help="queued, running, succeeded, ...")] = None,
    experiment: Annotated[str | None, typer.Option("--experiment", "-e")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 20,
    as_json: AsJson = False,
) -> None:
    """List runs, newest first."""
    with client(ctx) as api:
        runs = api.iter_runs(kind=kind, state=state, experiment=experiment, limit=min(limit, 500))
        items = [run for _, run in zip(range(limit), runs, strict=False)]
    if as_json:
        print_json(items)
        return
    table = Table("ID", "KIND", "EXPERIMENT", "STATE", "PROGRESS", "CREATED", box=None)
    for run in items:
        created = run.created_at.strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(run.id, run.kind, run.experiment, run.state, progress_text(run), created)
    console.print(table if items else "no runs")


@app.command("show")
def show_run(ctx: typer.Context, run_id: RunId) -> None:
    """Show one run as JSON: its resolved spec, progress, result or error."""
    with client(ctx) as api:
        print_json(api.get_run(run_id))


@app.command("cancel")
def cancel_run(ctx: typer.Context, run_id: RunId) -> None:
    """Cancel a queued run, or ask a running one to stop (a train run saves first)."""
    with client(ctx) as api:
        run = api.cancel_run(run_id)
    if run.state == "cancelled":
        console.print(f"run {run.id} cancelled")
    else:
        console.print(f"run {run.id} is {run.state}: it stops at the next step boundary")


@app.command("watch")
def watch_run(ctx: typer.Context, run_id: RunId) -> None:
    """Follow a run live (step, loss, tokens/s, ETA) until it ends."""
    with client(ctx) as api:
        watch_to_end(api, run_id)

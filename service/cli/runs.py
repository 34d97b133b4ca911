"""`trainctl runs list|show|tree|logs|metrics|cancel|watch`."""

from __future__ import annotations

import csv
import sys
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.tree import Tree

from trainctl.service.cli.common import client, console, err_console, print_json
from trainctl.service.cli.watch import Samples, state_text, watch_to_end
from trainctl.service.schemas import LineageNodePublic, LineageRunPublic, RunPublic
from trainctl.store.evals.items import MAX_ITEMS_PAGE
from trainctl.store.kinds.registry import RUN_KINDS
from trainctl.store.vocabulary import METRIC_KINDS_TEXT

app = typer.Typer(no_args_is_help=True, help="List, inspect, cancel and follow runs.")
RunId = Annotated[
    str, typer.Argument(help="The run's id, or its short id (8 characters).", show_default=False)
]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]
# Each metrics row's own columns; a table of them leaves these out.
ROW_IDS = ("event_id", "created_at")


def progress_text(run: RunPublic | LineageRunPublic) -> str:
    p = run.progress
    return f"{p.step}/{p.total_steps}" if p.total_steps else str(p.step)


@app.command("list")
def list_runs(
    ctx: typer.Context,
    kind: Annotated[str | None, typer.Option(help=", ".join(RUN_KINDS.names()) + ".")] = None,
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
    if not items:
        err_console.print("no runs")
        return
    table = Table("ID", "KIND", "EXPERIMENT", "STATE", "PROGRESS", "CREATED", box=None)
    for run in items:
        created = run.created_at.strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(
            run.short_id, run.kind, run.experiment, state_text(run), progress_text(run), created
        )
    console.print(table)


@app.command("show")
def show_run(ctx: typer.Context, run_id: RunId) -> None:
    """Show one run as JSON: its resolved spec, progress, result or error, and why it waits
    (waiting_reason) while no live worker can take it."""
    with client(ctx) as api:
        run = api.get_run(run_id)
    print_json(run)
    if run.waiting_reason:  # for the human: stdout stays JSON alone
        err_console.print(f"run {run.id} is {state_text(run)}", markup=False)


@app.command("tree")
def show_tree(
    ctx: typer.Context,
    experiment: Annotated[
        str, typer.Argument(help="An experiment whose newest train run is in the tree.")
    ],
    as_json: AsJson = False,
) -> None:
    """Show the tree of forks an experiment's newest train run is in, from its root: each run
    with the checkpoint it was forked from (docs/design/forks.md, "Forks")."""
    with client(ctx) as api:
        newest = next(iter(api.iter_runs(kind="train", experiment=experiment, limit=1)), None)
        if newest is None:
            err_console.print(f"experiment {experiment!r} has no train run", markup=False)
            raise typer.Exit(1)
        around = api.lineage(newest.id)
        root = around.ancestors[0].id if around.ancestors else newest.id
        tree = api.lineage(root) if root != newest.id else around
    if as_json:
        print_json(tree)
        return
    top = Tree(tree_label(tree.run, experiment))
    add_forks(top, tree.forks, experiment)
    console.print(top)


def tree_label(run: LineageRunPublic, experiment: str) -> str:
    forked = f"  from {run.parent.experiment}/{run.parent.tag}" if run.parent else ""
    mark = "  <" if run.experiment == experiment else ""
    return f"{run.experiment}  {run.short_id}  {run.state}  {progress_text(run)}{forked}{mark}"


def add_forks(node: Tree, forks: list[LineageNodePublic], experiment: str) -> None:
    for fork in forks:
        add_forks(node.add(tree_label(fork, experiment)), fork.forks, experiment)


def log_line(created_at: datetime, level: str, message: str) -> str:
    """As the API's `?format=text` writes a log line."""
    return f"{created_at.isoformat()} {level.upper():<7} {message}"


@app.command("logs")
def show_logs(
    ctx: typer.Context,
    run_id: RunId,
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f", help="Print new lines as they come, until the run ends."),
    ] = False,
) -> None:
    """Print a run's log lines (its worker's messages: started, checkpoints saved, ...)."""
    with client(ctx) as api:
        if not follow:
            for entry in api.logs(run_id):
                print(log_line(entry.created_at, entry.level, entry.message))
            return
        # The event stream replays the run's history first, then ends when the run does.
        for event in api.events(run_id):
            if event.type == "log":
                data = event.data
                level, message = str(data.get("level", "info")), str(data.get("message", ""))
                print(log_line(event.created_at, level, message), flush=True)


@app.command("metrics")
def show_metrics(
    ctx: typer.Context,
    run_id: RunId,
    kind: Annotated[str | None, typer.Option(help=METRIC_KINDS_TEXT)] = None,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print CSV (a header, then rows).")] = False,
    as_json: AsJson = False,
) -> None:
    """Print a run's metrics history: a table, CSV or JSON."""
    with client(ctx) as api:
        items = api.metrics(run_id, kind)
    rows = [m.model_dump(mode="json") for m in items]
    if as_json:
        print_json(items)
    elif as_csv:
        writer = csv.DictWriter(sys.stdout, fieldnames=metric_columns(rows), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    elif rows:
        console.print(metrics_table(rows))
    else:
        err_console.print("no metrics")


def metric_columns(rows: list[dict[str, Any]]) -> list[str]:
    """The union of the rows' keys in first-seen order, like the API's `?format=csv`."""
    columns = dict.fromkeys(ROW_IDS)
    for row in rows:
        columns.update(dict.fromkeys(row))
    return list(columns)


def metrics_table(rows: list[dict[str, Any]]) -> Table:
    names = [c for c in metric_columns(rows) if c not in ROW_IDS]
    table = Table(*(n.upper() for n in names), box=None)
    for row in rows:
        table.add_row(*(cell(row.get(n)) for n in names))
    return table


def cell(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


@app.command("evals-items")
def show_eval_items(
    ctx: typer.Context,
    run_id: RunId,
    task: Annotated[
        str | None, typer.Option(help="One of the evaluate run's tasks; its first if left out.")
    ] = None,
) -> None:
    """Print an evaluate run's prediction for each item of a task, one JSON object a line
    (JSONL: doc_id, gold, pred, pred_norm, acc, acc_norm, loglikelihoods)."""
    with client(ctx) as api:
        offset: int | None = 0
        while offset is not None:
            page = api.eval_items(run_id, task, offset=offset, limit=MAX_ITEMS_PAGE)
            for item in page.items:
                print(item.model_dump_json())
            offset = page.next_offset


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
def watch_run(
    ctx: typer.Context, run_id: RunId, samples: Samples = False, as_json: AsJson = False
) -> None:
    """Follow a run live (step, loss, tokens/s, ETA) until it ends; exit 1 unless it succeeded."""
    with client(ctx) as api:
        watch_to_end(api, run_id, as_json=as_json, samples=samples)

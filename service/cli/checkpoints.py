"""`trainctl checkpoints list|latest|show|prune|download|delete`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from trainctl.service.cli.common import client, confirm, console, err_console, fail, print_json
from trainctl.service.client import TrainctlClient
from trainctl.service.schemas import CheckpointPublic

app = typer.Typer(
    no_args_is_help=True, help="List, inspect, prune, download and delete checkpoints."
)
Experiment = Annotated[str, typer.Argument(help="The experiment.", show_default=False)]
Tag = Annotated[str, typer.Argument(help="step_<N>, best, a user tag; or latest.")]
ExperimentFilter = Annotated[str | None, typer.Option("--experiment", "-e", help="Only this.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def size(n: int) -> str:
    value, unit = float(n), "B"
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            break
        value /= 1000
    return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"


def table(items: list[CheckpointPublic]) -> Table:
    t = Table("EXPERIMENT", "TAG", "STEP", "BEST LOSS", "SIZE", "CREATED", "RUN", box=None)
    for c in items:
        loss = f"{c.best_loss:.4f}" if c.best_loss is not None else ""
        t.add_row(c.experiment, c.tag, str(c.step or ""), loss, size(c.size_bytes),
                  (c.created_at or "")[:19], c.run_id or "")  # fmt: skip
    return t


def show(c: CheckpointPublic) -> None:
    console.print(table([c]))
    files = Table("FILE", "SIZE", "SHA256", box=None)
    for f in c.files:
        files.add_row(f.name, size(f.size), f.sha256)
    console.print(files)


def resolve(api: TrainctlClient, experiment: str, tag: str) -> CheckpointPublic:
    """`latest` means the experiment's highest step; any other tag is read as it is."""
    if tag == "latest":
        return api.latest_checkpoint(experiment)
    return api.get_checkpoint(experiment, tag)


@app.command("list")
def list_checkpoints(
    ctx: typer.Context, experiment: ExperimentFilter = None, as_json: AsJson = False
) -> None:
    """List complete checkpoints."""
    with client(ctx) as api:
        items = api.list_checkpoints(experiment)
    if as_json:
        print_json(items)
    elif items:
        console.print(table(items))
    else:
        err_console.print("no checkpoints")


@app.command("latest")
def latest_checkpoint(
    ctx: typer.Context, experiment: ExperimentFilter = None, as_json: AsJson = False
) -> None:
    """Show the highest step of an experiment, or the newest checkpoint of all."""
    with client(ctx) as api:
        c = api.latest_checkpoint(experiment)
    print_json(c) if as_json else show(c)


@app.command("show")
def show_checkpoint(
    ctx: typer.Context, experiment: Experiment, tag: Tag, as_json: AsJson = False
) -> None:
    """Show one checkpoint and its files' sizes and sha256."""
    with client(ctx) as api:
        c = resolve(api, experiment, tag)
    print_json(c) if as_json else show(c)


@app.command("prune")
def prune_checkpoints(
    ctx: typer.Context,
    experiment: Experiment,
    keep_last: Annotated[int, typer.Option(help="step_* checkpoints to keep.")] = 3,
    keep_best: Annotated[bool, typer.Option(help="Keep the step 'best' came from.")] = True,
    dry_run: Annotated[bool, typer.Option(help="Only say what would be deleted.")] = False,
    as_json: AsJson = False,
) -> None:
    """Delete old step checkpoints; never the latest, the best, or ones runs need."""
    with client(ctx) as api:
        result = api.prune(experiment, keep_last, keep_best=keep_best, dry_run=dry_run)
    if as_json:
        print_json(result)
        return
    verb = "would delete" if dry_run else "deleted"
    console.print(f"{verb}: {', '.join(c.tag for c in result.deleted) or 'nothing'}")
    console.print(f"kept: {', '.join(c.tag for c in result.kept) or 'nothing'}")


@app.command("download")
def download_checkpoint(
    ctx: typer.Context,
    experiment: Experiment,
    tag: Tag,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Folder; default ./<experiment>-<tag>.")
    ] = None,
    files: Annotated[
        list[str] | None, typer.Option("--file", "-f", help="Only these files (repeatable).")
    ] = None,
) -> None:
    """Download a checkpoint's files: resumable (.part + Range), sha256-verified."""
    with client(ctx) as api:
        c = resolve(api, experiment, tag)
        folder = out or Path(f"{c.experiment}-{c.tag}")
        folder.mkdir(parents=True, exist_ok=True)
        names = files or [f.name for f in c.files] + ["manifest.json"]
        columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                   TransferSpeedColumn())  # fmt: skip
        with Progress(*columns, console=err_console) as progress:
            for name in names:
                task = progress.add_task(name, total=None)

                def advance(done: int, total: int | None, task: TaskID = task) -> None:
                    progress.update(task, completed=done, total=total)

                api.download_file(c.experiment, c.tag, name, folder / name, on_progress=advance)
    verified = [n for n in names if n != "manifest.json"]
    console.print(
        f"downloaded {c.experiment}/{c.tag} to {folder}/ ({len(verified)} files, sha256 verified)"
    )


@app.command("delete")
def delete_checkpoint(
    ctx: typer.Context,
    experiment: Experiment,
    tag: Annotated[str, typer.Argument(help="step_<N>, best or a user tag.", show_default=False)],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask first.")] = False,
    as_json: AsJson = False,
) -> None:
    """Delete one checkpoint; one that a run still needs is refused (HTTP 409)."""
    with client(ctx) as api:
        c = api.get_checkpoint(experiment, tag)  # a typo fails here, before the question
        question = (
            f"delete checkpoint {c.experiment}/{c.tag} (step {c.step}, {size(c.size_bytes)})?"
        )
        if not yes and not confirm(question):
            fail("nothing deleted (--yes deletes without asking)")
        deleted = api.delete_checkpoint(experiment, tag)
    if as_json:
        print_json(deleted)
    else:
        console.print(f"deleted {deleted.experiment}/{deleted.tag}")

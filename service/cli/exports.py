"""`trainctl exports list|show|download|delete`: the folders `checkpoints export` wrote.

An export is named by the experiment and tag of the checkpoint it was made from and served as
a checkpoint is (files with sha256, Range, an archive), so these commands are the checkpoint
commands' table, download and delete over the other store.
"""

from __future__ import annotations

from typing import Annotated

import typer

from trainctl.service.cli.checkpoints import (
    AsJson,
    Experiment,
    ExperimentFilter,
    Files,
    Out,
    Yes,
    delete,
    download,
    print_listing,
    show,
)
from trainctl.service.cli.common import client, console, print_json

app = typer.Typer(
    no_args_is_help=True,
    help="List, inspect, download and delete exports (checkpoints as transformers folders).",
)
Tag = Annotated[
    str, typer.Argument(help="The exported checkpoint's tag (step_<N>, best).", show_default=False)
]


@app.command("list")
def list_exports(
    ctx: typer.Context, experiment: ExperimentFilter = None, as_json: AsJson = False
) -> None:
    """List complete exports."""
    with client(ctx) as api:
        items = api.list_exports(experiment)
    print_listing(items, as_json, "no exports (trainctl checkpoints export EXP TAG makes one)")


@app.command("show")
def show_export(
    ctx: typer.Context, experiment: Experiment, tag: Tag, as_json: AsJson = False
) -> None:
    """Show one export and its files' sizes and sha256."""
    with client(ctx) as api:
        export = api.get_export(experiment, tag)
    print_json(export) if as_json else show(export)


@app.command("download")
def download_export(
    ctx: typer.Context, experiment: Experiment, tag: Tag, out: Out = None, files: Files = None
) -> None:
    """Download an export's files, a folder transformers loads: resumable, sha256-verified."""
    with client(ctx) as api:
        download(api.download_export_file, api.get_export(experiment, tag), out, files)


@app.command("delete")
def delete_export(
    ctx: typer.Context, experiment: Experiment, tag: Tag, yes: Yes = False, as_json: AsJson = False
) -> None:
    """Delete an export (admin token); its checkpoint stays, and can be exported again."""
    with client(ctx) as api:
        export = api.get_export(experiment, tag)  # a typo fails here, before the question
        what = f"export {export.experiment}/{export.tag}"
        deleted = delete(what, export, api.delete_export, yes)
    print_json(deleted) if as_json else console.print(f"deleted {what}")

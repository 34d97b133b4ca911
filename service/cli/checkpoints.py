"""`trainctl checkpoints list|latest|show|prune|download|delete|export`.

An export (`checkpoints export`) is served like a checkpoint, so `trainctl exports` shows,
downloads and deletes it with the table, download and delete code here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Protocol

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from trainctl.service.cli.common import (
    checkpoint_choice,
    client,
    confirm,
    console,
    err_console,
    fail,
    print_json,
)
from trainctl.service.cli.errors import BadInput
from trainctl.service.cli.interrupts import exit_on_interrupt
from trainctl.service.cli.submit import MaxAttempts, Priority, opt, queue_flags
from trainctl.service.cli.watch import queued_or_finished
from trainctl.service.schemas import CheckpointPublic
from trainctl.service.sdk.client import Progress as OnProgress
from trainctl.service.sdk.client import TrainctlClient
from trainctl.store.checkpoints.manifests import MANIFEST_FILE
from trainctl.store.kinds.export import ExportRequest
from trainctl.store.text import counted

app = typer.Typer(
    no_args_is_help=True, help="List, inspect, prune, download, delete and export checkpoints."
)
Experiment = Annotated[str, typer.Argument(help="The experiment.", show_default=False)]
Tag = Annotated[str, typer.Argument(help="step_<N>, best, a user tag; or latest.")]
ExperimentFilter = Annotated[str | None, typer.Option("--experiment", "-e", help="Only this.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]
Out = Annotated[
    Path | None, typer.Option("--out", "-o", help="Folder; default ./<experiment>-<tag>.")
]
Files = Annotated[
    list[str] | None, typer.Option("--file", "-f", help="Only these files (repeatable).")
]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask first.")]


class FetchFile(Protocol):
    """`TrainctlClient.download_file` or `.download_export_file`: one file of one store."""

    def __call__(
        self,
        experiment: str,
        tag: str,
        name: str,
        dest: Path,
        *,
        on_progress: OnProgress | None = None,
    ) -> Path: ...


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
    print_listing(items, as_json, "no checkpoints")


def print_listing(items: list[CheckpointPublic], as_json: bool, empty: str) -> None:
    """A listing of checkpoints or exports: JSON, a table, or `empty` on stderr."""
    if as_json:
        print_json(items)
    elif items:
        console.print(table(items))
    else:
        err_console.print(empty)


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
    ctx: typer.Context, experiment: Experiment, tag: Tag, out: Out = None, files: Files = None
) -> None:
    """Download a checkpoint's files: resumable (.part + Range), each the manifest lists
    sha256-verified (it says which were not: a sharded checkpoint's stitched model)."""
    with client(ctx) as api:
        c = resolve(api, experiment, tag)
        download(api.download_file, c, out, files)


def download(
    fetch: FetchFile,
    c: CheckpointPublic,
    out: Path | None,
    files: list[str] | None,
    *,
    say: Console = console,
) -> Path:
    """Every file of `c` (or `files`) into `out`, a bar each on stderr; the folder. `say`
    gets the line saying where they are (stderr where stdout holds JSON)."""
    folder = out or Path(f"{c.experiment}-{c.tag}")
    folder.mkdir(parents=True, exist_ok=True)
    names = files or [f.name for f in c.files] + [MANIFEST_FILE]
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
               TransferSpeedColumn())  # fmt: skip
    resume = f"download stopped; the same command resumes it into {folder}/"
    with exit_on_interrupt(resume), Progress(*columns, console=err_console) as progress:
        for name in names:
            task = progress.add_task(name, total=None)

            def advance(done: int, total: int | None, task: TaskID = task) -> None:
                progress.update(task, completed=done, total=total)

            fetch(c.experiment, c.tag, name, folder / name, on_progress=advance)
    say.print(f"downloaded {c.experiment}/{c.tag} to {folder}/ ({checked(c, names)})")
    return folder


def checked(c: CheckpointPublic, names: list[str]) -> str:
    """What was checked of the files `names` just downloaded, and what was not: only a file
    the manifest lists has a sha256 to verify (the SDK refuses one that differs). The
    manifest is what they are checked against; a sharded checkpoint's model.safetensors is
    stitched by the service from its shards and listed nowhere, so nothing can verify it."""
    listed = {f.name for f in c.files}
    verified = [n for n in names if n in listed]
    unlisted = [n for n in names if n not in listed and n != MANIFEST_FILE]
    said = []
    if verified:
        said.append(f"{counted(len(verified), 'file')} sha256 verified against {MANIFEST_FILE}")
    if unlisted:
        said.append(
            f"{', '.join(unlisted)} not verified: stitched by the service from the shards, "
            f"which it found with the sizes {MANIFEST_FILE} gives; the stitched file has no "
            "sha256 there (download the shards to verify them)"
        )
    if not said:
        said.append(f"{MANIFEST_FILE} only, which files are verified against")
    return "; ".join(said)


@app.command("delete")
def delete_checkpoint(
    ctx: typer.Context,
    experiment: Experiment,
    tag: Annotated[str, typer.Argument(help="step_<N>, best or a user tag.", show_default=False)],
    yes: Yes = False,
    as_json: AsJson = False,
) -> None:
    """Delete one checkpoint; one that a run still needs is refused (HTTP 409)."""
    with client(ctx) as api:
        c = api.get_checkpoint(experiment, tag)  # a typo fails here, before the question
        deleted = delete(f"checkpoint {c.experiment}/{c.tag}", c, api.delete_checkpoint, yes)
    print_json(deleted) if as_json else console.print(f"deleted {deleted.experiment}/{deleted.tag}")


def delete(
    what: str,
    c: CheckpointPublic,
    remove: Callable[[str, str], CheckpointPublic],
    yes: bool,
) -> CheckpointPublic:
    """Ask first (unless `yes`), then `remove` it: what was deleted."""
    question = f"delete {what} (step {c.step}, {size(c.size_bytes)})?"
    if not yes and not confirm(question):
        fail("nothing deleted (--yes deletes without asking)")
    return remove(c.experiment, c.tag)


@app.command("export")
def export_checkpoint(
    ctx: typer.Context,
    experiment: Experiment,
    tag: Tag,
    export_format: Annotated[str | None, opt(ExportRequest, "format", "--format")] = None,
    dtype: Annotated[str | None, opt(ExportRequest, "dtype", "--dtype")] = None,
    priority: Priority = None,
    max_attempts: MaxAttempts = None,
    watch: Annotated[
        bool, typer.Option("--watch/--no-watch", help="Wait for the export and say where it is.")
    ] = True,
    download_to: Annotated[
        Path | None,
        typer.Option(
            "--download",
            help="Then download it into this folder (each file sha256-verified).",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print the export's result (the queued run with --no-watch)."),
    ] = False,
) -> None:
    """Export a checkpoint as a Hugging Face transformers folder (an export run).

    The folder loads with transformers' AutoModelForCausalLM.from_pretrained; what it computes
    differently from trainctl, if anything, is listed when the export ends.
    """
    if download_to is not None and not watch:
        raise BadInput("--download waits for the export to finish: leave out --no-watch")
    spec: dict[str, Any] = {
        **checkpoint_choice(experiment, tag),
        "format": export_format,
        "dtype": dtype,
        **queue_flags(priority, max_attempts),
    }
    with client(ctx) as api:
        run = api.submit_export(**{k: v for k, v in spec.items() if v is not None})
        done = queued_or_finished(api, run, watch=watch, as_json=as_json)
        if done is None:
            return
        result = done.result or {}
        print_json(result) if as_json else print_export(result)
        e, t = result["export"]["experiment"], result["export"]["tag"]
        if download_to is not None:
            export = api.get_export(e, t)
            say = err_console if as_json else console
            download(api.download_export_file, export, download_to, None, say=say)
        else:
            err_console.print(f"download it: trainctl exports download {e} {t} -o DIR")


def print_export(result: dict[str, Any]) -> None:
    """Where the export is, and what it computes differently from trainctl (stdout; printed
    as they are: these lines are data, not rich markup)."""
    e, t = result["export"]["experiment"], result["export"]["tag"]
    print(
        f"exported {e}/{t} (step {result['checkpoint']['step']}) as {result['format']}: "
        f"{result['architecture']}, {result['dtype']}, tokenizer {result['tokenizer']}"
    )
    print(f"folder on the service: {result['folder']}")
    for title in ("differences", "notes"):
        if result.get(title):
            print(f"{title}:")
            for line in result[title]:
                print(f"  - {line}")

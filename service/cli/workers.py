"""`trainctl workers`: the worker processes the service knows, alive or gone;
`trainctl workers drain ID` drains one (admin)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from trainctl.service.cli.common import client, console, err_console, print_json
from trainctl.service.schemas import WorkerPublic


def gpus_text(w: WorkerPublic) -> str:
    """`-` on a CPU worker; `8 x NVIDIA H100 80GB HBM3 (79.6 GiB)` on a GPU one."""
    if not w.gpus:
        return "-"
    text = f"{w.gpus} x {w.gpu_model or 'GPU'}"
    return text + (f" ({w.gpu_memory_bytes / 2**30:.1f} GiB)" if w.gpu_memory_bytes else "")


def state_text(w: WorkerPublic) -> str:
    if not w.alive:
        return "gone"
    return "draining" if w.draining else "alive"


def table(items: list[WorkerPublic]) -> Table:
    t = Table("ID", "NODE", "HOST", "PID", "DEVICE", "GPUS", "CPUS", "STATE", "RUN", "LAST SEEN",
              box=None)  # fmt: skip
    for w in items:
        t.add_row(w.id, w.node_name, w.host, str(w.pid), w.device, gpus_text(w), str(w.cpus),
                  state_text(w), w.current_run_id or "",
                  w.last_seen_at.strftime("%Y-%m-%d %H:%M:%S"))  # fmt: skip
    return t


app = typer.Typer(
    invoke_without_command=True,
    help="List workers: node, host, device, GPUs and CPUs, the run each is on, whether it is "
    "alive; `drain ID` drains one.",
)


@app.callback()
def list_workers(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List workers: node, host, device, GPUs and CPUs, the run each is on, whether it is
    alive."""
    if ctx.invoked_subcommand is not None:
        return
    with client(ctx) as api:
        items = api.workers()
    if as_json:
        print_json(items)
    elif items:
        console.print(table(items))
    else:
        err_console.print("no workers")


@app.command("drain")
def drain_worker(
    ctx: typer.Context,
    worker_id: Annotated[str, typer.Argument(help="The worker's id (trainctl workers).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Drain a worker (admin): its run saves and goes back to the queue, within
    TRAINCTL_DRAIN_SECONDS; then it exits and is not restarted."""
    with client(ctx) as api:
        worker = api.drain_worker(worker_id)
    if as_json:
        print_json(worker)
    else:
        run = f"; run {worker.current_run_id} is handed back" if worker.current_run_id else ""
        console.print(f"worker {worker.id} is draining{run}")


def register(parent: typer.Typer) -> None:
    parent.add_typer(app, name="workers")

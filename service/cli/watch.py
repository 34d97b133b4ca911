"""Following a run live: a rich progress bar fed by the run's event stream (SSE).

The bar shows step / total, the latest loss, tokens/s and an ETA (for a prepare: documents
and tokens done, and tokens/s). The ETA comes from the worker's own step times (an average
over the last steps), not from how fast events arrive here, so it is right even while an
already-running run's history replays.

The bar and the events go to stderr; stdout gets the outcome alone: a line, or with --json the
finished run as one line of JSON.
"""

from __future__ import annotations

from collections import deque
from datetime import timedelta
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from trainctl.service.cli.common import console, err_console, fail, print_json
from trainctl.service.client import TrainctlClient
from trainctl.service.schemas import EventPublic, RunPublic

STEP_KINDS = ("train", "measure", "warmup")
RECENT_STEPS = 20


class RunBar:
    def __init__(self, progress: Progress, run: RunPublic) -> None:
        self.progress = progress
        self.task = progress.add_task(
            f"{run.kind} {run.id[:8]}",
            total=run.progress.total_steps,
            completed=run.progress.step,
            loss="-",
            speed="-",
            eta="-",
            visible=run.kind != "validate",  # a validation has no steps to count
        )
        self.step_times: deque[float] = deque(maxlen=RECENT_STEPS)

    def on_event(self, event: EventPublic) -> None:
        data = event.data
        if event.type == "metrics" and data.get("kind") in STEP_KINDS:
            self.on_step(data)
        elif event.type == "metrics" and data.get("kind") == "prepare":
            self.on_prepare(data)
        elif event.type == "metrics" and data.get("kind") == "val":
            self.progress.console.print(f"  {validation_line(data)}")
        elif event.type == "log":
            self.progress.console.print(f"  {data.get('level', 'info')}: {data.get('message')}")
        elif event.type == "state":
            self.progress.console.print(f"  state: {data.get('state')}")

    def on_prepare(self, data: dict[str, Any]) -> None:
        """A prepare counts documents, whose total is not known until it ends."""
        self.progress.update(
            self.task,
            completed=int(data.get("documents", 0)),
            description=f"prepare: {int(data.get('tokens', 0)):,} tokens",
            speed=f"{float(data.get('tokens_per_sec', 0.0)):,.0f}",
        )

    def on_step(self, data: dict[str, Any]) -> None:
        step, total = int(data["step"]), data.get("total_steps")
        if "step_time_sec" in data:
            self.step_times.append(float(data["step_time_sec"]))
        fields: dict[str, Any] = {"description": f"{data['kind']}"}
        if isinstance(data.get("loss"), int | float):
            fields["loss"] = f"{data['loss']:.4f}"
        if isinstance(data.get("tokens_per_sec"), int | float):
            fields["speed"] = f"{data['tokens_per_sec']:,.0f}"
        if total and self.step_times:
            left = (total - step) * sum(self.step_times) / len(self.step_times)
            fields["eta"] = str(timedelta(seconds=round(left)))
        self.progress.update(self.task, completed=step, total=total, **fields)


def validation_line(data: dict[str, Any]) -> str:
    """`step 100: val_loss 2.1234, bits/byte 1.0312`; bits per byte where it is known."""
    at = f"step {data['step']}: " if data.get("step") is not None else ""
    line = f"{at}val_loss {data['val_loss']:.4f}"
    if isinstance(data.get("val_bits_per_byte"), int | float):
        line += f", bits/byte {data['val_bits_per_byte']:.4f}"
    return line


def watch_to_end(api: TrainctlClient, run_id: str, *, as_json: bool = False) -> RunPublic:
    """Follow the run until it ends; print its outcome; exit 1 unless it succeeded."""
    run = api.get_run(run_id)
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TextColumn("{task.fields[speed]} tok/s"),
        TextColumn("ETA {task.fields[eta]}"),
    )
    try:
        with Progress(*columns, console=err_console) as progress:
            bar = RunBar(progress, run)
            for event in api.events(run_id):
                bar.on_event(event)
    except KeyboardInterrupt:
        fail(f"stopped watching; run {run_id} goes on (trainctl runs cancel {run_id})", 130)
    return report(api.get_run(run_id), as_json=as_json)


def report(run: RunPublic, *, as_json: bool = False) -> RunPublic:
    if as_json:
        print_json(run, one_line=True)
    if run.state == "succeeded":
        shown = {k: v for k, v in (run.result or {}).items() if not isinstance(v, dict | list)}
        (err_console if as_json else console).print(
            f"run {run.id} succeeded: " + ", ".join(f"{k} {_fmt(v)}" for k, v in shown.items())
        )
        return run
    if run.state == "failed":
        fail(f"run {run.id} failed: {run.error}")
    fail(f"run {run.id} was {run.state}" + (f": {run.error}" if run.error else ""))


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)

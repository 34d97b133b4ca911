"""Following a run live: a rich progress bar fed by the run's event stream (SSE).

The bar shows step / total, the latest loss, tokens/s and an ETA (for a prepare: documents
and tokens done, and tokens/s). The ETA comes from the worker's own step times (an average
over the last steps), not from how fast events arrive here, so it is right even while an
already-running run's history replays.

The bar and the events go to stderr; stdout gets the outcome alone: a line, or with --json the
finished run as one line of JSON. With `samples`, a train run's samples (`sample_every`) are
shown among the events, a line each.
"""

from __future__ import annotations

import json
from collections import deque
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from trainctl.service.cli.common import console, err_console, fail, print_json
from trainctl.service.cli.interrupts import exit_on_interrupt
from trainctl.service.schemas import EventPublic, RunPublic
from trainctl.service.sdk.client import TrainctlClient, TrainingSample
from trainctl.store.kinds.registry import RUN_KINDS

STEP_KINDS = ("train", "measure", "warmup")
RECENT_STEPS = 20
Samples = Annotated[
    bool,
    typer.Option(
        "--samples", help="Also print a train run's samples (sample_every): step, prompt → text."
    ),
]


def counts_steps(run: RunPublic) -> bool:
    """Whether the run's progress counts steps: its kind's record says (store.kinds.registry); a
    kind this client does not know (a plug-in of the server's) does when it reports a total."""
    if run.kind in RUN_KINDS:
        return RUN_KINDS.get(run.kind).has_steps
    return run.progress.total_steps is not None


class RunBar:
    def __init__(self, progress: Progress, run: RunPublic, *, samples: bool = False) -> None:
        self.progress = progress
        # Only a train run's sample events are TrainingSamples (a sample run's are pieces).
        self.samples = samples and run.kind == "train"
        self.task = progress.add_task(
            f"{run.kind} {run.short_id}",
            total=run.progress.total_steps,
            completed=run.progress.step,
            loss="-",
            speed="-",
            eta="-",
            visible=counts_steps(run),  # no steps to count: no bar
        )
        self.step_times: deque[float] = deque(maxlen=RECENT_STEPS)

    def on_event(self, event: EventPublic) -> None:
        data = event.data
        if event.type == "metrics" and data.get("kind") in STEP_KINDS:
            self.on_step(data)
        elif event.type == "metrics" and data.get("kind") == "prepare":
            self.on_prepare(data)
        elif event.type == "metrics" and data.get("kind") == "val":
            self.print(validation_line(data))
        elif self.samples and (sample := TrainingSample.from_event(event)) is not None:
            self.print(sample_line(sample))
        elif (line := event_line(event)) is not None:
            self.print(line)

    def print(self, line: str) -> None:
        """A line above the bar; as it is: a log message or a sample is not rich markup."""
        self.progress.console.print(f"  {line}", markup=False, emoji=False)

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


def state_text(run: RunPublic) -> str:
    """`running`; a queued run that no live worker can take with why:
    `queued, waiting: needs 2 GPUs per node; no live worker has a GPU`."""
    return f"{run.state}, {run.waiting_reason}" if run.waiting_reason else run.state


def event_line(event: EventPublic) -> str | None:
    """How a log or state event reads (`info: saved ...`, `state: running`); None for others."""
    if event.type == "log":
        return f"{event.data.get('level', 'info')}: {event.data.get('message')}"
    if event.type == "state":
        return f"state: {event.data.get('state')}"
    return None


def sample_line(sample: TrainingSample) -> str:
    """`step 30: "def " → "main():\n"`: quoted, so a completion's newlines and control
    characters keep to one line."""
    return f"step {sample.step}: {quoted(sample.prompt)} → {quoted(sample.completion)}"


def quoted(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def validation_line(data: dict[str, Any]) -> str:
    """`step 100: val_loss 2.1234, bits/byte 1.0312`; bits per byte where it is known."""
    at = f"step {data['step']}: " if data.get("step") is not None else ""
    line = f"{at}val_loss {data['val_loss']:.4f}"
    if isinstance(data.get("val_bits_per_byte"), int | float):
        line += f", bits/byte {data['val_bits_per_byte']:.4f}"
    return line


def watch_to_end(
    api: TrainctlClient, run_id: str, *, as_json: bool = False, samples: bool = False
) -> RunPublic:
    """Follow the run until it ends; print its outcome; exit 1 unless it succeeded."""
    return report(follow(api, run_id, samples=samples), as_json=as_json)


def follow(api: TrainctlClient, run_id: str, *, samples: bool = False) -> RunPublic:
    """Show the run's bar and events on stderr until it ends; the finished run.

    Ctrl-C stops following (exit 130) and leaves the run going.
    """
    run = api.get_run(run_id)
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TextColumn("{task.fields[speed]} tok/s"),
        TextColumn("ETA {task.fields[eta]}"),
    )
    with interrupt_stops_watching(run_id), Progress(*columns, console=err_console) as progress:
        bar = RunBar(progress, run, samples=samples)
        if run.waiting_reason:
            bar.print(f"state: {state_text(run)}")
        for event in api.events(run_id):
            bar.on_event(event)
    return api.get_run(run_id)


def interrupt_stops_watching(run_id: str) -> AbstractContextManager[None]:
    """Ctrl-C while following a run exits at once with 130 and the line saying the run goes
    on: there is nothing to clean up, the run is the service's."""
    cancel = f"trainctl runs cancel {run_id}"
    return exit_on_interrupt(f"stopped watching; run {run_id} goes on ({cancel})")


def report(run: RunPublic, *, as_json: bool = False) -> RunPublic:
    if as_json:
        print_json(run, one_line=True)
    require_success(run)
    shown = {k: v for k, v in (run.result or {}).items() if not isinstance(v, dict | list)}
    (err_console if as_json else console).print(
        f"run {run.id} succeeded: " + ", ".join(f"{k} {_fmt(v)}" for k, v in shown.items())
    )
    return run


def queued_or_finished(
    api: TrainctlClient, run: RunPublic, *, watch: bool, as_json: bool
) -> RunPublic | None:
    """What a submitting command prints of the run it queued. Without `watch`: the run and how
    to follow it, and None. With it: follows the run to its end, exits 1 unless it
    succeeded, and gives the finished run for the command to print its result."""
    if not watch:
        print_json(run) if as_json else console.print(f"submitted {run.kind} run {run.id}")
        err_console.print(f"follow it: trainctl runs watch {run.id}")
        return None
    err_console.print(f"submitted {run.kind} run {run.id}")
    finished = follow(api, run.id)
    require_success(finished)
    return finished


def require_success(run: RunPublic) -> None:
    """Exit 1 with why, unless the run succeeded."""
    if run.state == "succeeded":
        return
    if run.state == "failed":
        fail(f"run {run.id} failed: {run.error}")
    fail(f"run {run.id} was {run.state}" + (f": {run.error}" if run.error else ""))


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)

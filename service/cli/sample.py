"""`trainctl sample EXP TAG PROMPT...`: continue prompts with a checkpoint, printing the text
as the worker generates it (docs/design/models.md, "Model output: samples, sample runs,
exports", "Sample runs").

A sample run is queued like any run; its `sample` events carry the completions' text piece by
piece (`SamplePiece`), and this prints them on stdout as they come. Prompts decoded together
send their pieces interleaved: the completions are printed one after another, in the order of
the prompts, each as it arrives once those before it are done. The run's state and log lines
go to stderr, and `--json` prints the run's result (every completion whole) instead.
"""

from __future__ import annotations

import re
import sys
from contextlib import nullcontext
from typing import Annotated, Any

import typer

from trainctl.service.cli.common import checkpoint_choice, client, err_console, print_json
from trainctl.service.cli.submit import Device, MaxAttempts, Priority, opt, queue_flags
from trainctl.service.cli.watch import (
    event_line,
    interrupt_stops_watching,
    require_success,
    state_text,
)
from trainctl.service.schemas import RunPublic
from trainctl.service.sdk.client import SamplePiece, TrainctlClient
from trainctl.store.models.generation import GenerationSettings

# C0 and C1 control characters but newline and tab: what a barely trained byte-level model
# writes can hold escape sequences, which a terminal would obey rather than show.
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def register(app: typer.Typer) -> None:
    app.command("sample")(sample)


def sample(
    ctx: typer.Context,
    experiment: Annotated[str, typer.Argument(help="The experiment.", show_default=False)],
    tag: Annotated[str, typer.Argument(help="step_<N>, best, a user tag; or latest.")],
    prompts: Annotated[
        list[str],
        typer.Argument(help="Texts to continue, one completion each.", show_default=False),
    ],
    max_new_tokens: Annotated[int | None, opt(GenerationSettings, "max_new_tokens")] = None,
    temperature: Annotated[float | None, opt(GenerationSettings, "temperature")] = None,
    top_k: Annotated[
        int | None,
        typer.Option(
            help="Sample only among the k most likely tokens; 0: no limit. Default 200.",
            show_default=False,
        ),
    ] = None,
    top_p: Annotated[float | None, opt(GenerationSettings, "top_p")] = None,
    stop: Annotated[
        list[str] | None,
        typer.Option(
            "--stop",
            help="End a completion where this string first appears (left out); repeatable.",
            show_default=False,
        ),
    ] = None,
    seed: Annotated[int | None, opt(GenerationSettings, "seed")] = None,
    device: Device = None,
    priority: Priority = None,
    max_attempts: MaxAttempts = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the run's result (every completion) as JSON.")
    ] = False,
) -> None:
    """Continue PROMPTS with checkpoint EXP TAG; the text is printed as it is generated."""
    given = {
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "stop": stop,
        "seed": seed,
    }
    generation: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    if top_k is not None:
        generation["top_k"] = top_k or None  # 0: the API's null, no limit
    spec: dict[str, Any] = {
        **checkpoint_choice(experiment, tag),
        "prompts": prompts,
        "generation": generation,
    }
    given_run = {"device": device, **queue_flags(priority, max_attempts)}
    spec |= {k: v for k, v in given_run.items() if v is not None}
    with client(ctx) as api:
        run = api.submit_sample(**spec)
        err_console.print(f"sample run {run.id} ({state_text(run)})", markup=False)
        run = follow_sample(api, run, None if as_json else Transcript(prompts))
    require_success(run)
    if as_json:
        print_json(run.result or {})
    else:
        err_console.print(summary(run), markup=False)


def follow_sample(api: TrainctlClient, run: RunPublic, transcript: Transcript | None) -> RunPublic:
    """Print the run's text as it comes (unless `transcript` is None) and its state and log
    lines on stderr, until it ends; the finished run. Ctrl-C leaves it going (exit 130)."""
    with interrupt_stops_watching(run.id), transcript or nullcontext():
        for event in api.events(run.id):
            if (piece := SamplePiece.from_event(event)) is None:
                if (line := event_line(event)) is not None:
                    err_console.print(f"  {line}", markup=False, emoji=False)
            elif transcript is not None:
                transcript.add(piece)
    return api.get_run(run.id)


class Transcript:
    """The completions on stdout in the order of their prompts, each printed after its prompt
    as its pieces arrive; a completion whose turn has not come is held until it has."""

    def __init__(self, prompts: list[str]) -> None:
        self.prompts = prompts
        self.texts = [""] * len(prompts)
        self.done = [False] * len(prompts)
        self.current = 0  # the completion being printed
        self.printed = -1  # of its text; -1: not even its prompt yet
        self.mid_line = False
        self.terminal = sys.stdout.isatty()

    def __enter__(self) -> Transcript:
        return self

    def __exit__(self, *exc_info: object) -> None:
        # Stopped, or the run failed, mid-completion: what follows starts on a line of its own.
        self.end_line()

    def add(self, piece: SamplePiece) -> None:
        self.texts[piece.index] += piece.delta
        self.done[piece.index] = piece.finish_reason is not None
        while self.current < len(self.prompts):
            i = self.current
            if self.printed < 0:
                self.begin(i)
            self.write(self.texts[i][self.printed :])
            self.printed = len(self.texts[i])
            if not self.done[i]:
                return
            self.end_line()
            self.current, self.printed = i + 1, -1

    def begin(self, i: int) -> None:
        """A label where there are several completions (as `head` labels files), the prompt."""
        if len(self.prompts) > 1:
            blank = "\n" if i > 0 else ""  # between one completion and the next label
            self.write(f"{blank}==> {i + 1}/{len(self.prompts)} <==\n")
        prompt = self.prompts[i]
        # The prompt in bold on a terminal, so the generated text stands apart from it.
        self.write(f"\033[1m{prompt}\033[0m" if self.terminal else prompt, raw=True)
        self.printed = 0

    def write(self, text: str, *, raw: bool = False) -> None:
        if not text:
            return
        if self.terminal and not raw:
            text = CONTROL.sub("\ufffd", text)
        sys.stdout.write(text)
        sys.stdout.flush()
        self.mid_line = not text.endswith("\n")

    def end_line(self) -> None:
        if self.mid_line:
            self.write("\n")


def summary(run: RunPublic) -> str:
    """`run … succeeded: 2 completions (length, eot), 80 tokens at 1,222 tokens/s, ...`."""
    r = run.result or {}
    reasons = ", ".join(str(c.get("finish_reason")) for c in r.get("completions", []))
    speed = f" at {r['tokens_per_sec']:,.0f} tokens/s" if r.get("tokens_per_sec") else ""
    c = r.get("checkpoint", {})
    return (
        f"run {run.id} succeeded: {len(r.get('completions', []))} completions ({reasons}), "
        f"{r.get('generated_tokens')} tokens{speed}, checkpoint {c.get('experiment')}/"
        f"{c.get('tag')} (step {c.get('step')}), seed {r.get('seed')}"
    )

"""`trainctl evals tasks` and `trainctl evaluate EXP TAG --tasks ...`: the downstream tasks,
and a checkpoint scored on them by an evaluate run (docs/evals.md; docs/design/kinds.md, "Run
kinds").

`evaluate` queues the run and, unless told `--no-watch`, follows it (state and log lines on
stderr) and prints its scores as a table on stdout, one row per task; `--json` prints the
run's result instead.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from trainctl.service.cli.common import checkpoint_choice, client, console, err_console, print_json
from trainctl.service.cli.errors import BadInput
from trainctl.service.cli.submit import Device, MaxAttempts, Priority, opt, queue_flags
from trainctl.service.cli.watch import queued_or_finished
from trainctl.service.schemas import EvalTaskPublic
from trainctl.store.evals.tasks import METRICS
from trainctl.store.kinds.evaluate import EvaluateRequest

app = typer.Typer(no_args_is_help=True, help="The downstream evaluation tasks.")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="evals")
    root.command("evaluate")(evaluate)


def tasks_table(tasks: list[EvalTaskPublic]) -> Table:
    t = Table("TASK", "ITEMS", "SPLIT", "FEW-SHOT FROM", "MAX SHOTS", "METRICS", box=None)
    for task in tasks:
        t.add_row(task.name, f"{task.size:,}", task.split, task.fewshot_split,
                  str(task.max_fewshot), ", ".join(task.metrics))  # fmt: skip
    return t


@app.command("tasks")
def list_tasks(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the tasks an evaluate run may name, with their sizes and metrics."""
    with client(ctx) as api:
        tasks = api.eval_tasks()
    print_json(tasks) if as_json else console.print(tasks_table(tasks))


def scores_table(result: dict[str, Any]) -> Table:
    t = Table("TASK", "ITEMS", *(m.upper() for m in METRICS), box=None)
    for name, scores in result.get("tasks", {}).items():
        t.add_row(name, str(scores.get("items")), *(_score(scores.get(m)) for m in METRICS))
    return t


def _score(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else "-"


def evaluate(
    ctx: typer.Context,
    experiment: Annotated[str, typer.Argument(help="The experiment.", show_default=False)],
    tag: Annotated[str, typer.Argument(help="step_<N>, best, a user tag; or latest.")],
    tasks: Annotated[
        str,
        typer.Option(
            help="Comma-separated task names (trainctl evals tasks), e.g. hellaswag,arc_easy.",
            show_default=False,
        ),
    ],
    limit: Annotated[int | None, opt(EvaluateRequest, "limit")] = None,
    num_fewshot: Annotated[int | None, opt(EvaluateRequest, "num_fewshot")] = None,
    seed: Annotated[int | None, opt(EvaluateRequest, "seed")] = None,
    batch_size: Annotated[int | None, opt(EvaluateRequest, "batch_size")] = None,
    device: Device = None,
    priority: Priority = None,
    max_attempts: MaxAttempts = None,
    watch: Annotated[
        bool, typer.Option("--watch/--no-watch", help="Wait for the scores and print them.")
    ] = True,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print the run's result (the queued run with --no-watch)."),
    ] = False,
) -> None:
    """Score checkpoint EXP TAG on downstream tasks (an evaluate run); print the scores."""
    names = [name.strip() for name in tasks.split(",") if name.strip()]
    if not names:
        raise BadInput("--tasks: name at least one task (trainctl evals tasks lists them)")
    given = {
        "limit": limit,
        "num_fewshot": num_fewshot,
        "seed": seed,
        "batch_size": batch_size,
        "device": device,
        **queue_flags(priority, max_attempts),
    }
    spec = {**checkpoint_choice(experiment, tag), "tasks": names}
    spec |= {k: v for k, v in given.items() if v is not None}
    with client(ctx) as api:
        done = queued_or_finished(api, api.submit_evaluate(**spec), watch=watch, as_json=as_json)
    if done is None:
        return
    result = done.result or {}
    if as_json:
        print_json(result)
        return
    console.print(scores_table(result))
    c = result.get("checkpoint", {})
    err_console.print(
        f"run {done.id}: checkpoint {c.get('experiment')}/{c.get('tag')} (step {c.get('step')}), "
        f"{result.get('num_fewshot')}-shot, seed {result.get('seed')}",
        markup=False,
    )

"""`trainctl submit train|validate|benchmark|prepare|forks|run KIND`: queue a run (or a sweep of
forks), optionally watch it.

The flags mirror the request models (store/kinds/) and take their help from the field
descriptions; any other field, however nested, is reachable with `--set key.path=value`.
A `--spec` file to start from is YAML (.yaml, .yml) or JSON (any other name). Sample and
export runs have commands of their own: `trainctl sample`, `trainctl checkpoints export`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel

from trainctl.service.cli.common import build_spec, client, console, err_console, print_json
from trainctl.service.cli.errors import BadInput
from trainctl.service.cli.watch import Samples, state_text, watch_to_end
from trainctl.store.kinds.benchmark import BenchmarkRequest
from trainctl.store.kinds.prepare import PrepareRequest
from trainctl.store.kinds.train import TrainRequest
from trainctl.store.kinds.validate import ValidateRequest
from trainctl.store.specs import BatchSpec, DataSpec, ModelSpec, Request

app = typer.Typer(
    no_args_is_help=True,
    help="Queue a train, validate, benchmark or prepare run, a sweep of forks (`forks`), or a "
    "run of any kind (`run KIND`).",
)
YAML_SUFFIXES = (".yaml", ".yml")


def doc(model: type[BaseModel], field: str) -> str:
    return model.model_fields[field].description or ""


def opt(model: type[BaseModel], field: str, *names: str) -> Any:
    return typer.Option(*names, help=doc(model, field), show_default=False)


Sets = Annotated[
    list[str] | None,
    typer.Option("--set", help="Any spec field: key.path=value (JSON values), repeatable."),
]
SpecFile = Annotated[
    Path | None,
    typer.Option(
        "--spec",
        exists=True,
        dir_okay=False,
        help="A spec to start from, YAML (.yaml, .yml) or JSON; flags override it.",
    ),
]
Watch = Annotated[bool, typer.Option("--watch", "-w", help="Follow the run until it ends.")]
IdempotencyKey = Annotated[
    str | None, typer.Option(help="Retrying with the same key returns the first run.")
]
AsJson = Annotated[bool, typer.Option("--json", help="Print the run as JSON.")]
Data = Annotated[list[str] | None, opt(DataSpec, "paths", "--data")]
ValData = Annotated[list[str] | None, opt(DataSpec, "val_paths", "--val-data")]
Source = Annotated[
    str | None,
    typer.Option(help="synthetic | stdlib | text | shards | dataset; default: dataset with "
                 "--dataset, shards when every --data ends in .bin, text when --data is given "
                 "otherwise.", show_default=False),
]  # fmt: skip
DatasetRef = Annotated[str | None, opt(DataSpec, "dataset", "--dataset")]
Device = Annotated[str | None, opt(TrainRequest, "device")]
Preset = Annotated[str | None, opt(ModelSpec, "preset")]
MicroBatch = Annotated[int | None, opt(BatchSpec, "micro_batch_size")]
GradAccum = Annotated[int | None, opt(BatchSpec, "grad_accum_steps")]
SeqLen = Annotated[int | None, opt(BatchSpec, "seq_len")]
# Every kind of run has them (store.specs.Request): how it is queued, not what it does.
Priority = Annotated[int | None, opt(Request, "priority")]
MaxAttempts = Annotated[int | None, opt(Request, "max_attempts")]


def queue_flags(priority: int | None, max_attempts: int | None) -> dict[str, Any]:
    return {"priority": priority, "max_attempts": max_attempts}


def data_flags(
    source: str | None, data: list[str] | None, val: list[str] | None, dataset: str | None
) -> dict[str, Any]:
    if source is None and dataset:
        source = "dataset"
    if source is None and data:
        source = "shards" if all(p.endswith(".bin") for p in data) else "text"
    return {
        "data.source": source,
        "data.paths": data,
        "data.val_paths": val,
        "data.dataset": dataset,
    }


def submit_run(
    ctx: typer.Context,
    kind: str,
    spec: dict[str, Any],
    *,
    watch: bool,
    idempotency_key: str | None,
    as_json: bool,
    samples: bool = False,
) -> None:
    with client(ctx) as api:
        run = api.submit(kind, spec, idempotency_key)
        if as_json:  # with --watch, a stream of two documents: one line each
            print_json(run, one_line=watch)
        else:
            console.print(f"submitted {kind} run {run.id} ({state_text(run)})")
        if watch:
            watch_to_end(api, run.id, as_json=as_json, samples=samples)
        else:
            err_console.print(f"follow it: trainctl runs watch {run.id}")


def load(spec_file: Path | None) -> dict[str, Any]:
    """The spec file's mapping; a file that is not one is an error naming the file and why."""
    if spec_file is None:
        return {}
    try:
        text = spec_file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"{spec_file} is not UTF-8 text: {exc}") from exc
    if spec_file.suffix.lower() in YAML_SUFFIXES:
        spec = parse_yaml(spec_file, text)
    else:
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BadInput(f"{spec_file} is not valid JSON: {exc}") from exc
    if spec is None:
        raise BadInput(f"{spec_file} is empty")
    if not isinstance(spec, dict):
        raise BadInput(f"{spec_file}: a spec is a mapping of fields, not {type(spec).__name__}")
    try:
        json.dumps(spec)
    except (TypeError, ValueError) as exc:  # YAML reads an unquoted 2025-01-01 as a date
        raise BadInput(f"{spec_file}: {exc}; quote the value") from exc
    return spec


def parse_yaml(spec_file: Path, text: str) -> Any:
    try:
        import yaml  # PyYAML is optional: JSON specs need nothing
    except ModuleNotFoundError:
        raise BadInput(
            f"{spec_file}: reading YAML needs PyYAML (pip install pyyaml), or write JSON"
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise BadInput(f"{spec_file} is not valid YAML: {where}{problem or exc}") from exc


def node_count(value: str | None) -> int | dict[str, int] | None:
    """`--nnodes`: a count (N), or an elastic gang's range (MIN:MAX), as the request takes
    them; the request's own rules (min above max, too many) are the service's to refuse."""
    if value is None:
        return None
    low, colon, high = value.partition(":")
    try:
        return {"min": int(low), "max": int(high)} if colon else int(value)
    except ValueError:
        raise BadInput(
            f"--nnodes {value!r}: give a node count (2) or an elastic gang's range MIN:MAX (2:4)"
        ) from None


@app.command("train")
def submit_train(
    ctx: typer.Context,
    experiment: Annotated[str | None, opt(TrainRequest, "experiment", "--experiment", "-e")] = None,
    steps: Annotated[int | None, opt(TrainRequest, "steps")] = None,
    preset: Preset = None,
    device: Device = None,
    source: Source = None,
    data: Data = None,
    val_data: ValData = None,
    dataset: DatasetRef = None,
    micro_batch_size: MicroBatch = None,
    grad_accum_steps: GradAccum = None,
    seq_len: SeqLen = None,
    nproc_per_node: Annotated[int | None, opt(TrainRequest, "nproc_per_node")] = None,
    nnodes: Annotated[
        str | None,
        typer.Option(
            metavar="N|MIN:MAX",
            help=f"{doc(TrainRequest, 'nnodes')} On the command line: MIN:MAX (2:4) for an "
            "elastic gang; its grace period with --set nnodes.shrink_after_seconds=S.",
            show_default=False,
        ),
    ] = None,
    spread: Annotated[str | None, opt(TrainRequest, "spread")] = None,
    checkpoint_every: Annotated[int | None, opt(TrainRequest, "checkpoint_every")] = None,
    val_every: Annotated[int | None, opt(TrainRequest, "val_every")] = None,
    max_keep: Annotated[int | None, opt(TrainRequest, "max_keep")] = None,
    resume_from: Annotated[str | None, opt(TrainRequest, "resume_from")] = None,
    seed: Annotated[int | None, opt(TrainRequest, "seed")] = None,
    sample_every: Annotated[int | None, opt(TrainRequest, "sample_every")] = None,
    sample_prompts: Annotated[
        list[str] | None,
        typer.Option(
            "--sample-prompt", help="A text the samples continue (repeatable).", show_default=False
        ),
    ] = None,
    priority: Priority = None,
    max_attempts: MaxAttempts = None,
    sets: Sets = None,
    spec_file: SpecFile = None,
    watch: Watch = False,
    samples: Samples = False,
    idempotency_key: IdempotencyKey = None,
    as_json: AsJson = False,
) -> None:
    """Queue a train run."""
    flags = {
        "experiment": experiment,
        "steps": steps,
        "model.preset": preset,
        "device": device,
        **data_flags(source, data, val_data, dataset),
        "batch.micro_batch_size": micro_batch_size,
        "batch.grad_accum_steps": grad_accum_steps,
        "batch.seq_len": seq_len,
        "nproc_per_node": nproc_per_node,
        "nnodes": node_count(nnodes),
        "spread": spread,
        "checkpoint_every": checkpoint_every,
        "val_every": val_every,
        "max_keep": max_keep,
        "resume_from": resume_from,
        "seed": seed,
        "sample_every": sample_every,
        "sample_prompts": sample_prompts,
        **queue_flags(priority, max_attempts),
    }
    spec = build_spec(load(spec_file), flags, sets)
    submit_run(ctx, "train", spec, watch=watch, idempotency_key=idempotency_key, as_json=as_json,
               samples=samples)  # fmt: skip


@app.command("validate")
def submit_validate(
    ctx: typer.Context,
    checkpoint: Annotated[str | None, opt(ValidateRequest, "checkpoint")] = None,
    experiment: Annotated[
        str | None, opt(ValidateRequest, "experiment", "--experiment", "-e")
    ] = None,
    device: Device = None,
    source: Source = None,
    data: Data = None,
    dataset: DatasetRef = None,
    batch_size: Annotated[int | None, opt(ValidateRequest, "batch_size")] = None,
    seq_len: Annotated[int | None, opt(ValidateRequest, "seq_len")] = None,
    num_batches: Annotated[int | None, opt(ValidateRequest, "num_batches")] = None,
    priority: Priority = None,
    max_attempts: MaxAttempts = None,
    sets: Sets = None,
    spec_file: SpecFile = None,
    watch: Watch = False,
    idempotency_key: IdempotencyKey = None,
    as_json: AsJson = False,
) -> None:
    """Queue a validation of a checkpoint (latest, best, or EXPERIMENT/TAG)."""
    flags = {
        "checkpoint": checkpoint,
        "experiment": experiment,
        "device": device,
        **data_flags(source, data, None, dataset),
        "batch_size": batch_size,
        "seq_len": seq_len,
        "num_batches": num_batches,
        **queue_flags(priority, max_attempts),
    }
    spec = build_spec(load(spec_file), flags, sets)
    submit_run(ctx, "validate", spec, watch=watch, idempotency_key=idempotency_key, as_json=as_json)


@app.command("benchmark")
def submit_benchmark(
    ctx: typer.Context,
    steps: Annotated[int | None, opt(BenchmarkRequest, "steps")] = None,
    warmup_steps: Annotated[int | None, opt(BenchmarkRequest, "warmup_steps")] = None,
    preset: Preset = None,
    device: Device = None,
    micro_batch_size: MicroBatch = None,
    grad_accum_steps: GradAccum = None,
    seq_len: SeqLen = None,
    compile: Annotated[
        bool | None,
        typer.Option("--compile/--no-compile", help=doc(BenchmarkRequest, "use_compile")),
    ] = None,
    target_tokens: Annotated[int | None, opt(BenchmarkRequest, "target_tokens")] = None,
    priority: Priority = None,
    max_attempts: MaxAttempts = None,
    sets: Sets = None,
    spec_file: SpecFile = None,
    watch: Watch = False,
    idempotency_key: IdempotencyKey = None,
    as_json: AsJson = False,
) -> None:
    """Queue a throughput benchmark."""
    flags = {
        "steps": steps,
        "warmup_steps": warmup_steps,
        "model.preset": preset,
        "device": device,
        "batch.micro_batch_size": micro_batch_size,
        "batch.grad_accum_steps": grad_accum_steps,
        "batch.seq_len": seq_len,
        "use_compile": compile,
        "target_tokens": target_tokens,
        **queue_flags(priority, max_attempts),
    }
    spec = build_spec(load(spec_file), flags, sets)
    submit_run(
        ctx, "benchmark", spec, watch=watch, idempotency_key=idempotency_key, as_json=as_json
    )


@app.command("prepare")
def submit_prepare(
    ctx: typer.Context,
    inputs: Annotated[
        list[str] | None,
        typer.Argument(help=doc(PrepareRequest, "inputs"), show_default=False),
    ] = None,
    name: Annotated[str | None, opt(PrepareRequest, "name", "--name", "-n")] = None,
    tokenizer: Annotated[str | None, opt(PrepareRequest, "tokenizer")] = None,
    text_field: Annotated[str | None, opt(PrepareRequest, "text_field")] = None,
    text_column: Annotated[str | None, opt(PrepareRequest, "text_column")] = None,
    val_fraction: Annotated[float | None, opt(PrepareRequest, "val_fraction")] = None,
    shard_tokens: Annotated[int | None, opt(PrepareRequest, "shard_tokens")] = None,
    workers: Annotated[int | None, opt(PrepareRequest, "workers")] = None,
    strict: Annotated[
        bool | None, typer.Option("--strict/--lenient", help=doc(PrepareRequest, "strict"))
    ] = None,
    priority: Priority = None,
    max_attempts: MaxAttempts = None,
    sets: Sets = None,
    spec_file: SpecFile = None,
    watch: Watch = False,
    idempotency_key: IdempotencyKey = None,
    as_json: AsJson = False,
) -> None:
    """Queue a prepare on a worker: INPUTS (inside the data roots) into dataset --name."""
    flags = {
        "inputs": inputs,
        "name": name,
        "tokenizer": tokenizer,
        "text_field": text_field,
        "text_column": text_column,
        "val_fraction": val_fraction,
        "shard_tokens": shard_tokens,
        "workers": workers,
        "strict": strict,
        **queue_flags(priority, max_attempts),
    }
    spec = build_spec(load(spec_file), flags, sets)
    submit_run(ctx, "prepare", spec, watch=watch, idempotency_key=idempotency_key, as_json=as_json)


@app.command("run")
def submit_any(
    ctx: typer.Context,
    kind: Annotated[
        str,
        typer.Argument(
            help="The kind of run: one of the server's (POST /runs/<kind>), its plug-ins' too.",
            show_default=False,
        ),
    ],
    sets: Sets = None,
    spec_file: SpecFile = None,
    watch: Watch = False,
    idempotency_key: IdempotencyKey = None,
    as_json: AsJson = False,
) -> None:
    """Queue a run of any KIND from a --spec file and --set fields: the server checks it."""
    spec = build_spec(load(spec_file), {}, sets)
    submit_run(ctx, kind, spec, watch=watch, idempotency_key=idempotency_key, as_json=as_json)


@app.command("forks")
def submit_forks(
    ctx: typer.Context,
    checkpoint: Annotated[
        str,
        typer.Argument(
            help="The checkpoint every fork starts from: EXPERIMENT/TAG (step_N, best, latest).",
            show_default=False,
        ),
    ],
    spec_file: Annotated[
        Path,
        typer.Option(
            "--spec",
            exists=True,
            dir_okay=False,
            help='{"variants": [train request, ...]}, YAML or JSON: each variant a fork into '
            "an experiment of its own (its branch name), without fork_from.",
            show_default=False,
        ),
    ],
    idempotency_key: IdempotencyKey = None,
    as_json: AsJson = False,
) -> None:
    """Queue a sweep of forks of CHECKPOINT (POST /runs/forks): all of them, or none when one
    is refused (the error names its variant)."""
    spec = load(spec_file)
    variants = spec.get("variants")
    if set(spec) != {"variants"} or not isinstance(variants, list):
        raise BadInput(f'{spec_file}: a sweep is {{"variants": [...]}}, got fields {sorted(spec)}')
    with client(ctx) as api:
        runs = api.submit_forks(checkpoint, variants, idempotency_key)
        dashboard = api.base_url.rstrip("/")
    if as_json:
        print_json(runs)
        return
    for run in runs:
        console.print(f"submitted fork {run.short_id} into {run.experiment} ({state_text(run)})")
    # The dashboard's compare view on the parent and its forks, as they train.
    parent = runs[0].parent.run_id if runs[0].parent else None
    ids = ",".join(([parent] if parent else []) + [run.id for run in runs])
    err_console.print(f"compare them: {dashboard}/#/compare?runs={ids}")
    err_console.print(f"their tree: trainctl runs tree {checkpoint.partition('/')[0]}")

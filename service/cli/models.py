"""`trainctl models`: the models a request may name (docs/models.md)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from trainctl.service.cli.common import client, console, print_json
from trainctl.service.schemas import ModelsPublic


def table(models: ModelsPublic) -> Table:
    t = Table("MODEL", "KIND", "DETAILS", box=None)
    for p in models.presets:
        t.add_row(p.name, "preset", f"{p.params:,} parameters, vocab {p.vocab_size:,}, "
                  f"context {p.max_seq_len:,}")  # fmt: skip
    for plugin in models.plugins:
        t.add_row(plugin.name, "plugin", f"on {', '.join(plugin.workers)}")
    types = models.hf_model_types
    t.add_row(
        "hf", "transformers", ", ".join(types) if types is not None else "checked by the worker"
    )
    return t


def list_models(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the models a request may name: the presets, the plug-in models of the live
    workers, and the transformers model types accepted."""
    with client(ctx) as api:
        models = api.models()
    if as_json:
        print_json(models)
    else:
        console.print(table(models))


def register(app: typer.Typer) -> None:
    app.command("models")(list_models)

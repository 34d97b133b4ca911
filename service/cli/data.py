"""`trainctl data prepare`: text files → byte-level `.bin` token shards with a val split.

The work is in `cli.shards`, imported by the command: it needs numpy, which a client-only
install (`pip install trainctl`) does not have.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trainctl.service.cli.common import console, err_console, needs_extra
from trainctl.service.cli.errors import BadInput

app = typer.Typer(no_args_is_help=True, help="Prepare training data.")


@app.command("prepare")
def prepare(
    inputs: Annotated[
        list[Path], typer.Argument(help="Text files or folders.", show_default=False)
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the shards.")],
    val_fraction: Annotated[
        float, typer.Option(min=0.0, max=0.5, help="Tail fraction held out for validation.")
    ] = 0.05,
    shard_tokens: Annotated[
        int, typer.Option(min=1024, help="Tokens per shard (100M = 200 MB).")
    ] = 100_000_000,
    pattern: Annotated[str, typer.Option(help="Files to take from folders (a glob).")] = "*",
) -> None:
    """Turn text into byte-level token shards (train_*.bin, val_*.bin)."""
    with needs_extra("worker", "data prepare"):
        from trainctl.service.cli.shards import prepare_shards
        from trainctl.store.tokens import DataError
    try:
        shards = prepare_shards(inputs, out, val_fraction, shard_tokens, pattern)
    except DataError as exc:  # no such file, nothing to split: the input is the problem
        raise BadInput(str(exc)) from exc
    for s in shards:
        err_console.print(f"wrote {s.path} ({s.split}, {s.tokens:,} tokens)")
    train = sum(s.tokens for s in shards if s.split == "train")
    val = sum(s.tokens for s in shards if s.split == "val")
    where = out.resolve()  # a spec reads relative paths from the first data root, not from here
    console.print(f"{train:,} train and {val:,} val tokens in {len(shards)} shards; train on them "
                  f"with --data '{where}/train_*.bin' --val-data '{where}/val_*.bin'")  # fmt: skip

"""`trainctl data tokenizer train` and `trainctl data prepare`: corpus files (text, JSONL,
Parquet) → a tokenizer.json, and → a dataset folder (token shards, tokenizer.json,
dataset.json; docs/design/data.md, "Datasets").

The work is in `store.data.tokenizer` and `store.data.prepare`, imported by the commands: they need
numpy and tokenizers, which a client-only install (`pip install trainctl`) does not have.
Progress and the report of skipped documents go to stderr, the summary to stdout.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import Progress, TextColumn, TimeElapsedColumn

from trainctl.service.cli.common import console, err_console, fail, needs_extra
from trainctl.service.cli.errors import EXIT_INTERRUPTED, BadInput
from trainctl.service.cli.interrupts import exit_on_interrupt, stop_on_interrupt

if TYPE_CHECKING:
    from trainctl.store.data.corpus import Skipped

app = typer.Typer(no_args_is_help=True, help="Prepare training data: tokenizers and datasets.")
tokenizer_app = typer.Typer(no_args_is_help=True, help="Train a tokenizer.")
app.add_typer(tokenizer_app, name="tokenizer")

Inputs = Annotated[
    list[Path],
    typer.Argument(
        help="Files or folders: text files (a file is a document), .jsonl[.gz|.zst], .parquet.",
        show_default=False,
    ),
]
TextField = Annotated[str, typer.Option(help="The JSONL field that holds a document's text.")]
TextColumn_ = Annotated[str, typer.Option(help="The Parquet column that holds the text.")]
MaxDocumentBytes = Annotated[
    int,
    typer.Option(
        min=1024,
        help="JSONL lines and Parquet values longer than this are skipped and counted (each "
        "is held whole, at about 30 times its size); text files are read in pieces.",
    ),
]
MAX_DOCUMENT_BYTES = 16 << 20  # store.data.corpus.MAX_DOCUMENT_BYTES, without importing numpy


@tokenizer_app.command("train")
def train(
    inputs: Inputs,
    vocab_size: Annotated[
        int, typer.Option(min=257, help="Tokens at most: 256 bytes, <|endoftext|>, merges.")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for tokenizer.json.")],
    text_field: TextField = "text",
    text_column: TextColumn_ = "text",
    max_document_bytes: MaxDocumentBytes = MAX_DOCUMENT_BYTES,
) -> None:
    """Train a byte-level BPE tokenizer with an <|endoftext|> token (deterministic)."""
    with needs_extra("worker", "data tokenizer train"):
        from trainctl.store.data.tokenizer import TrainProgress, load_tokenizer, train_tokenizer

    skipped: list[Skipped] = []
    stopped = "tokenizer training stopped; nothing was written"  # tokenizer.json comes last
    with _shown_progress("tokenizer") as show, exit_on_interrupt(stopped):

        def on_progress(p: TrainProgress) -> None:
            show(f"{p.phase}: {p.documents:,} documents, {p.bytes / 1e6:,.1f} MB")
            skipped[:] = [p.skipped]

        with _as_bad_input(), needs_extra("worker", "data tokenizer train"):
            path = train_tokenizer(
                inputs, out, vocab_size, text_field=text_field, text_column=text_column,
                max_document_bytes=max_document_bytes, on_progress=on_progress,
            )  # fmt: skip
    if skipped:
        _report_skipped(skipped[0].documents, skipped[0].to_json()["examples"])
    tokenizer = load_tokenizer(path)
    console.print(
        f"wrote {path}: byte-level BPE, vocabulary {tokenizer.get_vocab_size():,} "
        f"(asked {vocab_size:,}), <|endoftext|> = {tokenizer.token_to_id('<|endoftext|>')}; "
        f"prepare with --tokenizer {path}",
        markup=False,
        soft_wrap=True,
    )


@app.command("prepare")
def prepare(
    inputs: Inputs,
    out: Annotated[Path, typer.Option("--out", "-o", help="A new or empty dataset folder.")],
    tokenizer: Annotated[
        str, typer.Option(help="A tokenizer.json (or a folder holding one), or bytes.")
    ] = "bytes",
    text_field: TextField = "text",
    text_column: TextColumn_ = "text",
    workers: Annotated[
        int | None,
        typer.Option(min=1, help="Tokenizing processes [default: every core].", show_default=False),
    ] = None,
    val_fraction: Annotated[
        float,
        typer.Option(min=0.0, max=0.5, help="Documents held out for validation (evenly spread)."),
    ] = 0.05,
    shard_tokens: Annotated[
        int, typer.Option(min=1024, help="Tokens per shard (100M = 200 MB as uint16).")
    ] = 100_000_000,
    strict: Annotated[
        bool, typer.Option("--strict", help="Stop at a bad document instead of skipping it.")
    ] = False,
    max_document_bytes: MaxDocumentBytes = MAX_DOCUMENT_BYTES,
) -> None:
    """Tokenize documents into a dataset: train_*.bin, val_*.bin, tokenizer.json, dataset.json."""
    with needs_extra("worker", "data prepare"):
        from trainctl.store.data.prepare import PrepareProgress, prepare_dataset

        if tokenizer != "bytes":
            import tokenizers  # noqa: F401 (the extra, checked before any work)

    with _shown_progress("prepare") as show, stop_on_interrupt("the prepare") as should_stop:

        def on_progress(p: PrepareProgress) -> None:
            rate = p.tokens / p.seconds if p.seconds else 0.0
            show(
                f"{p.documents:,} documents, {p.tokens:,} tokens, {rate:,.0f} tokens/s"
                + (f", {p.skipped:,} skipped" if p.skipped else "")
            )

        with _as_bad_input(), needs_extra("worker", "data prepare"):
            dataset = prepare_dataset(
                inputs, out, None if tokenizer == "bytes" else Path(tokenizer),
                text_field=text_field, text_column=text_column, val_fraction=val_fraction,
                shard_tokens=shard_tokens, workers=workers, strict=strict,
                max_document_bytes=max_document_bytes, on_progress=on_progress,
                should_stop=should_stop,
            )  # fmt: skip
    _report_skipped(dataset.skipped["documents"], dataset.skipped["examples"])
    train, val = dataset.splits["train"], dataset.splits["val"]
    kind = dataset.tokenizer.kind if dataset.tokenizer.kind == "bytes" else "BPE"
    where = dataset.folder.resolve()  # a spec reads relative paths from the first data root
    console.print(
        f"prepared {where}: {train.tokens:,} train tokens in "
        f"{_count(train.shards)}, {val.tokens:,} val tokens in {_count(val.shards)}; "
        f"{train.documents:,} + {val.documents:,} documents; vocabulary {dataset.vocab_size:,} "
        f"({kind}, {dataset.token_dtype}); {dataset.bytes_per_token:.3f} bytes per token",
        markup=False, soft_wrap=True,
    )  # fmt: skip
    console.print(f"train on it with --dataset {where}", markup=False, soft_wrap=True)


def _count(shards: list[str]) -> str:
    return f"{len(shards)} shard{'' if len(shards) == 1 else 's'}"


@contextmanager
def _shown_progress(what: str) -> Iterator[Callable[[str], None]]:
    """A live line on a terminal's stderr while it runs, `show(text)` replacing its text;
    when it is done the last text stays as a plain line, and a failure leaves only its error
    line. Elsewhere (a pipe, a log file) only that last line is written."""
    shown = ["reading"]
    started = time.monotonic()
    if not err_console.is_terminal:
        yield lambda text: shown.__setitem__(0, text)
    else:
        columns = (TextColumn("[bold]{task.description}"), TextColumn("{task.fields[text]}"),
                   TimeElapsedColumn())  # fmt: skip
        with Progress(*columns, console=err_console, transient=True) as progress:
            task = progress.add_task(what, text=shown[0], total=None)

            def show(text: str) -> None:
                shown[0] = text
                progress.update(task, text=text)

            yield show
    seconds = time.monotonic() - started
    err_console.print(f"{what}: {shown[0]} in {seconds:.1f} s", markup=False, soft_wrap=True)


@contextmanager
def _as_bad_input() -> Iterator[None]:
    """The input is the problem (no such file, a bad document with --strict, a folder that
    is not empty): exit 2, one line. A prepare stopped by Ctrl-C (`stop_on_interrupt`) has
    removed what it wrote: exit 130."""
    from trainctl.store.data.corpus import PrepareStopped
    from trainctl.store.data.shards import DataError

    try:
        yield
    except PrepareStopped as exc:
        fail(str(exc), EXIT_INTERRUPTED)
    except DataError as exc:
        raise BadInput(str(exc)) from exc


def _report_skipped(documents: int, examples: list[dict[str, Any]]) -> None:
    if not documents:
        return
    noun = "document" if documents == 1 else "documents"
    err_console.print(f"skipped {documents:,} {noun} (not in the output); the first:")
    for e in examples:
        err_console.print(f"  {e['file']}:{e['line']}: {e['reason']}", markup=False)

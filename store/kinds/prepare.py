"""The prepare run kind (docs/design/kinds.md, "Run kinds"; docs/data.md): corpus files under
the data roots tokenized into a dataset of the data dir (or of the bucket); its request, plan,
resolver and record. Its memory is bounded by its batches, so it has no memory need.

Resolution reads the inputs and the tokenizer; the modules that read them are imported where
the resolver runs, not at the top: the CLI imports this module for the request alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field, StrictBool, StrictFloat, StrictInt

from trainctl.store.exceptions import DatasetExists
from trainctl.store.kinds.base import RunKind, one_cpu
from trainctl.store.names import Name
from trainctl.store.plans import CheckpointRef
from trainctl.store.registry import Ref
from trainctl.store.specs import (
    BYTES_TOKENIZER,
    DATASET_REF_PATTERN,
    MAX_DATASET_REF_LENGTH,
    Request,
    Spec,
)
from trainctl.store.vocabulary import ACTIVE_STATES

if TYPE_CHECKING:
    from trainctl.store.data.bucket import DatasetStore
    from trainctl.store.db.runs import RunStore
    from trainctl.store.resolve import SubmitContext


MAX_FIELD_NAME_LENGTH = 256
# More tokenizing processes than this contend for memory bandwidth on any node there is.
MAX_PREPARE_WORKERS = 256


class PrepareOptions(Spec):
    """How a prepare reads its inputs and writes its shards (store.data.prepare.prepare_dataset)."""

    text_field: str = Field(
        "text",
        min_length=1,
        max_length=MAX_FIELD_NAME_LENGTH,
        description="JSONL inputs: the field that holds each document's text.",
    )
    text_column: str = Field(
        "text",
        min_length=1,
        max_length=MAX_FIELD_NAME_LENGTH,
        description="Parquet inputs: the column that holds each document's text.",
    )
    val_fraction: StrictFloat = Field(
        0.05,
        ge=0,
        le=0.5,
        description="Fraction of the documents held out for validation, spread evenly "
        "(every 20th at 0.05); 0 holds none out.",
    )
    shard_tokens: StrictInt = Field(
        100_000_000,
        ge=1024,
        le=2**31 - 1,
        description="Tokens per shard file; the last shard of a split holds the rest.",
    )
    workers: StrictInt | None = Field(
        None,
        ge=1,
        le=MAX_PREPARE_WORKERS,
        description="Tokenizing processes; default: every core the worker may use. The "
        "shards are the same bytes whatever the number.",
    )
    strict: StrictBool = Field(
        False,
        description="Stop at the first malformed line, missing field, non-UTF-8 or oversized "
        "document (the run fails, naming its file and line) instead of skipping and counting "
        "it.",
    )
    max_document_bytes: StrictInt = Field(
        16 << 20,
        ge=1024,
        le=1 << 30,
        description="JSONL lines and Parquet values longer than this many bytes are skipped "
        "and counted (dataset.json's skipped.oversized), or stop the run with strict: a "
        "document is held whole to be parsed and tokenized, at about 30 times its size. Text "
        "files have no limit: they are read in pieces.",
    )


class PrepareRequest(PrepareOptions, Request):
    name: Name = Field(
        description="The dataset's name: it is written to the data dir's datasets/<name>, and "
        "train and validate runs name it so (data.dataset). A name in use, or being prepared, "
        "is a 409."
    )
    inputs: list[str] = Field(
        min_length=1,
        max_length=256,
        description="Files, folders or globs inside the data roots (relative to the first): "
        "text files, JSONL (.jsonl, .jsonl.gz, .jsonl.zst) and Parquet (.parquet). Folders "
        "are read in name order, their hidden files skipped.",
    )
    tokenizer: str = Field(
        BYTES_TOKENIZER,
        min_length=1,
        max_length=MAX_DATASET_REF_LENGTH,
        pattern=DATASET_REF_PATTERN,
        description="'bytes' (a token is a byte), or a tokenizer.json inside the data roots "
        "(or a folder holding one; relative to the first root), as `trainctl data tokenizer "
        "train` writes it. It is copied into the dataset.",
    )


class PreparePlan(PrepareOptions):
    name: Name = Field(description="The dataset's name.")
    inputs: list[str] = Field(description="The input files, expanded and confined.")
    tokenizer: str = Field(description="'bytes', or the real path of the tokenizer.json.")
    output: str = Field(description="The dataset's folder: <data dir>/datasets/<name>.")

    @property
    def filed_under(self) -> str:
        return self.name

    @property
    def depends_on(self) -> CheckpointRef | None:
        return None


def resolve_prepare(
    request: PrepareRequest,
    *,
    data_roots: list[Path],
    datasets: DatasetStore,
) -> PreparePlan:
    """Inputs and tokenizer confined to the roots, the output a new dataset of `datasets`
    (a folder of the data dir's, or the bucket's), named by where it will be."""
    # Imported when it runs, not above: see the module's docstring.
    from trainctl.store.data.contents import check_inputs
    from trainctl.store.data.paths import confine_paths
    from trainctl.store.data.pins import tokenizer_file
    from trainctl.store.resolve import shared_options

    if datasets.exists(request.name):
        raise DatasetExists(
            f"name: {datasets.describe()} already has a {request.name!r}; choose another name"
        )
    inputs = confine_paths(request.inputs, data_roots, "inputs", skip_hidden=True)
    check_inputs(inputs, "inputs")
    return PreparePlan(
        **shared_options(request, PrepareOptions),
        name=request.name,
        inputs=[str(p) for p in inputs],
        tokenizer=tokenizer_file(request.tokenizer, data_roots),
        output=datasets.describe(request.name),
    )


def plan_prepare(request: PrepareRequest, ctx: SubmitContext) -> PreparePlan:
    plan = resolve_prepare(request, data_roots=ctx.data_roots, datasets=ctx.datasets)
    refuse_a_second_prepare(ctx.runs, plan.name)
    return plan


def refuse_a_second_prepare(runs: RunStore, name: str) -> None:
    """Two prepare runs of one name would race to publish it: the second is refused now.
    (Two submitted at the same moment may both pass; the later to finish then fails.)"""
    for state in ACTIVE_STATES:
        active, _ = runs.list_runs(kind="prepare", state=state, experiment=name, limit=1)
        if active:
            raise DatasetExists(
                f"name: dataset {name!r} is being prepared by run {active[0].id} ({state}); "
                "wait for it, or cancel it"
            )


PREPARE = RunKind(
    name="prepare",
    request=PrepareRequest,
    plan=PreparePlan,
    summary="Queue a prepare: corpus files under the data roots into a dataset of the data dir.",
    resolve=Ref(f"{__name__}:plan_prepare"),
    placement=one_cpu,
    memory=None,  # bounded by its batches
    has_steps=True,
    executor="prepare",
)

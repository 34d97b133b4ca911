"""A prepare run on a worker (docs/design/data.md, "Datasets"):
`store.data.prepare.prepare_dataset` over the plan's inputs, into a folder of its own, then
published into the dataset store (`store.data.bucket.DatasetStore.publish`).

```
<data>/datasets/
  .prepare-<name>-<run id>-<attempt>/   an attempt at work (the next attempt sweeps it)
  <name>/                               renamed into place once its dataset.json is written
```

Each attempt prepares into a folder of its own, so a retried attempt starts afresh, and a
stalled one whose lease was lost never writes into the folder of the attempt that replaced
it; the publication waits for the lease to be confirmed. A dataset `<name>` is therefore
always a finished one, and the log records its publication, so an attempt that finds it
published by its predecessor (which died just after) reports it instead of failing.

The store publishes as its storage can: on a data dir the finished folder is moved into
place by one rename; with a bucket (TRAINCTL_STORAGE_URL; the plan's output is then the
dataset's URL there) it is uploaded, the manifest last, and the staging folder goes once it
is up: nothing of a dataset in a bucket is left on the node.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from trainctl.store.checkpoints.factory import Stores
from trainctl.store.data.bucket import DatasetStore
from trainctl.store.data.datasets import Dataset, read_dataset
from trainctl.store.data.prepare import PrepareProgress, prepare_dataset
from trainctl.store.data.shards import DataError
from trainctl.store.exceptions import RunNotFound
from trainctl.store.kinds.prepare import PreparePlan
from trainctl.store.specs import BYTES_TOKENIZER
from trainctl.store.vocabulary import TERMINAL_STATES
from trainctl.worker.context import RunContext

STAGING_PREFIX = ".prepare-"
PROGRESS_EVENT_SECONDS = 5.0
"""A prepare reports twice a second; an hours-long one would fill the event log."""


def prepare(plan: PreparePlan, ctx: RunContext, stores: Stores) -> dict[str, Any]:
    """Prepare and publish the plan's dataset; its summary. Raises PrepareStopped (nothing
    of the attempt left) when the run is asked to stop."""
    datasets = stores.datasets
    if datasets.name_of(plan.output) != plan.name:
        raise DataError(
            f"dataset {plan.output} goes where this worker does not write: its datasets are "
            f"{datasets.describe()}; give the worker the service's data dir, or its "
            "TRAINCTL_STORAGE_URL"
        )
    attempts = stores.layout.datasets  # the staging folders' place, in this node's data dir
    attempts.mkdir(parents=True, exist_ok=True)
    sweep_attempts(attempts / plan.name, ctx)
    if datasets.exists(plan.name):
        if published_by(ctx, plan.output):
            ctx.log(f"dataset {plan.name} was published by an earlier attempt of this run")
            return summary(datasets.read(plan.name).dataset, plan.name, seconds=0.0)
        raise DataError(
            f"{datasets.describe()} has a {plan.name!r} that this run did not make (another "
            "prepare since this one was submitted?); prepare under another name"
        )
    staging = attempts / f"{STAGING_PREFIX}{plan.name}-{ctx.run.id}-{ctx.attempt}"
    # Made here, by mkdir, which fails on anything at its name: a link planted there (the run
    # id is no secret) would have the shards written wherever it points.
    os.mkdir(staging)
    try:
        events = prepare_into(staging, plan, ctx)
        done = replace(read_dataset(staging), location=plan.output)
        publish(staging, plan, ctx, datasets)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # a folder moved into place is gone already
    return summary(done, plan.name, seconds=events.seconds)


def prepare_into(staging: Path, plan: PreparePlan, ctx: RunContext) -> ProgressEvents:
    """The plan's dataset, written into the (empty) folder `staging`; its progress."""
    events = ProgressEvents(ctx)
    prepare_dataset(
        [Path(p) for p in plan.inputs],
        staging,
        None if plan.tokenizer == BYTES_TOKENIZER else Path(plan.tokenizer),
        text_field=plan.text_field,
        text_column=plan.text_column,
        val_fraction=plan.val_fraction,
        shard_tokens=plan.shard_tokens,
        workers=plan.workers,
        strict=plan.strict,
        max_document_bytes=plan.max_document_bytes,
        on_progress=events,
        should_stop=ctx.should_stop,
    )
    events.flush()
    return events


def publish(staging: Path, plan: PreparePlan, ctx: RunContext, datasets: DatasetStore) -> None:
    """Publish the finished folder into the store, while this attempt still owns the run."""
    ctx.confirm_lease()
    try:
        datasets.publish(staging, plan.name)
    except FileExistsError:
        raise DataError(
            f"cannot publish dataset {plan.name}: {datasets.describe()} has one of that name "
            "now, made since this run was submitted"
        ) from None
    ctx.log(f"published dataset {plan.name}", published=plan.output)


def published_by(ctx: RunContext, out: Path | str) -> bool:
    """Whether an earlier attempt of this run published `out` (its log says so)."""
    logs = ctx.runs.events(ctx.run.id, type="log", limit=10_000)
    return any(e.data.get("published") == str(out) for e in logs)


def sweep_attempts(out: Path, ctx: RunContext) -> None:
    """Remove what earlier attempts at this dataset left: this run's, and finished runs'."""
    pattern = re.compile(
        rf"{re.escape(STAGING_PREFIX + out.name)}-(?P<run>[0-9a-f]{{32}})-[0-9]+"
    )
    for folder in out.parent.iterdir():
        match = pattern.fullmatch(folder.name)
        if match is None:
            continue
        run_id = match["run"]
        if run_id != ctx.run.id:
            try:
                if ctx.runs.get(run_id).state not in TERMINAL_STATES:
                    continue  # another run's, still at work (the 409 at submit makes it rare)
            except RunNotFound:
                pass
        shutil.rmtree(folder, ignore_errors=True)
        ctx.log(f"removed {folder.name} (left by an interrupted prepare)")


class ProgressEvents:
    """`on_progress` of a prepare: a `prepare` metrics event at most every
    PROGRESS_EVENT_SECONDS, and the run's progress (documents done; their total is unknown)."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.pending: PrepareProgress | None = None
        self.sent_at = -math.inf
        self.seconds = 0.0

    def __call__(self, progress: PrepareProgress) -> None:
        self.pending, self.seconds = progress, progress.seconds
        if progress.seconds - self.sent_at >= PROGRESS_EVENT_SECONDS:
            self.flush()

    def flush(self) -> None:
        p, self.pending = self.pending, None
        if p is None:
            return
        self.sent_at = p.seconds
        self.ctx.metrics(
            {
                "kind": "prepare",
                "documents": p.documents,
                "tokens": p.tokens,
                "bytes": p.bytes,
                "skipped": p.skipped,
                "seconds": p.seconds,
                "tokens_per_sec": p.tokens / p.seconds if p.seconds > 0 else 0.0,
            }
        )
        self.ctx.progress(p.documents, None, force=True)


def summary(dataset: Dataset, name: str, seconds: float) -> dict[str, Any]:
    """A prepare run's result: what the dataset holds, and how fast it was made."""
    train, val = dataset.splits["train"], dataset.splits["val"]
    tokens = train.tokens + val.tokens
    return {
        "dataset": name,
        "folder": dataset.where,
        "tokenizer": dataset.tokenizer.kind,
        "tokenizer_sha256": dataset.tokenizer.sha256,
        "vocab_size": dataset.vocab_size,
        "token_dtype": dataset.token_dtype,
        "documents": train.documents + val.documents,
        "tokens": tokens,
        "train_tokens": train.tokens,
        "val_tokens": val.tokens,
        "bytes_per_token": dataset.bytes_per_token,
        "skipped": dataset.skipped.get("documents", 0),
        "elapsed_sec": seconds,
        "tokens_per_sec": tokens / seconds if seconds > 0 else None,
    }

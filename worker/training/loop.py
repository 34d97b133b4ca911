"""The training loop: built parts in, metrics and checkpoints out.

`build_training` assembles model, optimizers and schedule from a plan's step settings and a
sampler; a train run adds its data (`build_data`), a benchmark a synthetic sampler, so both
time the same `train_step`. `train` runs a `TrainPlan`, resuming from its pinned checkpoint.
Resume is exact: the checkpoint holds the master weights, the optimizers, the schedule, the
RNG state and the data position, and a batch is a pure function of (seed, position), so a
resumed run computes the same steps as an uninterrupted one, bit for bit on the same hardware
and thread count.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import numpy as np
import torch

from trainctl.store.checkpoints.store import CheckpointStore, Protected
from trainctl.store.data.bucket import BucketDatasets
from trainctl.store.data.datasets import bits_per_byte
from trainctl.store.data.mixtures import (
    SOURCES_KEY,
    SourcePosition,
    continue_sources,
    read_sources,
    source_tokens,
    sources_metadata,
    token_metric,
)
from trainctl.store.exceptions import CheckpointNotFound
from trainctl.store.names import BEST_TAG
from trainctl.store.plans import BatchPlan, DatasetPin, StepPlan, TrainPlan, bytes_per_token
from trainctl.store.specs import DataSpec
from trainctl.worker.checkpoints.async_save import AsyncCheckpointer, SaveAbandoned
from trainctl.worker.checkpoints.state import (
    CheckpointState,
    capture_checkpoint,
    load_checkpoint,
    rank_rng,
    restore_rng_state,
    write_checkpoint,
)
from trainctl.worker.data.datasets import build_data_record, dataset_arrays, open_dataset
from trainctl.worker.data.loader import (
    AsyncDataLoader,
    Batch,
    DataError,
    Sampler,
    SyntheticSampler,
    TokenSampler,
    expand_paths,
    read_shard,
    read_text_bytes,
    split_holdout,
    stdlib_source_files,
)
from trainctl.worker.data.mixtures import MixtureSampler, source_seed
from trainctl.worker.drain import Shutdown
from trainctl.worker.exceptions import NonFiniteLoss
from trainctl.worker.models import build_model, model_files, take_step_metrics
from trainctl.worker.models.gpt import GPT
from trainctl.worker.models.sampling import TrainingSamples
from trainctl.worker.training.optim import Optimizers, build_optimizers
from trainctl.worker.training.parallel import DataParallel, SingleProcess, rank_and_world
from trainctl.worker.training.parallelism import Ranks
from trainctl.worker.training.schedule import WSDScheduler, build_scheduler
from trainctl.worker.training.validation import compute_validation_loss

Callback = Callable[[dict[str, Any]], None]


@dataclass
class TrainParts:
    model: GPT
    optimizers: Optimizers
    scheduler: WSDScheduler
    sampler: Sampler
    val_batches: list[Batch]
    device: torch.device
    autocast_dtype: torch.dtype | None
    batch: BatchPlan
    grad_clip: float
    parallel: DataParallel = field(default_factory=SingleProcess)


@dataclass
class TrainState:
    step: int = 0
    token_count: int = 0
    best_loss: float | None = None
    data_position: int = 0
    sources: list[SourcePosition] = field(default_factory=list)
    """A mixture's datasets at `data_position`: the rest of the data position (one run of a
    mixture, "Data mixtures"); [] for one source."""
    last_loss: float | None = None
    last_val_loss: float | None = None


def build_token_arrays(
    d: DataSpec, dataset: DatasetPin | None = None, bucket: BucketDatasets | None = None
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(train arrays, validation arrays) for the real-data sources; a dataset's is pinned
    (each of a mixture's is read alone, as `dataset`), and read from the `bucket` when its
    pin is a URL there."""
    if dataset is not None:
        assert d.source in ("dataset", "mixture"), "only datasets are pinned"
        with closing(open_dataset(dataset, bucket)) as found:  # its shards stay mapped
            train, val = dataset_arrays(found)
    elif d.source == "shards":
        train = [read_shard(p) for p in expand_paths(d.paths)]
        val = [read_shard(p) for p in expand_paths(d.val_paths)]
    else:
        files = stdlib_source_files() if d.source == "stdlib" else expand_paths(d.paths)
        train = [read_text_bytes(files, d.max_bytes)]
        val = [read_text_bytes(expand_paths(d.val_paths), d.max_bytes)] if d.val_paths else []
    if not val:
        pairs = [split_holdout(a, d.val_fraction) for a in train]
        train, val = [p[0] for p in pairs], [p[1] for p in pairs]
    return train, val


def build_data(
    plan: TrainPlan, bucket: BucketDatasets | None = None
) -> tuple[Sampler, list[Batch]]:
    b, d, vocab_size = plan.batch, plan.data, plan.model.config.vocab_size
    if d.source == "synthetic":
        val = SyntheticSampler(b.micro_batch_size, b.seq_len, vocab_size, seed=d.seed + 1)
        return (
            SyntheticSampler(b.micro_batch_size, b.seq_len, vocab_size, seed=d.seed),
            [val.batch(i) for i in range(plan.val_batches)],
        )
    sampler: TokenSampler | MixtureSampler
    val_sampler: TokenSampler | MixtureSampler
    if d.source == "mixture":
        sampler, val_sampler = build_mixture(plan, bucket)
    else:
        train_arrays, val_arrays = build_token_arrays(d, plan.dataset, bucket)
        sampler = TokenSampler(train_arrays, b.micro_batch_size, b.seq_len, seed=d.seed)
        # Validation always reads the same windows, so losses are comparable across
        # evaluations.
        val_sampler = TokenSampler(val_arrays, b.micro_batch_size, b.seq_len, seed=d.seed + 1)
    if sampler.max_token() >= vocab_size:
        raise DataError(
            f"data holds token id {sampler.max_token()} but the model's vocab_size is {vocab_size}"
        )
    return sampler, [val_sampler.batch(i) for i in range(plan.val_batches)]


def build_mixture(
    plan: TrainPlan, bucket: BucketDatasets | None = None
) -> tuple[MixtureSampler, MixtureSampler]:
    """A mixture's training sampler, and its validation sampler: the same mixture, by the same
    weights, of its datasets' val splits (seed + 1), so the validation loss is the loss on
    the distribution the run trains on."""
    b, d = plan.batch, plan.data
    splits = [build_token_arrays(d, pin, bucket) for pin in plan.datasets]
    weights = d.mixture_weights()

    def mixture(split: int, seed: int) -> MixtureSampler:
        sources = [
            TokenSampler(arrays[split], 1, b.seq_len, seed=source_seed(seed, pin.folder))
            for arrays, pin in zip(splits, plan.datasets, strict=True)
        ]
        return MixtureSampler(sources, weights, b.micro_batch_size, seed)

    return mixture(0, d.seed), mixture(1, d.seed + 1)


def build_training(
    plan: StepPlan,
    sampler: Sampler,
    val_batches: list[Batch],
    *,
    total_steps: int,
    ranks: Ranks | None = None,
) -> TrainParts:
    """Model, optimizers and WSD schedule over `total_steps`, as the plan says, fed by
    `sampler`. With `ranks`, the model is this rank's share of a multi-process run (replicated
    or sharded, worker.training.parallelism) before the optimizers are built over its parameters: a
    sharded model's parameters are other tensors than the ones it was built with."""
    device = torch.device(plan.device)
    config = plan.model.config
    runtime = ranks.builder.model_runtime if ranks is not None else {}
    model = build_model(config, device=device, seed=plan.seed, **runtime)
    parallel = ranks.wrap(model, device, config) if ranks is not None else SingleProcess()
    optimizers = build_optimizers(model, plan.optimizer)
    s = plan.schedule
    scheduler = build_scheduler(
        optimizers,
        total_steps,
        s.warmup_frac,
        s.stable_frac,
        s.decay,
        s.min_lr_ratio,
        phases=s.phases(total_steps),
    )
    autocast = torch.bfloat16 if device.type == "cuda" else None
    return TrainParts(
        model,
        optimizers,
        scheduler,
        sampler,
        val_batches,
        device,
        autocast,
        plan.batch,
        plan.optimizer.grad_clip,
        parallel,
    )


def data_loader(parts: TrainParts, position: int) -> AsyncDataLoader:
    return AsyncDataLoader(parts.sampler.iterate(position), parts.device, prefetch_factor=4)


def train_step(
    parts: TrainParts,
    loader: AsyncDataLoader,
    step: int,
    before_update: Callable[[], None] | None = None,
) -> dict[str, float]:
    """One optimizer step over `grad_accum_steps` micro-batches; raises NonFiniteLoss before
    updating. `before_update` runs just before the optimizers change the weights and their
    state (a background save's copy must be complete by then).

    In a multi-GPU run each rank runs its share of the micro-batches, and the gradients and
    the loss are averaged across ranks before anything below uses them.
    """
    model, parallel = parts.model, parts.parallel
    local_accum = parts.batch.grad_accum_steps // parallel.world_size
    total = torch.zeros((), device=parts.device)
    for i in range(local_accum):
        tokens, targets = next(loader)
        with parallel.sync_gradients(last=i == local_accum - 1):
            with torch.autocast(
                parts.device.type,
                dtype=parts.autocast_dtype or torch.bfloat16,
                enabled=parts.autocast_dtype is not None,
            ):
                loss, main = parallel.loss(model, tokens, targets)
            (loss / local_accum).backward()
        total += main.detach()
    loss_value = parallel.mean(total / local_accum).item()
    # The model's own metrics of the step (an MoE's aux loss), averaged across ranks too.
    extra = {name: parallel.mean(v).item() for name, v in take_step_metrics(model).items()}
    max_norm = parts.grad_clip if parts.grad_clip > 0 else math.inf
    grad_norm = parallel.clip_grad_norm(model, max_norm)
    if not (math.isfinite(loss_value) and math.isfinite(grad_norm)):
        parts.optimizers.zero_grad(set_to_none=True)
        raise NonFiniteLoss(
            f"loss became {loss_value} (grad norm {grad_norm}) at step {step + 1}: the update "
            "was not applied and no checkpoint was written; lower the learning rate or check "
            "the data"
        )
    lrs = parts.optimizers.lr_metrics()  # the lrs this step trains with: `lr/<name>`
    if before_update is not None:
        before_update()
    # After the all-reduce: Muon orthogonalises the averaged gradient (worker/training/parallel.py).
    parts.optimizers.step()
    parts.optimizers.zero_grad(set_to_none=True)
    parts.scheduler.step()
    return {"loss": loss_value, "grad_norm": grad_norm, **extra, **lrs}


def validate(parts: TrainParts) -> dict[str, float]:
    return compute_validation_loss(
        parts.model,
        batches=parts.val_batches,
        device=parts.device,
        autocast_dtype=parts.autocast_dtype,
    )


def val_metrics(val: dict[str, float], bytes_per_token: float | None) -> dict[str, float]:
    """A validation's loss and perplexity, and its bits per byte where bytes per token is
    known: the figure that compares runs with different tokenizers."""
    metrics = {"val_loss": val["loss"], "val_ppl": val["ppl"]}
    if bytes_per_token is not None:
        metrics["val_bits_per_byte"] = bits_per_byte(val["loss"], bytes_per_token)
    return metrics


def maybe_resume(parts: TrainParts, store: CheckpointStore, plan: TrainPlan) -> TrainState:
    """Continue from the plan's resume point, or a fork's parent checkpoint: weights, both
    optimizers, RNG and data position alike. A resume continues the saved schedule; a fork
    takes its own from the fork step on (docs/design/forks.md, "Forks"). A fork's requeued
    attempt resumes from its own checkpoint (`resume_from`), so the fork path is its first."""
    fork = plan.fork_from if plan.resume_from is None else None
    ref = fork.checkpoint if fork is not None else plan.resume_from
    folders = [pin.folder for pin in plan.datasets]
    if ref is None:
        return TrainState(sources=continue_sources(None, folders))
    try:
        info = store.get(ref.experiment, ref.tag)
    except CheckpointNotFound as exc:
        raise CheckpointNotFound(f"cannot resume from {ref}: {exc}") from exc
    own_schedule = parts.scheduler.state_dict() if fork is not None else None
    meta = load_checkpoint(
        parts.model,
        parts.optimizers,
        parts.scheduler,
        store.entry(info.experiment, info.tag),
        device=parts.device,
        access=parts.parallel,
    )
    if own_schedule is not None:  # the fork's curve, at the parent's step
        parts.scheduler.load_state_dict({**own_schedule, "last_epoch": int(meta["step"])})
    restore_rng_state(rank_rng(meta, rank_and_world()[0]))
    return TrainState(
        step=int(meta["step"]),
        token_count=int(meta["token_count"]),
        best_loss=meta.get("best_loss"),
        data_position=int(meta["data_position"]),
        sources=continue_sources(read_sources(meta), folders),
    )


@dataclass
class Interval:
    """The steps since the last metrics event: its timings are their mean."""

    steps: int = 0
    seconds: float = 0.0
    wait_seconds: float = 0.0

    def add(self, seconds: float, wait_seconds: float) -> None:
        self.steps, self.seconds = self.steps + 1, self.seconds + seconds
        self.wait_seconds += wait_seconds

    def report(self, tokens_per_step: int) -> dict[str, float]:
        return {
            "tokens_per_sec": tokens_per_step * self.steps / self.seconds,
            "step_time_sec": self.seconds / self.steps,
            "data_wait_sec": self.wait_seconds / self.steps,
            "data_wait_frac": self.wait_seconds / self.seconds,
        }


class BackgroundSaves(Protocol):
    """Saves in flight (`AsyncCheckpointer`, `AsyncShardedCheckpointer`): the saves committed
    since the last call, each the info it was given with its `path` and `save_seconds`."""

    def poll(self) -> list[dict[str, Any]]: ...
    def wait(self) -> list[dict[str, Any]]: ...


class Trainer:
    """Runs a TrainPlan; callbacks report metrics and checkpoints as they happen."""

    def __init__(
        self,
        plan: TrainPlan,
        store: CheckpointStore,
        *,
        run_id: str | None = None,
        on_metrics: Callback | None = None,
        on_checkpoint: Callback | None = None,
        on_progress: Callable[[int, int], None] | None = None,
        on_sample: Callback | None = None,
        should_stop: Callable[[], bool] | None = None,
        protected: Callable[[], Protected] | None = None,
        before_commit: Callable[[], None] | None = None,
        after_commit: Callable[[str, int], None] | None = None,
        ranks: Ranks | None = None,
        datasets: BucketDatasets | None = None,
        drain: Shutdown | None = None,
    ) -> None:
        self.plan, self.run_id = plan, run_id
        # Set by SIGTERM or a drain request: the stop's save takes the async path and gets
        # until its deadline to commit (worker.drain).
        self.drain = drain
        self.drained: dict[str, Any] = {}
        self.before_commit = before_commit
        # (tag, step) of a checkpoint just committed, before the retention that follows it,
        # in the thread that wrote it (worker.side_evals queues its evaluate run there).
        self.after_commit = after_commit
        self.store = store
        self.on_metrics = on_metrics or (lambda m: None)
        self.on_checkpoint = on_checkpoint or (lambda m: None)
        # Every step, unlike metrics: the receiver throttles by time (RunContext.progress).
        self.on_progress = on_progress or (lambda step, total: None)
        self.on_sample = on_sample or (lambda m: None)
        self.should_stop = should_stop or (lambda: False)
        self.protected = protected or (lambda: frozenset())
        data = build_data(plan, datasets)
        self.parts = build_training(plan, *data, total_steps=plan.steps, ranks=ranks)
        self.data_record = build_data_record(plan.data, plan.dataset, plan.datasets, datasets)
        self.bytes_per_token = bytes_per_token(plan.data, plan.dataset, plan.datasets)
        self.state = maybe_resume(self.parts, self.store, plan)
        self.mixture = (
            self.parts.sampler if isinstance(self.parts.sampler, MixtureSampler) else None
        )
        if self.mixture is not None:
            self.mixture.start_at(
                self.state.data_position, [x.sequences for x in self.state.sources]
            )
        self.checkpointer: BackgroundSaves | None = None
        self.async_checkpointer = AsyncCheckpointer() if plan.async_checkpoint else None
        self.checkpointer = self.async_checkpointer
        self.before_update: Callable[[], None] | None = None  # see train_step
        every = plan.sample_every
        self.samples = TrainingSamples(plan, every, datasets) if every is not None else None

    def save(self, tag: str | None = None) -> None:
        self.write(self.capture(tag))

    def capture(self, tag: str | None = None) -> CheckpointState:
        """The state to save at this step (a sharded run's ranks gather it together)."""
        dtype = torch.bfloat16 if self.plan.save_dtype == "bfloat16" else None
        return capture_checkpoint(
            **self.checkpoint_fields(tag), dtype=dtype, access=self.parts.parallel
        )

    def checkpoint_fields(self, tag: str | None) -> dict[str, Any]:
        """What a checkpoint at this step holds, whatever its layout (`capture_checkpoint`,
        `worker.checkpoints.sharded.capture_sharded`)."""
        p, s = self.parts, self.state
        return {
            "model": p.model,
            "optimizers": p.optimizers,
            "scheduler": p.scheduler,
            "step": s.step,
            "token_count": s.token_count,
            "best_loss": s.best_loss,
            "experiment": self.plan.experiment,
            "tag": tag,
            "data_position": s.data_position,
            "run_id": self.run_id,
            "extra": self.data_record.metadata
            | ({SOURCES_KEY: sources_metadata(s.sources)} if s.sources else {}),
            "files": {**self.data_record.files, **model_files(p.model)},
        }

    def saved_info(self, tag: str) -> dict[str, Any]:
        """What the checkpoint callback hears of a save at this step (its `path` and
        `save_seconds` are added once it is committed)."""
        return {"experiment": self.plan.experiment, "tag": tag, "step": self.state.step}

    def draining(self) -> bool:
        return self.drain is not None and self.drain.is_set()

    def gate_and_confirm(self) -> None:
        """What a write runs just before its commit: a drain that gave up on the save refuses
        it (worker.checkpoints.async_save), then `before_commit` (the lease check)."""
        AsyncCheckpointer.commit_gate()
        if self.before_commit is not None:
            self.before_commit()

    def write(self, state: CheckpointState) -> None:
        """Write and commit a captured state, here or in the background; report it."""
        info = self.saved_info(state.tag)
        if self.async_checkpointer is None and self.draining():
            # The fastest path a stopping run has: stage to host memory now, let the ranks
            # stop, and write until the drain's deadline (finish_saves).
            self.async_checkpointer = AsyncCheckpointer()
            self.checkpointer = self.checkpointer or self.async_checkpointer

        def write(state: CheckpointState) -> str:
            # `protected` is asked under the store's guard, after the commit: a run queued
            # meanwhile that depends on an older checkpoint keeps it.
            store, protected, started = self.store, self.protected, time.perf_counter()
            where = write_checkpoint(
                state, store, self.plan.max_keep, protected, self.gate_and_confirm,
                self.committed(info),
            )  # fmt: skip
            info["save_seconds"] = time.perf_counter() - started  # reported with the commit
            return where

        if self.async_checkpointer is None:
            where = write(state)  # before `info` is read: the write adds its save_seconds
            self.on_checkpoint({**info, "path": where})
            return
        # Asynchronous: the loop goes on once the state is copied; the commit is reported
        # when it has happened (maybe_report_saves, finish_saves).
        assert self.async_checkpointer is not None  # a full checkpoint's saver
        for done in self.async_checkpointer.save(state, write, info):
            self.on_checkpoint(done)

    def committed(self, info: dict[str, Any]) -> Callable[[], None] | None:
        """`after_commit` of the save `info` describes, for the checkpoint writer."""
        after = self.after_commit
        return None if after is None else partial(after, info["tag"], info["step"])

    def maybe_report_saves(self) -> None:
        for done in self.checkpointer.poll() if self.checkpointer else []:
            self.on_checkpoint(done)

    def finish_saves(self, failing: BaseException | None = None) -> None:
        """Wait for the save in flight: a run that ends or stops leaves its checkpoint."""
        if self.checkpointer is None:
            return
        try:
            for done in self.wait_saves():
                self.drained["committed_at"] = done.get("committed_at")
                self.on_checkpoint(done)
        except SaveAbandoned as exc:  # the run hands back from the checkpoint before it
            self.drained["abandoned"] = str(exc)
        except Exception as exc:
            if failing is None:
                raise
            failing.add_note(f"and the checkpoint being saved in the background failed: {exc}")

    def wait_saves(self) -> list[dict[str, Any]]:
        """The saves in flight, committed: a draining run's only until its deadline."""
        assert self.checkpointer is not None
        if self.drain is not None and self.draining() and self.async_checkpointer is not None:
            return self.async_checkpointer.wait(until=self.drain.deadline)
        return self.checkpointer.wait()

    def drain_report(self, stopped_at: float) -> dict[str, Any]:
        """How the drain's save went, in seconds from the signal: to the step boundary it
        stopped at, to the ranks stopped (the state staged), and to the commit (None:
        abandoned at the deadline)."""
        assert self.drain is not None and self.drain.since is not None
        since, committed = self.drain.since, self.drained.get("committed_at")
        return {
            "deadline_seconds": self.drain.seconds,
            "step_boundary_seconds": self.drained["seen_at"] - since,
            "stopped_seconds": stopped_at - since,
            "committed_seconds": None if committed is None else committed - since,
            "abandoned": self.drained.get("abandoned"),
        }

    def maybe_validate(self, final: bool) -> bool:
        """Validate when due and report it; True when the loss is the best so far."""
        if not (final or self.state.step % self.plan.val_every == 0):
            return False
        val = validate(self.parts)
        self.state.last_val_loss = val["loss"]
        improved = self.state.best_loss is None or val["loss"] < self.state.best_loss
        if improved:
            self.state.best_loss = val["loss"]
        self.on_metrics(
            {
                "kind": "val",
                "step": self.state.step,
                **val_metrics(val, self.bytes_per_token),
                "best_loss": self.state.best_loss,
            }
        )
        return improved

    def maybe_sample(self, final: bool) -> None:
        if self.samples is not None and self.samples.due(self.state.step, final):
            for sample in self.samples.take(self.parts.model, self.state.step):
                self.on_sample(sample)

    def advance_sources(self) -> None:
        """A mixture's datasets at the new data position, each with the tokens it gave."""
        if self.mixture is None:
            return
        s, seq_len = self.state, self.plan.batch.seq_len
        at = self.mixture.sequences_at(s.data_position)
        s.sources = [
            SourcePosition(x.folder, int(k), x.tokens + (int(k) - x.sequences) * seq_len)
            for x, k in zip(s.sources, at, strict=True)
        ]

    def should_checkpoint(self, final: bool) -> bool:
        return final or self.state.step % self.plan.checkpoint_every == 0

    def should_log(self, final: bool) -> bool:
        return final or self.state.step % self.plan.log_every == 0

    def report(self, metrics: dict[str, float], interval: Interval) -> None:
        s = self.state
        self.on_metrics(
            {
                "kind": "train",
                "step": s.step,
                "total_steps": self.plan.steps,
                **metrics,
                "tokens": s.token_count,
                **{token_metric(x.name): x.tokens for x in s.sources},
                **interval.report(self.plan.batch.tokens_per_step),
            }
        )

    def run(self) -> dict[str, Any]:
        plan, s = self.plan, self.state
        tokens_per_step = plan.batch.tokens_per_step
        started, wait_total, stopped, saved_at = time.perf_counter(), 0.0, False, -1
        interval = Interval()
        loader = data_loader(self.parts, s.data_position)
        try:
            while s.step < plan.steps:
                t0, w0 = time.perf_counter(), loader.wait_seconds
                metrics = train_step(self.parts, loader, s.step, self.before_update)
                s.step += 1
                s.data_position += plan.batch.grad_accum_steps
                s.token_count += tokens_per_step
                self.advance_sources()
                s.last_loss = metrics["loss"]
                wait = loader.wait_seconds - w0
                interval.add(time.perf_counter() - t0, wait)
                wait_total += wait
                self.on_progress(s.step, plan.steps)
                final = s.step == plan.steps
                logged = self.should_log(final)
                if logged:
                    self.report(metrics, interval)
                    interval = Interval()
                stopped = not final and self.should_stop()
                if stopped:
                    self.drained["seen_at"] = time.monotonic()  # the step boundary it stops at
                if stopped and not logged:
                    self.report(metrics, interval)  # the last step is always written
                if self.maybe_validate(final):
                    self.save(BEST_TAG)
                self.maybe_sample(final)
                if self.should_checkpoint(final) or stopped:
                    self.save()
                    saved_at = s.step
                if stopped:
                    break
                self.maybe_report_saves()
        except BaseException as exc:
            self.finish_saves(failing=exc)
            raise
        finally:
            loader.close()
        stopped_at = time.monotonic()  # the ranks stop here; the save may still be writing
        self.finish_saves()
        if saved_at != s.step and s.step > 0 and self.store.latest_or_none(plan.experiment) is None:
            self.save()  # a resumed run that had nothing left to do still leaves its checkpoint
        elapsed = time.perf_counter() - started
        result: dict[str, Any] = {
            "step": s.step,
            "total_steps": plan.steps,
            "stopped": stopped,
            "final_loss": s.last_loss,
            "final_val_loss": s.last_val_loss,
            "best_loss": s.best_loss,
            "token_count": s.token_count,
            "elapsed_sec": elapsed,
            "data_wait_frac": wait_total / elapsed if elapsed > 0 else 0.0,
        }
        if s.sources:
            result["source_tokens"] = source_tokens(s.sources)
        if stopped and self.draining():
            result["drain"] = self.drain_report(stopped_at)
        if s.last_val_loss is not None and self.bytes_per_token is not None:
            result["final_val_bits_per_byte"] = bits_per_byte(s.last_val_loss, self.bytes_per_token)
        return result


def train(plan: TrainPlan, store: CheckpointStore, **kwargs: Any) -> dict[str, Any]:
    return Trainer(plan, store, **kwargs).run()

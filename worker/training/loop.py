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
from dataclasses import dataclass, field, fields
from functools import partial
from typing import Any

import numpy as np
import torch

from trainctl.store.checkpoints.info import CheckpointInfo
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.data.bucket import DatasetStore
from trainctl.store.data.datasets import TOKENIZER_FILE, bits_per_byte
from trainctl.store.data.mixtures import (
    SourcePosition,
    continue_sources,
    source_tokens,
    token_metric,
)
from trainctl.store.exceptions import CheckpointNotFound
from trainctl.store.kinds.train import TrainPlan
from trainctl.store.names import BEST_TAG, step_tag
from trainctl.store.plans import BatchPlan, DatasetPin, StepPlan, bytes_per_token
from trainctl.store.specs import DataSpec
from trainctl.worker.checkpoints.async_save import SaveAbandoned
from trainctl.worker.checkpoints.saves import FullSaves
from trainctl.worker.checkpoints.state import (
    load_checkpoint,
)
from trainctl.worker.checkpoints.training_state import (
    Progress,
    TrainingState,
    rank_rng,
    restore_rng_state,
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
from trainctl.worker.exceptions import LossSpikes, NonFiniteLoss, RunStopped
from trainctl.worker.models import build_model, model_files, take_step_metrics
from trainctl.worker.models.gpt import GPT
from trainctl.worker.models.sampling import TrainingSamples
from trainctl.worker.stops import maybe_stop
from trainctl.worker.training.hangs import RankWatches
from trainctl.worker.training.health import (
    Intervention,
    LossHealth,
    agreed_step,
    drop_checkpoints_after,
    lower_lrs,
    maybe_faulty,
    maybe_plant_nan,
    rewind_target,
)
from trainctl.worker.training.hooks import TrainerHooks
from trainctl.worker.training.optim import Optimizers, build_optimizers
from trainctl.worker.training.parallel import DataParallel, SingleProcess, rank_and_world
from trainctl.worker.training.parallelism import Ranks
from trainctl.worker.training.schedule import WSDScheduler, build_scheduler
from trainctl.worker.training.validation import compute_validation_loss


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


def build_token_arrays(
    d: DataSpec, dataset: DatasetPin | None = None, datasets: DatasetStore | None = None
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(train arrays, validation arrays) for the real-data sources; a dataset's is pinned
    (each of a mixture's is read alone, as `dataset`), and read through `datasets`."""
    if dataset is not None:
        assert d.source in ("dataset", "mixture"), "only datasets are pinned"
        with closing(open_dataset(dataset, datasets)) as found:  # its shards stay mapped
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
    plan: TrainPlan, datasets: DatasetStore | None = None
) -> tuple[Sampler, list[Batch]]:
    b, d, vocab_size = plan.batch, plan.data, plan.model.config.vocab_size
    if d.source == "synthetic":
        val = SyntheticSampler(b.micro_batch_size, b.seq_len, vocab_size, seed=d.seed + 1)
        return (
            SyntheticSampler(b.micro_batch_size, b.seq_len, vocab_size, seed=d.seed),
            val_batches(val, plan.val_batches),
        )
    sampler: TokenSampler | MixtureSampler
    val_sampler: TokenSampler | MixtureSampler
    if d.source == "mixture":
        sampler, val_sampler = build_mixture(plan, datasets)
    else:
        train_arrays, val_arrays = build_token_arrays(d, plan.dataset, datasets)
        sampler = TokenSampler(train_arrays, b.micro_batch_size, b.seq_len, seed=d.seed)
        # Validation always reads the same windows, so losses are comparable across
        # evaluations.
        val_sampler = TokenSampler(val_arrays, b.micro_batch_size, b.seq_len, seed=d.seed + 1)
    if sampler.max_token() >= vocab_size:
        raise DataError(
            f"data holds token id {sampler.max_token()} but the model's vocab_size is {vocab_size}"
        )
    return sampler, val_batches(val_sampler, plan.val_batches)


def val_batches(sampler: Sampler, n: int) -> list[Batch]:
    """The validation's `n` batches, made once (up to 10,000: a cancel stops the making)."""
    batches = []
    for i in range(n):
        maybe_stop()
        batches.append(sampler.batch(i))
    return batches


def build_mixture(
    plan: TrainPlan, datasets: DatasetStore | None = None
) -> tuple[MixtureSampler, MixtureSampler]:
    """A mixture's training sampler, and its validation sampler: the same mixture, by the same
    weights, of its datasets' val splits (seed + 1), so the validation loss is the loss on
    the distribution the run trains on."""
    b, d = plan.batch, plan.data
    splits = [build_token_arrays(d, pin, datasets) for pin in plan.datasets]
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


Judge = Callable[[float, float, bool], Intervention | None]
"""(loss, grad norm, finite on every rank): a step's verdict before its update (the run's
`LossHealth.judge`); None applies it."""


def train_step(
    parts: TrainParts,
    loader: AsyncDataLoader,
    step: int,
    before_update: Callable[[], None] | None = None,
    judge: Judge | None = None,
    before_sync: Callable[[], None] | None = None,
) -> dict[str, float]:
    """One optimizer step over `grad_accum_steps` micro-batches. `before_update` runs just
    before the optimizers change the weights and their state (a background save's copy must
    be complete by then). `judge` decides whether the update is applied (worker.training.health);
    without one a non-finite step raises NonFiniteLoss before updating. `before_sync` runs just
    before the last backward, where a multi-process run starts averaging the gradients (the end
    of a rank's own work: worker.training.hangs.OwnClock).

    In a multi-GPU run each rank runs its share of the micro-batches, and the gradients and
    the loss are averaged across ranks before anything below uses them.
    """
    model, parallel = parts.model, parts.parallel
    local_accum = parts.batch.grad_accum_steps // parallel.world_size
    total = torch.zeros((), device=parts.device)
    for i in range(local_accum):
        tokens, targets = next(loader)
        last = i == local_accum - 1
        with parallel.sync_gradients(last=last):
            with torch.autocast(
                parts.device.type,
                dtype=parts.autocast_dtype or torch.bfloat16,
                enabled=parts.autocast_dtype is not None,
            ):
                loss, main = parallel.loss(model, tokens, targets)
            if last and before_sync is not None:
                before_sync()
            (loss / local_accum).backward()
        total += main.detach()
    maybe_plant_nan(model, rank_and_world()[0], step + 1)
    max_norm = parts.grad_clip if parts.grad_clip > 0 else math.inf
    norm = parallel.clip_grad_norm(model, max_norm).float()
    # One all-reduce carries the loss, whether this rank's norm is finite and the model's own
    # metrics of the step (an MoE's aux loss): every rank reads the same numbers, so every
    # rank applies or skips the step alike (a NaN in one rank's gradient after DDP's average
    # reaches no other rank's norm). The .tolist() is the step's one host-device sync: the
    # verdict on the update needs it before the optimizers run (docs/performance.md, "Host
    # syncs"); the norm comes with it, this rank's own (DDP averaged the gradients first, so
    # every rank's is the same unless one is not finite).
    extras = take_step_metrics(model)
    shared = [total / local_accum, (~torch.isfinite(norm)).float(), *extras.values()]
    agreed = parallel.mean(torch.stack([v.detach().float() for v in shared]))
    loss_value, bad_ranks, *extra_values, grad_norm = torch.cat([agreed, norm[None]]).tolist()
    extra = dict(zip(extras, extra_values, strict=True))
    finite = math.isfinite(loss_value) and bad_ranks == 0
    verdict = judge(loss_value, grad_norm, finite) if judge is not None else None
    if judge is None and not finite:
        parts.optimizers.zero_grad(set_to_none=True)
        raise NonFiniteLoss(
            f"loss became {loss_value} (grad norm {grad_norm}) at step {step + 1}: the update "
            "was not applied and no checkpoint was written; lower the learning rate or check "
            "the data"
        )
    lrs = parts.optimizers.lr_metrics()  # the lrs this step trains with: `lr/<name>`
    metrics = {"loss": loss_value, "grad_norm": grad_norm, **extra, **lrs}
    if verdict is not None and verdict.skips_update:
        # A skipped step counts, without its update: the schedule moves on, so the lr stays
        # a function of the step. A rewind's step does not count (nor a failing one's).
        parts.optimizers.zero_grad(set_to_none=True)
        if verdict.action == "skip":
            parts.scheduler.step()
        return metrics
    if before_update is not None:
        before_update()
    # After the all-reduce: Muon orthogonalises the averaged gradient (worker/training/parallel.py).
    parts.optimizers.step()
    parts.optimizers.zero_grad(set_to_none=True)
    parts.scheduler.step()
    return metrics


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


def maybe_resume(parts: TrainParts, store: CheckpointStore, plan: TrainPlan) -> Progress:
    """Continue from the plan's resume point, or a fork's parent checkpoint: weights, both
    optimizers, RNG and data position alike. A resume continues the saved schedule; a fork
    takes its own from the fork step on (docs/design/forks.md, "Forks"). A fork's requeued
    attempt resumes from its own checkpoint (`resume_from`), so the fork path is its first."""
    fork = plan.fork_from if plan.resume_from is None else None
    ref = fork.checkpoint if fork is not None else plan.resume_from
    folders = [pin.folder for pin in plan.datasets]
    if ref is None:
        return Progress(sources=continue_sources(None, folders))
    try:
        info = store.get(ref.experiment, ref.tag)
    except CheckpointNotFound as exc:
        raise CheckpointNotFound(f"cannot resume from {ref}: {exc}") from exc
    own_schedule = parts.scheduler.state_dict() if fork is not None else None
    progress = load_training(parts, store, info, folders)
    if own_schedule is not None:  # the fork's curve, at the parent's step
        parts.scheduler.load_state_dict({**own_schedule, "last_epoch": progress.step})
    return progress


def load_training(
    parts: TrainParts, store: CheckpointStore, info: CheckpointInfo, folders: list[str]
) -> Progress:
    """Load checkpoint `info` into `parts` (weights, optimizers, schedule) and this rank's RNG;
    the progress it records, a mixture of `folders` continuing from it. A resume's, and a
    rewind's (worker.training.health)."""
    meta = load_checkpoint(
        parts.model,
        parts.optimizers,
        parts.scheduler,
        store.entry(info.experiment, info.tag),
        device=parts.device,
        access=parts.parallel,
    )
    restore_rng_state(rank_rng(meta, rank_and_world()[0]))
    return Progress.saved_in(meta, folders)


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


class Trainer:
    """Runs a TrainPlan; its hooks report metrics and checkpoints as they happen, and say
    when to stop (`TrainerHooks`)."""

    def __init__(
        self,
        plan: TrainPlan,
        store: CheckpointStore,
        *,
        hooks: TrainerHooks | None = None,
        run_id: str | None = None,
        ranks: Ranks | None = None,
        datasets: DatasetStore | None = None,
        watches: RankWatches | None = None,
    ) -> None:
        self.plan, self.run_id = plan, run_id
        self.hooks = hooks or TrainerHooks()
        self.watches = watches or RankWatches()
        self.drained: dict[str, Any] = {}
        self.store = store
        sampler, val = build_data(plan, datasets)
        sampler = maybe_faulty(sampler, plan.model.config.vocab_size)  # tests' faults only
        self.parts = build_training(plan, sampler, val, total_steps=plan.steps, ranks=ranks)
        self.data_record = build_data_record(plan.data, plan.dataset, plan.datasets, datasets)
        self.bytes_per_token = bytes_per_token(plan.data, plan.dataset, plan.datasets)
        self.progress = maybe_resume(self.parts, self.store, plan)
        self.health = LossHealth(plan.health)
        self.health.load_state_dict(self.progress.health)
        # The last losses, for the result: never saved (a resumed run has none until it
        # trains a step).
        self.last_loss: float | None = None
        self.last_val_loss: float | None = None
        self.mixture = (
            self.parts.sampler if isinstance(self.parts.sampler, MixtureSampler) else None
        )
        if self.mixture is not None:
            self.mixture.start_at(
                self.progress.data_position, [x.sequences for x in self.progress.sources]
            )
        # How its checkpoints are captured and written: its strategy's layout, built on every
        # rank at once (worker.checkpoints.saves); one process writes whole ones.
        build_saves = ranks.saves if ranks is not None else FullSaves
        self.saves = build_saves(plan, store, self.hooks, self.parts.parallel)
        every = plan.sample_every
        tokenizer_json = self.data_record.files.get(TOKENIZER_FILE)
        self.samples = TrainingSamples(plan, every, tokenizer_json) if every is not None else None

    def save(self, tag: str | None = None) -> None:
        """Save a checkpoint at this step (every rank, at the same step); report the saves
        committed since the last report."""
        self.progress.health = self.health.state_dict()
        for done in self.saves.save(self.training_state(), tag):
            self.hooks.on_checkpoint(done)

    def training_state(self) -> TrainingState:
        """What a checkpoint at this step is taken from, whatever its layout."""
        p = self.parts
        return TrainingState(
            p.model,
            p.optimizers,
            p.scheduler,
            self.plan.experiment,
            self.progress,
            self.run_id,
            extra=self.data_record.metadata,
            files={**self.data_record.files, **model_files(p.model)},
        )

    def maybe_report_saves(self) -> None:
        for done in self.saves.poll():
            self.hooks.on_checkpoint(done)

    def finish_saves(self, failing: BaseException | None = None) -> None:
        """Wait for the save in flight: a run that ends or stops leaves its checkpoint; a
        draining one waits only until its deadline."""
        drain = self.hooks.drain
        until = drain.deadline if drain is not None and self.hooks.draining() else None
        try:
            for done in self.saves.wait(until):
                self.drained["committed_at"] = done.get("committed_at")
                self.hooks.on_checkpoint(done)
        except SaveAbandoned as exc:  # the run hands back from the checkpoint before it
            self.drained["abandoned"] = str(exc)
        except Exception as exc:
            if failing is None:
                raise
            failing.add_note(f"and the checkpoint being saved in the background failed: {exc}")

    def drain_report(self, stopped_at: float) -> dict[str, Any]:
        """How the drain's save went, in seconds from the signal: to the step boundary it
        stopped at, to the ranks stopped (the state staged), and to the commit (None:
        abandoned at the deadline)."""
        assert self.hooks.drain is not None and self.hooks.drain.since is not None
        since, committed = self.hooks.drain.since, self.drained.get("committed_at")
        return {
            "deadline_seconds": self.hooks.drain.seconds,
            "step_boundary_seconds": self.drained["seen_at"] - since,
            "stopped_seconds": stopped_at - since,
            "committed_seconds": None if committed is None else committed - since,
            "abandoned": self.drained.get("abandoned"),
        }

    def maybe_validate(self, final: bool) -> bool:
        """Validate when due and report it; True when the loss is the best so far."""
        if not (final or self.progress.step % self.plan.val_every == 0):
            return False
        val = validate(self.parts)
        self.last_val_loss = val["loss"]
        improved = self.progress.best_loss is None or val["loss"] < self.progress.best_loss
        if improved:
            self.progress.best_loss = val["loss"]
        self.hooks.on_metrics(
            {
                "kind": "val",
                "step": self.progress.step,
                **val_metrics(val, self.bytes_per_token),
                "best_loss": self.progress.best_loss,
            }
        )
        return improved

    def maybe_sample(self, final: bool) -> None:
        if self.samples is not None and self.samples.due(self.progress.step, final):
            for sample in self.samples.take(self.parts.model, self.progress.step):
                self.hooks.on_sample(sample)

    def advance_sources(self) -> None:
        """A mixture's datasets at the new data position, each with the tokens it gave."""
        if self.mixture is None:
            return
        s, seq_len = self.progress, self.plan.batch.seq_len
        at = self.mixture.sequences_at(s.data_position)
        s.sources = [
            SourcePosition(x.folder, int(k), x.tokens + (int(k) - x.sequences) * seq_len)
            for x, k in zip(s.sources, at, strict=True)
        ]

    def should_checkpoint(self, final: bool) -> bool:
        return final or self.progress.step % self.plan.checkpoint_every == 0

    def should_log(self, final: bool) -> bool:
        return final or self.progress.step % self.plan.log_every == 0

    def report(self, metrics: dict[str, float], interval: Interval) -> None:
        s = self.progress
        self.hooks.on_metrics(
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

    # --- loss health (worker.training.health) ---

    def judge_step(self) -> Judge:
        """The verdict on the step about to run, before its update; its lr lowered first
        while a rewind asks for it."""
        s, accum = self.progress, self.plan.batch.grad_accum_steps
        factor = self.health.lr_factor(s.step + 1)
        if factor < 1:
            lower_lrs(self.parts.optimizers, factor)
        window = (s.data_position, s.data_position + accum)
        return partial(self.health.judge, s.step + 1, window=window)

    def maybe_skip_window(self, loader: AsyncDataLoader) -> AsyncDataLoader:
        """At the start of a window a rewind skipped, jump past it (a batch is a pure function
        of its position, so the loader restarts there)."""
        s = self.progress
        end = s.skipped_windows.get(s.data_position)
        if end is None:
            return loader
        loader.close()
        s.data_position = end
        self.advance_sources()  # a mixture's datasets move past the window's sequences
        return data_loader(self.parts, end)

    def intervene(self, i: Intervention, loader: AsyncDataLoader) -> AsyncDataLoader:
        """Report intervention `i` and carry it out; the loader to go on with."""
        if i.action == "rewind":
            return self.rewind(i, loader)
        self.hooks.on_health(i.record() | {"message": i.message()})
        if i.action == "fail":
            exc = NonFiniteLoss if i.reason == "nonfinite" else LossSpikes
            raise exc(self.health.failure(i))
        return loader

    def rewind(self, spike: Intervention, loader: AsyncDataLoader) -> AsyncDataLoader:
        """Reload the newest checkpoint of the run at least `min_steps_back` steps before the
        spike (none: stay, the update was not applied), skip the spike's data window from
        now on, and save where the run stands, so that any resume skips the window too."""
        loader.close()
        self.finish_saves()  # what is in flight commits before the checkpoints are listed
        s, start, end = self.progress, *spike.window
        limit = spike.step - self.plan.health.rewind.min_steps_back
        target = agreed_step(rewind_target(self.store, self.plan, self.run_id, limit),
                             self.parts.device)  # fmt: skip
        skipped = {**s.skipped_windows, start: end}
        if target >= 0:
            info = self.store.get(self.plan.experiment, step_tag(target))
            folders = [pin.folder for pin in self.plan.datasets]
            loaded = load_training(self.parts, self.store, info, folders)
            for f in fields(Progress):
                setattr(s, f.name, getattr(loaded, f.name))
            self.health.load_state_dict(loaded.health, detector_only=True)
            if self.mixture is not None:
                self.mixture.start_at(s.data_position, [x.sequences for x in s.sources])
            if rank_and_world()[0] == 0:  # rank 0 commits the checkpoints; it deletes them
                protected = self.hooks.protected()
                drop_checkpoints_after(self.store, self.plan, self.run_id, target, protected)
        s.skipped_windows = skipped
        done = self.health.rewound(spike, s.step)
        self.hooks.on_health(done.record() | {"message": done.message()})
        self.save()
        return data_loader(self.parts, s.data_position)

    def run(self) -> dict[str, Any]:
        plan, s = self.plan, self.progress
        tokens_per_step = plan.batch.tokens_per_step
        started, wait_total, stopped, saved_at = time.perf_counter(), 0.0, False, -1
        interval = Interval()
        loader = data_loader(self.parts, s.data_position)
        pulse, own, fault, trained = self.watches.pulse, self.watches.own, self.watches.fault, 0
        try:
            while s.step < plan.steps:
                loader = self.maybe_skip_window(loader)
                pulse.start_step(s.step)
                if fault is not None:
                    fault.maybe_stop(s.step, trained)
                t0, w0 = time.perf_counter(), loader.wait_seconds
                if own is not None:
                    own.begin()
                if fault is not None:
                    fault.maybe_slow()
                metrics = train_step(
                    self.parts,
                    loader,
                    s.step,
                    self.saves.before_update,
                    self.judge_step(),
                    before_sync=own.end if own is not None else None,
                )
                trained += 1
                pulse.stepped(time.perf_counter() - t0)
                intervention = self.health.take()
                if intervention is not None:
                    pulse.section(s.step)  # a rewind loads and saves: a save's allowance
                    loader = self.intervene(intervention, loader)
                    if intervention.action == "rewind":  # back at the checkpoint's step
                        interval = Interval()
                        continue
                s.step += 1
                s.data_position += plan.batch.grad_accum_steps
                s.token_count += tokens_per_step
                self.advance_sources()
                self.last_loss = metrics["loss"]
                wait = loader.wait_seconds - w0
                interval.add(time.perf_counter() - t0, wait)
                wait_total += wait
                self.hooks.on_progress(s.step, plan.steps)
                final = s.step == plan.steps
                logged = self.should_log(final)
                if logged:
                    self.report(metrics, interval)
                    interval = Interval()
                stopped = not final and self.hooks.should_stop()
                if stopped:
                    self.drained["seen_at"] = time.monotonic()  # the step boundary it stops at
                if stopped and not logged:
                    self.report(metrics, interval)  # the last step is always written
                pulse.section(s.step)  # a validation, sample or save may follow
                try:
                    if self.maybe_validate(final):
                        self.save(BEST_TAG)
                    self.maybe_sample(final)
                except RunStopped:  # asked to stop inside a validation or a sample: save, stop
                    stopped = True
                    self.drained.setdefault("seen_at", time.monotonic())
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
            pulse.done()  # from here on no step boundary: nothing to watch
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
            "final_loss": self.last_loss,
            "final_val_loss": self.last_val_loss,
            "best_loss": s.best_loss,
            "token_count": s.token_count,
            "elapsed_sec": elapsed,
            "data_wait_frac": wait_total / elapsed if elapsed > 0 else 0.0,
        }
        if s.sources:
            result["source_tokens"] = source_tokens(s.sources)
        if self.health.counts:
            result["health"] = self.health.report()
        if stopped and self.hooks.draining():
            result["drain"] = self.drain_report(stopped_at)
        if self.last_val_loss is not None and self.bytes_per_token is not None:
            result["final_val_bits_per_byte"] = bits_per_byte(
                self.last_val_loss, self.bytes_per_token
            )
        return result


def train(plan: TrainPlan, store: CheckpointStore, **kwargs: Any) -> dict[str, Any]:
    return Trainer(plan, store, **kwargs).run()

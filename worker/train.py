"""The training loop: built parts in, metrics and checkpoints out.

`build_training` assembles model, optimizers, schedule and data from a resolved `TrainSpec`;
`train` runs it, resuming from a checkpoint when asked. Resume is exact: the checkpoint holds
the master weights, both optimizers, the schedule, the RNG state and the data position, and a
batch is a pure function of (seed, position), so a resumed run computes the same steps as an
uninterrupted one, bit for bit on the same hardware and thread count.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Set
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from store.checkpoints import CheckpointInfo, CheckpointStore
from store.exceptions import CheckpointNotFound
from store.specs import TrainSpec
from worker.async_checkpoint import AsyncCheckpointer
from worker.checkpoint import (
    CheckpointState,
    capture_checkpoint,
    load_checkpoint,
    restore_rng_state,
    write_checkpoint,
)
from worker.data import (
    AsyncDataLoader,
    Batch,
    DataError,
    SyntheticSampler,
    TokenSampler,
    expand_paths,
    read_shard,
    read_text_bytes,
    split_holdout,
    stdlib_source_files,
)
from worker.exceptions import NonFiniteLoss
from worker.model import GPT, build_model
from worker.optim import OptimizerConfig, build_optimizers
from worker.schedule import WSDScheduler, build_scheduler
from worker.validation import compute_validation_loss

BEST_TAG = "best"
Callback = Callable[[dict[str, Any]], None]


class Sampler(Protocol):
    def batch(self, position: int) -> Batch: ...
    def iterate(self, start: int = 0) -> Any: ...


class DataParallel(Protocol):
    """How a step's micro-batches become one gradient: here alone, or across the ranks of a
    multi-GPU run (`worker.distributed.DDPReplica`), each running `1 / world_size` of them."""

    world_size: int

    def loss(self, model: GPT, tokens: torch.Tensor, targets: torch.Tensor) -> Any: ...
    def sync_gradients(self, last: bool) -> AbstractContextManager[Any]: ...
    def mean(self, value: torch.Tensor) -> torch.Tensor: ...


class SingleProcess:
    world_size = 1

    def loss(self, model: GPT, tokens: torch.Tensor, targets: torch.Tensor) -> Any:
        return model.loss(tokens, targets)

    def sync_gradients(self, last: bool) -> AbstractContextManager[Any]:
        return nullcontext()

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        return value


@dataclass
class TrainParts:
    model: GPT
    muon: torch.optim.Muon
    adamw: torch.optim.AdamW
    scheduler: WSDScheduler
    sampler: Sampler
    val_batches: list[Batch]
    device: torch.device
    autocast_dtype: torch.dtype | None
    parallel: DataParallel = field(default_factory=SingleProcess)


@dataclass
class TrainState:
    step: int = 0
    token_count: int = 0
    best_loss: float | None = None
    data_position: int = 0
    last_loss: float | None = None
    last_val_loss: float | None = None


def optimizer_config(spec: TrainSpec) -> OptimizerConfig:
    o = spec.optimizer
    return OptimizerConfig(
        muon_lr=o.muon_lr,
        muon_momentum=o.muon_momentum,
        muon_weight_decay=o.muon_weight_decay,
        muon_adjust_lr_fn=o.muon_adjust_lr_fn,
        adamw_lr=o.adamw_lr,
        adamw_betas=(o.adamw_beta1, o.adamw_beta2),
        adamw_weight_decay=o.adamw_weight_decay,
    )


def build_token_arrays(spec: TrainSpec) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(train arrays, validation arrays) for the real-data sources."""
    d = spec.data
    if d.source == "shards":
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


def build_data(spec: TrainSpec, vocab_size: int) -> tuple[Sampler, list[Batch]]:
    b, d = spec.batch, spec.data
    assert b.micro_batch_size and b.seq_len, "spec must be resolved"
    if d.source == "synthetic":
        val = SyntheticSampler(b.micro_batch_size, b.seq_len, vocab_size, seed=d.seed + 1)
        return (
            SyntheticSampler(b.micro_batch_size, b.seq_len, vocab_size, seed=d.seed),
            [val.batch(i) for i in range(spec.val_batches)],
        )
    train_arrays, val_arrays = build_token_arrays(spec)
    sampler = TokenSampler(train_arrays, b.micro_batch_size, b.seq_len, seed=d.seed)
    if sampler.max_token() >= vocab_size:
        raise DataError(
            f"data holds token id {sampler.max_token()} but the model's vocab_size is {vocab_size}"
        )
    # Validation always reads the same windows, so losses are comparable across evaluations.
    val_sampler = TokenSampler(val_arrays, b.micro_batch_size, b.seq_len, seed=d.seed + 1)
    return sampler, [val_sampler.batch(i) for i in range(spec.val_batches)]


def build_training(spec: TrainSpec) -> TrainParts:
    assert spec.model_config_resolved is not None, "spec must be resolved"
    device = torch.device(spec.device if spec.device != "auto" else "cpu")
    model = build_model(spec.model_config_resolved, device=device, seed=spec.seed)
    muon, adamw = build_optimizers(model, optimizer_config(spec))
    s = spec.schedule
    scheduler = build_scheduler(
        [muon, adamw], spec.steps, s.warmup_frac, s.stable_frac, s.decay, s.min_lr_ratio
    )
    sampler, val_batches = build_data(spec, model.config.vocab_size)
    autocast = torch.bfloat16 if device.type == "cuda" else None
    return TrainParts(model, muon, adamw, scheduler, sampler, val_batches, device, autocast)


def train_step(
    parts: TrainParts, loader: AsyncDataLoader, accum: int, grad_clip: float, step: int
) -> dict[str, float]:
    """One optimizer step over `accum` micro-batches; raises NonFiniteLoss before updating.

    In a multi-GPU run each rank runs its share of the micro-batches, and the gradients and
    the loss are averaged across ranks before anything below uses them.
    """
    model, parallel = parts.model, parts.parallel
    local_accum = accum // parallel.world_size
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
    max_norm = grad_clip if grad_clip > 0 else math.inf
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm).item()
    if not (math.isfinite(loss_value) and math.isfinite(grad_norm)):
        parts.muon.zero_grad(set_to_none=True)
        parts.adamw.zero_grad(set_to_none=True)
        raise NonFiniteLoss(
            f"loss became {loss_value} (grad norm {grad_norm}) at step {step + 1}: the update "
            "was not applied and no checkpoint was written; lower the learning rate or check "
            "the data"
        )
    lr_muon, lr_adamw = parts.scheduler.lrs()
    # After the all-reduce: Muon orthogonalises the averaged gradient (worker/distributed.py).
    parts.muon.step()
    parts.adamw.step()
    parts.muon.zero_grad(set_to_none=True)
    parts.adamw.zero_grad(set_to_none=True)
    parts.scheduler.step()
    return {"loss": loss_value, "grad_norm": grad_norm, "lr_muon": lr_muon, "lr_adamw": lr_adamw}


def validate(parts: TrainParts) -> dict[str, float]:
    return compute_validation_loss(
        parts.model,
        batches=parts.val_batches,
        device=parts.device,
        autocast_dtype=parts.autocast_dtype,
    )


def resume_source(store: CheckpointStore, spec: TrainSpec) -> CheckpointInfo | None:
    if spec.resume_from is None:
        return None
    if spec.resume_from == "latest":
        info = store.latest_or_none(spec.experiment)
        if info is None:
            raise CheckpointNotFound(
                f"resume_from='latest' but experiment {spec.experiment!r} has no checkpoint yet"
            )
        return info
    try:
        return store.get(spec.experiment, spec.resume_from)
    except CheckpointNotFound as exc:
        raise CheckpointNotFound(f"cannot resume from {spec.resume_from!r}: {exc}") from exc


def maybe_resume(parts: TrainParts, store: CheckpointStore, spec: TrainSpec) -> TrainState:
    info = resume_source(store, spec)
    if info is None:
        return TrainState()
    meta = load_checkpoint(
        parts.model, parts.muon, parts.adamw, parts.scheduler, info.path, device=parts.device
    )
    restore_rng_state(meta["rng"])
    return TrainState(
        step=int(meta["step"]),
        token_count=int(meta["token_count"]),
        best_loss=meta.get("best_loss"),
        data_position=int(meta["data_position"]),
    )


class Trainer:
    """Runs a resolved TrainSpec; callbacks report metrics and checkpoints as they happen."""

    def __init__(
        self,
        spec: TrainSpec,
        checkpoint_root: str | Path,
        *,
        run_id: str | None = None,
        on_metrics: Callback | None = None,
        on_checkpoint: Callback | None = None,
        should_stop: Callable[[], bool] | None = None,
        protected: Callable[[], Set[tuple[str, str]]] | None = None,
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        self.spec, self.run_id = spec, run_id
        self.before_commit = before_commit
        self.store = CheckpointStore(Path(checkpoint_root))
        self.on_metrics = on_metrics or (lambda m: None)
        self.on_checkpoint = on_checkpoint or (lambda m: None)
        self.should_stop = should_stop or (lambda: False)
        self.protected = protected or (lambda: frozenset())
        self.parts = build_training(spec)
        self.state = maybe_resume(self.parts, self.store, spec)
        self.checkpointer = AsyncCheckpointer() if spec.async_checkpoint else None

    def save(self, tag: str | None = None) -> Path:
        p, s = self.parts, self.state
        dtype = torch.bfloat16 if self.spec.save_dtype == "bfloat16" else None
        state = capture_checkpoint(
            p.model,
            p.muon,
            p.adamw,
            p.scheduler,
            s.step,
            s.token_count,
            s.best_loss,
            self.spec.experiment,
            tag,
            data_position=s.data_position,
            run_id=self.run_id,
            dtype=dtype,
        )

        def write(state: CheckpointState) -> Path:
            # `protected` is asked under the store's guard, after the commit: a run queued
            # meanwhile that depends on an older checkpoint keeps it.
            root, protected = self.store.root, self.protected
            return write_checkpoint(state, root, self.spec.max_keep, protected, self.before_commit)

        info = {"tag": state.tag, "step": s.step}
        if self.checkpointer is None:
            path = write(state)
            self.on_checkpoint({**info, "path": str(path)})
            return path
        # Asynchronous: the loop goes on once the state is copied; the commit is reported
        # when it has happened (maybe_report_saves, finish_saves).
        for done in self.checkpointer.save(state, write, info):
            self.on_checkpoint(done)
        return self.store.experiment_dir(self.spec.experiment) / state.tag

    def maybe_report_saves(self) -> None:
        for done in self.checkpointer.poll() if self.checkpointer else []:
            self.on_checkpoint(done)

    def finish_saves(self, failing: BaseException | None = None) -> None:
        """Wait for the save in flight: a run that ends or stops leaves its checkpoint."""
        if self.checkpointer is None:
            return
        try:
            for done in self.checkpointer.wait():
                self.on_checkpoint(done)
        except Exception as exc:
            if failing is None:
                raise
            failing.add_note(f"and the checkpoint being saved in the background failed: {exc}")

    def maybe_validate(self, final: bool) -> None:
        if not (final or self.state.step % (self.spec.val_every or self.spec.steps) == 0):
            return
        val = validate(self.parts)
        self.state.last_val_loss = val["loss"]
        improved = self.state.best_loss is None or val["loss"] < self.state.best_loss
        if improved:
            self.state.best_loss = val["loss"]
        self.on_metrics(
            {
                "kind": "val",
                "step": self.state.step,
                "val_loss": val["loss"],
                "val_ppl": val["ppl"],
                "best_loss": self.state.best_loss,
            }
        )
        if improved:
            self.save("best")

    def should_checkpoint(self, final: bool) -> bool:
        return final or self.state.step % (self.spec.checkpoint_every or self.spec.steps) == 0

    def run(self) -> dict[str, Any]:
        spec, s = self.spec, self.state
        accum = spec.batch.grad_accum_steps or 1
        tokens_per_step = (spec.batch.micro_batch_size or 1) * (spec.batch.seq_len or 1) * accum
        started, wait_total, stopped, saved_at = time.perf_counter(), 0.0, False, -1
        loader = AsyncDataLoader(
            self.parts.sampler.iterate(s.data_position), self.parts.device, prefetch_factor=4
        )
        try:
            while s.step < spec.steps:
                t0, w0 = time.perf_counter(), loader.wait_seconds
                metrics = train_step(self.parts, loader, accum, spec.optimizer.grad_clip, s.step)
                s.step += 1
                s.data_position += accum
                s.token_count += tokens_per_step
                s.last_loss = metrics["loss"]
                dt, wait = time.perf_counter() - t0, loader.wait_seconds - w0
                wait_total += wait
                self.on_metrics(
                    {
                        "kind": "train",
                        "step": s.step,
                        "total_steps": spec.steps,
                        **metrics,
                        "tokens": s.token_count,
                        "tokens_per_sec": tokens_per_step / dt,
                        "step_time_sec": dt,
                        "data_wait_sec": wait,
                        "data_wait_frac": wait / dt,
                    }
                )
                final = s.step == spec.steps
                stopped = not final and self.should_stop()
                self.maybe_validate(final)
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
        self.finish_saves()
        if saved_at != s.step and s.step > 0 and self.store.latest_or_none(spec.experiment) is None:
            self.save()  # a resumed run that had nothing left to do still leaves its checkpoint
        elapsed = time.perf_counter() - started
        return {
            "step": s.step,
            "total_steps": spec.steps,
            "stopped": stopped,
            "final_loss": s.last_loss,
            "final_val_loss": s.last_val_loss,
            "best_loss": s.best_loss,
            "token_count": s.token_count,
            "elapsed_sec": elapsed,
            "data_wait_frac": wait_total / elapsed if elapsed > 0 else 0.0,
        }


def train(spec: TrainSpec, checkpoint_root: str | Path, **kwargs: Any) -> dict[str, Any]:
    return Trainer(spec, checkpoint_root, **kwargs).run()

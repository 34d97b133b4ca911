"""Processes the reliability tests kill or race: they save tiny checkpoints in a loop.

The tests start them through a multiprocessing forkserver that has torch preloaded, so one
round costs a fork and a tiny model rather than an interpreter start; a soak run can then do
hundreds of kill rounds in minutes.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import statistics
import time
from collections.abc import Callable, Iterable
from multiprocessing.context import ForkServerContext
from multiprocessing.synchronize import Event
from pathlib import Path

from tests.support.checkpoints import save_checkpoint
from trainctl.store.checkpoints.manifests import MANIFEST_FILE
from trainctl.store.names import BEST_TAG
from trainctl.worker.models.gpt import GPT, build_model
from trainctl.worker.training.optim import Optimizers, build_optimizers
from trainctl.worker.training.schedule import WSDScheduler, build_scheduler

EXPERIMENT = "exp"
MAX_KEEP = 3
BEST_EVERY = 2
"""A ``best`` save follows every second step save, so commits that replace a tag are killed
too (they go through a tagged trash folder that `CheckpointStore.cleanup` puts back)."""

Parts = tuple[GPT, Optimizers, WSDScheduler]


def forkserver() -> ForkServerContext:
    """A process context whose children start from a server that already imported torch."""
    ctx = multiprocessing.get_context("forkserver")
    # torch._dynamo is imported lazily by the optimizers and costs a second per child.
    ctx.set_forkserver_preload([__name__, "torch._dynamo"])
    return ctx


def build_parts() -> Parts:
    """A tiny model with its optimizers and schedule (untrained: the bytes do not matter here,
    and a first Muon step costs a fresh process seconds of BLAS warm-up)."""
    model = build_model("tiny", seed=0)
    optimizers = build_optimizers(model)
    return model, optimizers, build_scheduler(optimizers, 10_000)


def save_step(
    parts: Parts,
    root: Path,
    step: int,
    tag: str | None = None,
    protected: Iterable[tuple[str, str]] = (),
) -> Path:
    model, optimizers, scheduler = parts
    return save_checkpoint(
        model,
        optimizers,
        scheduler,
        step,
        step * 1000,
        1.0 / step,
        root / EXPERIMENT,
        MAX_KEEP,
        tag,
        run_id="saver",
        protected=frozenset(protected),
    )


def save_forever(
    root: str,
    first_step: int,
    ready: Event,
    stop: Event | None = None,
    protected: Iterable[tuple[str, str]] = (),
) -> None:
    """Save step_<n>, n = first_step, ..., and ``best`` after every BEST_EVERY-th step, until
    killed or until `stop` is set. Raises (exit code 1) if a checkpoint it has just committed
    is gone: being the newest, nobody may delete it.

    `ready` is set once the first checkpoint is committed: the first save of a fresh process
    is slow (lazy imports, version lookups), and kill delays are drawn to span warm saves.
    """
    parts, folder = build_parts(), Path(root)
    protected = list(protected)
    step = first_step
    while stop is None or not stop.is_set():
        for tag in [None, BEST_TAG] if step % BEST_EVERY == 0 else [None]:
            path = save_step(parts, folder, step, tag, protected)
            if not (path / MANIFEST_FILE).is_file():
                raise AssertionError(f"{path.name} vanished right after it was committed")
        ready.set()
        step += 1


def crash_at_call(root: str, number: int, work: Callable[[Path], None]) -> None:
    """Run `work` and SIGKILL this process just before its `number`-th file-system call that
    makes a save durable or visible (fsync, rename, replace, unlink, rmdir); exit 0 if `work`
    makes fewer calls."""
    counter = {"calls": 0}

    def deadly(real: Callable[..., object]) -> Callable[..., object]:
        def call(*args: object, **kwargs: object) -> object:
            counter["calls"] += 1
            if counter["calls"] == number:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*args, **kwargs)

        return call

    for name in ("fsync", "rename", "replace", "unlink", "rmdir"):
        setattr(os, name, deadly(getattr(os, name)))
    work(Path(root))


def save_step_then_best(root: Path) -> None:
    """The save sequence the crash-point test kills: step_4 (pruning step_1), then best."""
    parts = build_parts()
    save_step(parts, root, 4)
    save_step(parts, root, 4, BEST_TAG)


def measure_save_seconds(root: Path, repeats: int = 5) -> float:
    """Median wall time of one tiny save into a scratch store (the kill delays scale by it)."""
    parts, times = build_parts(), []
    for step in range(1, repeats + 1):
        started = time.perf_counter()
        save_step(parts, root, step)
        times.append(time.perf_counter() - started)
    return statistics.median(times)

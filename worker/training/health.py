"""Loss health, torch half (docs/design/health.md, "Loss health"): each step's loss and
gradient norm judged before the optimizers apply it; the options are
`store.training.health.HealthSpec`.

The judgement costs no host-device sync of its own. The loop brings the step's loss and
gradient norm to the host every step in its one read (`train_step`'s `.tolist()`, which the
metrics read too); whether a rank's norm is finite travels in the same all-reduce as the
loss, so every rank reads the same numbers and reaches the same verdict without another
collective (tests/worker/training/test_host_syncs.py counts the reads).
"""

from __future__ import annotations

import json
import math
import os
from contextlib import suppress
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainctl.store.checkpoints.info import CheckpointInfo
from trainctl.store.checkpoints.store import CheckpointStore, Protected
from trainctl.store.exceptions import CheckpointProtected
from trainctl.store.kinds.train import TrainPlan
from trainctl.store.names import step_tag
from trainctl.store.training.health import HealthSpec
from trainctl.worker.data.loader import Batch, Sampler

# The standard deviation a z-score divides by is at least this fraction of the mean loss: a
# loss that has flattened to a line would otherwise read its own noise as spikes.
MIN_RELATIVE_STD = 0.01


@dataclass
class SpikeDetector:
    """A z-score of each loss against an exponential moving mean and variance of the losses
    before it, judged after `warmup` losses. A spike is not learned: the average stays the
    one of healthy steps."""

    decay: float
    warmup: int
    threshold: float
    count: int = 0
    mean: float = 0.0
    var: float = 0.0

    def score(self, loss: float) -> float | None:
        """The loss's z-score, or None while the average is still warming up."""
        if self.count < self.warmup:
            return None
        std = max(math.sqrt(self.var), MIN_RELATIVE_STD * abs(self.mean), 1e-12)
        return (loss - self.mean) / std

    def is_spike(self, z: float | None) -> bool:
        return z is not None and z > self.threshold  # only a rise: a drop is good news

    def learn(self, loss: float) -> None:
        """Fold a healthy loss into the average (West's exponentially weighted variance)."""
        if self.count == 0:
            self.mean, self.var = loss, 0.0
        else:
            alpha = 1.0 - self.decay
            diff = loss - self.mean
            self.mean += alpha * diff
            self.var = (1.0 - alpha) * (self.var + alpha * diff * diff)
        self.count += 1

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count, "mean": self.mean, "var": self.var}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count, self.mean, self.var = int(state["count"]), state["mean"], state["var"]


@dataclass(frozen=True)
class Intervention:
    """What the loop did about one step: its run event's `health` record."""

    step: int
    loss: float
    grad_norm: float
    reason: str
    """'nonfinite' or 'spike'."""
    action: str
    """'log', 'skip', 'rewind' or 'fail' (store.training.health.INTERVENTIONS)."""
    statistic: float | None
    """The loss's z-score against the moving average (None: not judged, as a NaN)."""
    window: tuple[int, int]
    """The data positions [start, end) the step read."""
    rewound_to: int | None = None
    """The step of the checkpoint a rewind reloaded (the step itself: none was old enough,
    and the window was skipped where the run stood)."""

    @property
    def skips_update(self) -> bool:
        return self.action != "log"

    def record(self) -> dict[str, Any]:
        finite = math.isfinite
        return {
            "step": self.step,
            "loss": self.loss if finite(self.loss) else str(self.loss),
            "grad_norm": self.grad_norm if finite(self.grad_norm) else str(self.grad_norm),
            "reason": self.reason,
            "action": self.action,
            "statistic": self.statistic,
            "window": list(self.window),
            "rewound_to": self.rewound_to,
        }

    def message(self) -> str:
        what = (
            f"loss {self.loss:.4g} is {self.statistic:.1f} standard deviations above its average"
            if self.reason == "spike" and self.statistic is not None
            else f"loss {self.loss} and grad norm {self.grad_norm} are not both finite"
        )
        done = {
            "log": "logged only",
            "skip": "its update was skipped",
            "rewind": f"rewound to step {self.rewound_to} and skipped data "
            f"{self.window[0]}..{self.window[1] - 1}",
            "fail": "the run fails",
        }[self.action]
        return f"health: step {self.step}: {what}; {done}"


@dataclass
class LossHealth:
    """The verdicts of one run, and what they leave behind: the counts and rewinds (kept
    across rewinds and, through the checkpoint's metadata, across attempts) and the lowered
    lr after a rewind."""

    spec: HealthSpec
    detector: SpikeDetector = field(init=False)
    counts: dict[str, int] = field(default_factory=dict)
    rewinds: list[int] = field(default_factory=list)
    """The steps the run rewound from."""
    skips_in_a_row: int = 0
    low_lr_until: int = 0
    """Steps up to this one train at the lowered lr (`rewind.lr_factor`)."""
    last: Intervention | None = None
    """The intervention of the step just judged; the loop takes it (`take`)."""

    def __post_init__(self) -> None:
        s = self.spec.spike
        self.detector = SpikeDetector(s.ema_decay, s.warmup_steps, s.z_threshold)

    def judge(
        self, step: int, loss: float, grad_norm: float, finite: bool, window: tuple[int, int]
    ) -> Intervention | None:
        """The verdict on step `step` (1-based) before its update: None to apply it."""
        spike = self.spec.spike
        z = self.detector.score(loss) if finite and spike.action != "off" else None
        if finite and not self.detector.is_spike(z):
            self.detector.learn(loss)
            self.skips_in_a_row = 0
            return None
        if not finite:
            action = "skip" if self.spec.nonfinite == "skip" else "fail"
        elif spike.action == "rewind" and len(self.rewinds) >= self.spec.rewind.max_rewinds:
            action = "fail"
        else:
            action = spike.action
        reason = "nonfinite" if not finite else "spike"
        if action == "skip":
            self.skips_in_a_row += 1
            if self.skips_in_a_row > self.spec.max_skips_in_a_row:
                action = "fail"
        self.last = Intervention(step, loss, grad_norm, reason, action, z, window)
        self.counts[action] = self.counts.get(action, 0) + 1
        return self.last

    def take(self) -> Intervention | None:
        last, self.last = self.last, None
        return last

    def failure(self, i: Intervention) -> str:
        """Why a run fails at intervention `i`, in words a user can act on."""
        if i.reason == "nonfinite" and self.spec.nonfinite == "fail":
            return (
                f"loss became {i.loss} (grad norm {i.grad_norm}) at step {i.step}: the update "
                "was not applied and no checkpoint was written; lower the learning rate or "
                "check the data"
            )
        if self.skips_in_a_row > self.spec.max_skips_in_a_row:
            return (
                f"{self.skips_in_a_row} steps in a row skipped up to step {i.step} (the last: "
                f"loss {i.loss}, grad norm {i.grad_norm}): the model has diverged; resume from "
                "an earlier checkpoint with a lower learning rate, or raise "
                "health.max_skips_in_a_row"
            )
        return (
            f"loss spike at step {i.step} (loss {i.loss:.4g}, z-score {i.statistic:.1f}) after "
            f"{len(self.rewinds)} rewinds (from steps {self.rewinds}), the most "
            "health.rewind.max_rewinds allows; look at the data around these steps, lower the "
            "learning rate, or raise the cap"
        )

    def rewound(self, spike: Intervention, to_step: int) -> Intervention:
        """Record a rewind from `spike` to `to_step`; the event's record."""
        self.rewinds.append(spike.step)
        r = self.spec.rewind
        if r.lr_steps > 0:
            self.low_lr_until = to_step + r.lr_steps
        self.skips_in_a_row = 0
        return Intervention(**{**spike.__dict__, "rewound_to": to_step})

    def lr_factor(self, step: int) -> float:
        """The factor on the schedule's lr for step `step` (1-based)."""
        return self.spec.rewind.lr_factor if step <= self.low_lr_until else 1.0

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint records (its metadata's `health`)."""
        return {
            "detector": self.detector.state_dict(),
            "counts": dict(self.counts),
            "rewinds": list(self.rewinds),
            "low_lr_until": self.low_lr_until,
        }

    def load_state_dict(self, state: dict[str, Any], *, detector_only: bool = False) -> None:
        """A checkpoint's record; `detector_only`: a rewind's, whose counts are older than the
        run's own."""
        if "detector" in state:
            self.detector.load_state_dict(state["detector"])
        if detector_only:
            return
        self.counts = {str(k): int(v) for k, v in state.get("counts", {}).items()}
        self.rewinds = [int(s) for s in state.get("rewinds", [])]
        self.low_lr_until = int(state.get("low_lr_until", 0))

    def report(self) -> dict[str, Any]:
        """The run's result's `health`."""
        return {"interventions": dict(self.counts), "rewinds_from": list(self.rewinds)}


def lower_lrs(optimizers: Any, factor: float) -> None:
    """Scale this step's lrs; the scheduler's next step sets them from the schedule again."""
    for optimizer in optimizers.values():
        for group in optimizer.param_groups:
            group["lr"] *= factor


def agreed_step(mine: int, device: torch.device) -> int:
    """Rank 0's choice of a step, on every rank (one collective, at a rewind only): the
    checkpoints rank 0 commits are what the ranks see."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return mine
    value = torch.tensor([mine if dist.get_rank() == 0 else -1], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return int(value.item())


# --- the checkpoints a rewind reads --------------------------------------------------------------


def own_step_checkpoints(
    store: CheckpointStore, plan: TrainPlan, run_id: str | None
) -> list[CheckpointInfo]:
    """The step_<N> checkpoints of `plan`'s experiment that run `run_id` wrote, and the one
    it started from: a rewind goes back to one of them, never to another run's."""
    fork = plan.fork_from
    started = plan.resume_from or (fork.checkpoint if fork is not None else None)
    return [
        info
        for info in store.list_checkpoints(plan.experiment)
        if info.step is not None
        and info.tag == step_tag(info.step)
        and (info.run_id == run_id or (started is not None and info.tag == started.tag))
    ]


def rewind_target(store: CheckpointStore, plan: TrainPlan, run_id: str | None, limit: int) -> int:
    """The step of the newest of the run's checkpoints at or before `limit`; -1: none."""
    steps = [i.step for i in own_step_checkpoints(store, plan, run_id) if i.step is not None]
    return max((s for s in steps if s <= limit), default=-1)


def drop_checkpoints_after(
    store: CheckpointStore, plan: TrainPlan, run_id: str | None, step: int, protected: Protected
) -> None:
    """Delete the run's step checkpoints after `step`: they lie on the path into the spike,
    and a requeued attempt must not resume from one. One an evaluate run still pins stays (a
    resume takes the newest, which the rewind saves next)."""
    for info in own_step_checkpoints(store, plan, run_id):
        if info.step is not None and info.step > step:
            with suppress(CheckpointProtected):
                store.delete(info.experiment, info.tag, protected=protected)


# --- the test seam ----------------------------------------------------------------------------

TEST_FAULTS_ENV = "TRAINCTL_TEST_FAULTS"
"""A JSON object of faults to plant, read by tests only (tests/worker/training/test_health.py):
`{"nan_grad": [rank, step]}` puts a NaN into one gradient of that rank after the gradients are
averaged; `{"poison": [p, ...]}` makes the batches at those data positions uniform random
tokens; `{"drop": [start, end]}` removes positions [start, end) from the data (what a run whose
data never held them reads). Unset, as in every deployment: nothing is planted."""


@cache
def planted_faults() -> dict[str, Any]:
    raw = os.environ.get(TEST_FAULTS_ENV)
    return json.loads(raw) if raw else {}


def maybe_plant_nan(model: nn.Module, rank: int, step: int) -> None:
    """The `nan_grad` fault: one rank's gradient turns NaN at one step."""
    fault = planted_faults().get("nan_grad")
    if fault is None or fault != [rank, step]:
        return
    grad = next(p.grad for p in model.parameters() if p.grad is not None)
    grad.view(-1)[0] = float("nan")


class FaultySampler:
    """A sampler with the `poison` and `drop` faults planted (see TEST_FAULTS_ENV)."""

    def __init__(self, base: Sampler, vocab_size: int, faults: dict[str, Any]) -> None:
        self.base, self.vocab_size = base, vocab_size
        self.poison = set(faults.get("poison", []))
        self.drop = tuple(faults.get("drop", (0, 0)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)

    def batch(self, position: int) -> Batch:
        start, end = self.drop
        if position >= start:
            position += end - start
        tokens, targets = self.base.batch(position)
        if position in self.poison:
            g = torch.Generator().manual_seed(position)
            targets = torch.randint(0, self.vocab_size, targets.shape, generator=g)
        return tokens, targets

    def iterate(self, start: int = 0) -> Any:
        position = start
        while True:
            yield self.batch(position)
            position += 1


def maybe_faulty(sampler: Sampler, vocab_size: int) -> Sampler:
    faults = planted_faults()
    if not ("poison" in faults or "drop" in faults):
        return sampler
    return FaultySampler(sampler, vocab_size, faults)

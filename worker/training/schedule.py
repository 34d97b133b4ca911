"""Warmup-stable-decay (WSD) learning-rate schedule (docs/design/forks.md, "Forks").

`wsd_factor` is a pure function of the step; `WSDScheduler` applies it to each named
optimizer's *own* base lr (the seed copied the first optimizer's lr to the others, which
would have trained Muon at AdamW's 3e-4).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import torch
from torch.optim.lr_scheduler import LRScheduler

from trainctl.store.training.schedule import SchedulePhases

Decay = Literal["linear", "cosine", "sqrt"]
DECAYS = ("linear", "cosine", "sqrt")


def check_schedule(warmup_frac: float, stable_frac: float, decay: str, min_lr_ratio: float) -> None:
    if not 0.0 <= warmup_frac <= 1.0:
        raise ValueError(f"warmup_frac must be in [0, 1], got {warmup_frac}")
    if not 0.0 <= stable_frac <= 1.0:
        raise ValueError(f"stable_frac must be in [0, 1], got {stable_frac}")
    if warmup_frac + stable_frac > 1.0 + 1e-9:
        raise ValueError(
            f"warmup_frac + stable_frac must be <= 1, got {warmup_frac} + {stable_frac}"
        )
    if decay not in DECAYS:
        raise ValueError(f"decay must be one of {', '.join(DECAYS)}, got {decay!r}")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")


def phase_lengths(total_steps: int, warmup_frac: float, stable_frac: float) -> tuple[int, int]:
    """(warmup_steps, stable_steps); decay gets the rest."""
    phases = SchedulePhases.of_fractions(total_steps, warmup_frac, stable_frac)
    return phases.warmup, phases.decay_start - phases.warmup


def wsd_factor(
    step: int,
    total_steps: int,
    warmup_frac: float = 0.01,
    stable_frac: float = 0.84,
    decay: Decay | str = "linear",
    min_lr_ratio: float = 0.1,
    phases: SchedulePhases | None = None,
) -> float:
    """The lr multiplier at `step` (0-based: the factor used by the step-th optimizer step).

    `phases` (absolute steps) replace the fractions of `total_steps` where given. Warmup
    rises linearly to 1 and reaches it at the last warmup step, so step 0 already trains;
    decay goes from 1 to `min_lr_ratio`, reaching it at `phases.decay_end`, and holds there.
    With t = step - decay_start and D = decay_end - decay_start, the factor in the decay is
    min + (1 - min) * shape(t / D): linear 1 - x, cosine (1 + cos(pi x)) / 2, sqrt 1 - sqrt(x).
    """
    check_schedule(warmup_frac, stable_frac, decay, min_lr_ratio)
    if total_steps <= 0:
        raise ValueError(f"total_steps must be positive, got {total_steps}")
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    p = phases or SchedulePhases.of_fractions(total_steps, warmup_frac, stable_frac)
    if step < p.warmup:
        return (step + 1) / p.warmup
    if step < p.decay_start:
        return 1.0
    if step >= p.decay_end:
        return min_lr_ratio
    progress = (step - p.decay_start) / (p.decay_end - p.decay_start)  # in [0, 1)
    if decay == "linear":
        shape = 1.0 - progress
    elif decay == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:  # 1 - sqrt cooldown (Hägele et al., 2024)
        shape = 1.0 - math.sqrt(progress)
    return min_lr_ratio + (1.0 - min_lr_ratio) * shape


class WSDScheduler(LRScheduler):
    """Drives named optimizers (a run's `worker.training.optim.Optimizers`) with the WSD factor on
    each one's own base lr.

    torch's LRScheduler owns a single optimizer: the first one is handed to it, the others are
    set alongside it on every step. `base_lrs` covers the first one's param groups.
    """

    def __init__(
        self,
        optimizers: Mapping[str, torch.optim.Optimizer],
        total_steps: int,
        warmup_frac: float = 0.01,
        stable_frac: float = 0.84,
        decay: Decay | str = "linear",
        min_lr_ratio: float = 0.1,
        last_epoch: int = -1,
        phases: SchedulePhases | None = None,
    ) -> None:
        check_schedule(warmup_frac, stable_frac, decay, min_lr_ratio)
        if total_steps <= 0:
            raise ValueError(f"total_steps must be positive, got {total_steps}")
        opts = list(optimizers.values())
        if not opts:
            raise ValueError("WSDScheduler needs at least one optimizer")
        self.names = list(optimizers)
        self.optimizers = opts
        self.total_steps = total_steps
        self.warmup_frac, self.stable_frac = warmup_frac, stable_frac
        self.decay, self.min_lr_ratio = decay, min_lr_ratio
        self.phases = phases or SchedulePhases.of_fractions(total_steps, warmup_frac, stable_frac)
        for opt in opts[1:]:
            for group in opt.param_groups:
                group.setdefault("initial_lr", group["lr"])
        super().__init__(opts[0], last_epoch)

    def factor(self) -> float:
        return wsd_factor(
            max(self.last_epoch, 0),
            self.total_steps,
            self.warmup_frac,
            self.stable_frac,
            self.decay,
            self.min_lr_ratio,
            self.phases,
        )

    def get_lr(self) -> list[float]:  # type: ignore[override]
        f = self.factor()
        return [group["initial_lr"] * f for group in self.optimizer.param_groups]

    def step(self, epoch: int | None = None) -> None:
        super().step(epoch)
        f = self.factor()
        for opt in self.optimizers[1:]:
            for group in opt.param_groups:
                group["lr"] = group["initial_lr"] * f

    def lrs(self) -> dict[str, float]:
        """The current lr of each optimizer's first param group, by name."""
        return {
            n: o.param_groups[0]["lr"] for n, o in zip(self.names, self.optimizers, strict=True)
        }

    def state_dict(self) -> dict[str, Any]:
        # Only plain numbers: the scheduler state goes into metadata.json.
        return {
            "last_epoch": self.last_epoch,
            "total_steps": self.total_steps,
            "warmup_frac": self.warmup_frac,
            "stable_frac": self.stable_frac,
            "decay": self.decay,
            "min_lr_ratio": self.min_lr_ratio,
            "phases": self.phases.to_dict(),
            "initial_lrs": [[g["initial_lr"] for g in o.param_groups] for o in self.optimizers],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_epoch = int(state_dict["last_epoch"])
        self.total_steps = int(state_dict["total_steps"])
        self.warmup_frac = float(state_dict["warmup_frac"])
        self.stable_frac = float(state_dict["stable_frac"])
        self.decay = str(state_dict["decay"])
        self.min_lr_ratio = float(state_dict["min_lr_ratio"])
        # Checkpoints from before absolute steps hold the fractions alone.
        phases = state_dict.get("phases")
        self.phases = (
            SchedulePhases(**{k: int(phases[k]) for k in ("warmup", "decay_start", "decay_end")})
            if isinstance(phases, dict)
            else SchedulePhases.of_fractions(self.total_steps, self.warmup_frac, self.stable_frac)
        )
        for opt, lrs in zip(self.optimizers, state_dict["initial_lrs"], strict=True):
            for group, lr in zip(opt.param_groups, lrs, strict=True):
                group["initial_lr"] = lr
        self.base_lrs = [g["initial_lr"] for g in self.optimizer.param_groups]
        f = self.factor()
        for opt in self.optimizers:
            for group in opt.param_groups:
                group["lr"] = group["initial_lr"] * f
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]


def build_scheduler(
    optimizers: Mapping[str, torch.optim.Optimizer],
    total_steps: int,
    warmup_frac: float = 0.01,
    stable_frac: float = 0.84,
    decay: str = "linear",
    min_lr_ratio: float = 0.1,
    phases: SchedulePhases | None = None,
) -> WSDScheduler:
    """`phases` (a `ScheduleSpec.phases`) replace the fractions where given."""
    return WSDScheduler(
        optimizers, total_steps, warmup_frac, stable_frac, decay, min_lr_ratio, phases=phases
    )

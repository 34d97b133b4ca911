"""The phases of a warmup-stable-decay schedule, in steps (docs/design/forks.md, "Forks").

A schedule is given as fractions of a run's steps (`warmup_frac`, `stable_frac`) or in
absolute steps (`warmup_steps`, `decay_start`, `decay_steps`); either way it becomes one
`SchedulePhases`, which the worker's `wsd_factor` reads (worker/training/schedule.py). Plain Python:
the store checks a schedule at submit without torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulePhases:
    """Global optimizer steps: warmup is [0, warmup), stable [warmup, decay_start), decay
    [decay_start, decay_end); from decay_end on the factor holds at min_lr_ratio."""

    warmup: int
    decay_start: int
    decay_end: int

    def __post_init__(self) -> None:
        if not 0 <= self.warmup <= self.decay_start <= self.decay_end:
            raise ValueError(
                f"schedule phases must satisfy 0 <= warmup <= decay_start <= decay_end, got "
                f"warmup {self.warmup}, decay_start {self.decay_start}, decay_end {self.decay_end}"
            )

    @classmethod
    def of_fractions(
        cls, total_steps: int, warmup_frac: float, stable_frac: float
    ) -> SchedulePhases:
        """Warmup and stable as fractions of `total_steps` (rounded); decay gets the rest."""
        warmup = round(warmup_frac * total_steps)
        stable = min(round(stable_frac * total_steps), total_steps - warmup)
        return cls(warmup, warmup + stable, total_steps)

    def to_dict(self) -> dict[str, int]:
        return {"warmup": self.warmup, "decay_start": self.decay_start, "decay_end": self.decay_end}

from __future__ import annotations

import math

import pytest
import torch

from trainctl.store.exceptions import InvalidRequest
from trainctl.store.specs import ScheduleSpec
from trainctl.store.training.schedule import SchedulePhases
from trainctl.worker.training.schedule import WSDScheduler, wsd_factor

# total 100: warmup 10 steps, stable 50, decay 40 (steps 60..99), min 0.1.
TABLE = [
    # step, decay, expected
    (0, "linear", 0.1),
    (4, "linear", 0.5),
    (9, "linear", 1.0),
    (10, "linear", 1.0),
    (59, "linear", 1.0),
    (60, "linear", 1.0),
    (80, "linear", 0.1 + 0.9 * 0.5),
    (90, "linear", 0.1 + 0.9 * 0.25),
    (80, "cosine", 0.1 + 0.9 * 0.5),
    (70, "cosine", 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.25))),
    (70, "sqrt", 0.1 + 0.9 * (1 - math.sqrt(0.25))),
    (100, "linear", 0.1),
    (100, "sqrt", 0.1),
    (5000, "cosine", 0.1),
]


@pytest.mark.parametrize(("step", "decay", "expected"), TABLE)
def test_wsd_factor_table(step: int, decay: str, expected: float) -> None:
    got = wsd_factor(step, 100, warmup_frac=0.1, stable_frac=0.5, decay=decay, min_lr_ratio=0.1)
    assert got == pytest.approx(expected)


def test_seed_defaults_warm_up_one_percent_and_hold_84_percent() -> None:
    assert wsd_factor(0, 1000) == pytest.approx(0.1)
    assert wsd_factor(9, 1000) == 1.0
    assert wsd_factor(849, 1000) == 1.0
    assert wsd_factor(850, 1000) == 1.0
    assert wsd_factor(851, 1000) < 1.0
    assert wsd_factor(1000, 1000) == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"warmup_frac": -0.1}, "warmup_frac"),
        ({"stable_frac": 1.5}, "stable_frac"),
        ({"warmup_frac": 0.5, "stable_frac": 0.6}, "warmup_frac \\+ stable_frac"),
        ({"decay": "step"}, "decay must be one of"),
        ({"min_lr_ratio": 2.0}, "min_lr_ratio"),
    ],
)
def test_invalid_schedules_are_rejected_with_the_reason(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        wsd_factor(0, 100, **kwargs)


def two_optimizers() -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
    a = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.02)
    b = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=3e-4)
    return a, b


def run(sched: WSDScheduler, opts: tuple[torch.optim.Optimizer, ...], steps: int) -> None:
    for _ in range(steps):
        for o in opts:
            o.step()
        sched.step()


def test_each_optimizer_keeps_its_own_base_lr() -> None:
    a, b = two_optimizers()
    sched = WSDScheduler({"a": a, "b": b}, total_steps=100, warmup_frac=0.1, stable_frac=0.5)
    run(sched, (a, b), 80)
    factor = wsd_factor(80, 100, 0.1, 0.5)
    assert a.param_groups[0]["lr"] == pytest.approx(0.02 * factor)
    assert b.param_groups[0]["lr"] == pytest.approx(3e-4 * factor)
    assert sched.lrs() == {"a": a.param_groups[0]["lr"], "b": b.param_groups[0]["lr"]}


def test_scheduler_state_round_trips() -> None:
    a, b = two_optimizers()
    sched = WSDScheduler({"a": a, "b": b}, total_steps=100, decay="cosine")
    run(sched, (a, b), 90)
    a2, b2 = two_optimizers()
    sched2 = WSDScheduler({"a": a2, "b": b2}, total_steps=100, decay="cosine")
    sched2.load_state_dict(sched.state_dict())
    assert sched2.lrs() == sched.lrs()
    run(sched, (a, b), 3)
    run(sched2, (a2, b2), 3)
    assert sched2.lrs() == sched.lrs()


# --- absolute steps (docs/design/forks.md, "Forks") ------------------------------------------


def test_absolute_steps_replace_the_fractions_in_one_place() -> None:
    spec = ScheduleSpec(warmup_steps=2, decay_start=50, decay_steps=20, decay="sqrt")
    phases = spec.phases(100)
    assert phases == SchedulePhases(warmup=2, decay_start=50, decay_end=70)
    assert ScheduleSpec(warmup_frac=0.1, stable_frac=0.5).phases(100) == SchedulePhases(10, 60, 100)
    assert ScheduleSpec(decay_start=80).phases(100) == SchedulePhases(1, 80, 100)
    assert ScheduleSpec(decay_steps=20).phases(100) == SchedulePhases(1, 80, 100)  # the last 20
    table = {0: 0.5, 1: 1.0, 49: 1.0, 50: 1.0, 55: 0.1 + 0.9 * (1 - math.sqrt(0.25)), 70: 0.1}
    for step, expected in table.items():
        got = wsd_factor(step, 100, decay="sqrt", min_lr_ratio=0.1, phases=phases)
        assert got == pytest.approx(expected), step


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"decay_start": 101}, "schedule.decay_start 101 is beyond"),
        ({"warmup_steps": 101}, "schedule.warmup_steps 101 is beyond"),
        ({"decay_start": 90, "decay_steps": 11}, "schedule.decay_steps: decay_start 90"),
        ({"decay_steps": 101}, "schedule.decay_steps 101 is beyond"),
        ({"warmup_steps": 20, "decay_start": 10}, "schedule.decay_start 10 is before"),
    ],
)
def test_a_schedule_that_does_not_fit_the_steps_names_its_field(
    fields: dict[str, int], message: str
) -> None:
    with pytest.raises(InvalidRequest, match=message):
        ScheduleSpec(**fields).phases(100)


def test_a_schedule_state_from_before_absolute_steps_still_loads() -> None:
    a, b = two_optimizers()
    sched = WSDScheduler({"a": a, "b": b}, total_steps=100, warmup_frac=0.1, stable_frac=0.5)
    run(sched, (a, b), 70)
    old = {k: v for k, v in sched.state_dict().items() if k != "phases"}
    a2, b2 = two_optimizers()
    sched2 = WSDScheduler({"a": a2, "b": b2}, total_steps=100)
    sched2.load_state_dict(old)
    assert sched2.phases == SchedulePhases(10, 60, 100)
    assert sched2.lrs() == sched.lrs()

"""Hangs and stragglers, store half: a train request's settings, and the two statistics the
worker's watch computes from step times (docs/design/hangs.md). The worker half, which
measures and acts, is `worker.training.hangs`.

- **Hang timeout.** A rank that shows no progress for longer than its timeout is hung. The
  timeout is learned from the rank's own step times: `max(floor, multiplier × p99)` of the
  last `window` steps, once `warmup_steps` have been seen; until then, and around
  validations, samples and saves, the rank also gets `allowance_seconds`.
- **Stragglers.** A rank whose own step time (its work before the gradients' all-reduce) has
  a median over the last `window` steps more than `threshold` above the median of the
  other ranks' is a straggler.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

MAX_WINDOW = 10_000
DAY_SECONDS = 86_400.0


class HangOptions(BaseModel):
    """When a rank of a multi-process train run counts as hung."""

    model_config = ConfigDict(extra="forbid")

    enabled: StrictBool = Field(
        True,
        description="Watch the ranks of a multi-process run (nproc_per_node or nnodes above "
        "1) for hangs: one that makes no progress for longer than its timeout has every "
        "rank's Python stack written to the run's events, and the attempt is requeued, to "
        "resume from the last checkpoint.",
    )
    floor_seconds: float = Field(
        60.0,
        ge=0.1,
        le=DAY_SECONDS,
        description="The shortest timeout of a step, whatever the step times say.",
    )
    multiplier: float = Field(
        10.0,
        ge=1.0,
        le=1000.0,
        description="The timeout of a step is this many times the 99th percentile of the "
        "rank's recent step times (or floor_seconds, the larger).",
    )
    allowance_seconds: float = Field(
        600.0,
        ge=0.0,
        le=DAY_SECONDS,
        description="Added to the timeout around a validation, a sample or a checkpoint "
        "save, and for the first warmup_steps steps (a first step compiles and warms "
        "caches): those take longer than a step and learn nothing.",
    )
    warmup_steps: StrictInt = Field(
        5,
        ge=1,
        le=MAX_WINDOW,
        description="Steps a rank trains before its timeout is learned from its step times.",
    )
    window: StrictInt = Field(
        100, ge=1, le=MAX_WINDOW, description="Recent step times the timeout is learned from."
    )


class StragglerOptions(BaseModel):
    """When a rank of a multi-process train run counts as a straggler."""

    model_config = ConfigDict(extra="forbid")

    enabled: StrictBool = Field(
        True,
        description="Time each rank's own work per step (before the gradients are averaged) "
        "and report a rank that is persistently slower than the others: a log event with a "
        "`straggler` field, the /metrics gauge trainctl_run_straggler_slowdown, and the "
        "dashboard. Data-parallel (ddp) runs only: under fsdp every forward waits for all "
        "ranks.",
    )
    threshold: float = Field(
        0.2,
        gt=0.0,
        le=100.0,
        description="A rank is a straggler when its median own step time over the window is "
        "more than this fraction above the median of the other ranks' (0.2: 20 % slower).",
    )
    min_excess_seconds: float = Field(
        0.005,
        ge=0.0,
        le=DAY_SECONDS,
        description="And slower by at least this many seconds a step: a tiny step's jitter "
        "is no straggler.",
    )
    window: StrictInt = Field(
        20,
        ge=1,
        le=MAX_WINDOW,
        description="Steps each rank's median own step time is taken over; a rank is reported "
        "no sooner than this many steps into an attempt.",
    )
    avoid: StrictBool = Field(
        False,
        description="Place the run's next attempt (after a hang, a lost node, a preemption or "
        "a drain) away from the nodes of the ranks last reported as stragglers, where enough "
        "other nodes can take it; else on them as usual. GET /runs/{id} shows them as "
        "`avoid_nodes`. Off by default: a node slow for a while is not always slow.",
    )


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q` percentile (0 < q <= 100) of `values`, which are not empty."""
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, -(-len(ordered) * q // 100) - 1))
    return ordered[int(k)]


def median(values: Sequence[float]) -> float:
    ordered, n = sorted(values), len(values)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def step_timeout(step_seconds: Sequence[float], options: HangOptions) -> float:
    """How long a rank may go without progress in a step, from its recent step times (the
    last `options.window`, oldest first): the floor plus the allowance while fewer than
    `warmup_steps` are known, else max(floor, multiplier × p99)."""
    if len(step_seconds) < options.warmup_steps:
        return options.floor_seconds + options.allowance_seconds
    recent = list(step_seconds)[-options.window :]
    return max(options.floor_seconds, options.multiplier * percentile(recent, 99))


def against_others(own_seconds: Sequence[Sequence[float]]) -> list[tuple[float, float]]:
    """Each rank's median own step time, and the median of the other ranks' medians, from
    each rank's recent times (`own_seconds[rank]`). Against the others rather than the whole
    gang: with two ranks, the gang's median is the mean of the slow and the fast one."""
    medians = [median(times) for times in own_seconds]
    if len(medians) == 1:
        return [(medians[0], medians[0])]
    return [(m, median(medians[:r] + medians[r + 1 :])) for r, m in enumerate(medians)]


def stragglers(
    own_seconds: Sequence[Sequence[float]], options: StragglerOptions
) -> dict[int, float]:
    """The stragglers by rank, with their slowdowns (0.25: a median own step time 25 %
    above the others'): slower by more than `threshold`, and by `min_excess_seconds`."""
    found = {}
    for rank, (mine, others) in enumerate(against_others(own_seconds)):
        if others <= 0:
            continue
        slow = mine / others - 1
        if slow > options.threshold and mine - others >= options.min_excess_seconds:
            found[rank] = slow
    return found

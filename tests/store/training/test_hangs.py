"""The hang timeout and the straggler statistic (store.training.hangs), and their settings
as a train request takes them."""

from __future__ import annotations

import pydantic
import pytest

from trainctl.store.kinds.train import TrainRequest
from trainctl.store.training.hangs import (
    HangOptions,
    StragglerOptions,
    percentile,
    step_timeout,
    stragglers,
)


def test_the_percentile_is_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([5.0], 99) == 5.0


def test_the_timeout_gives_the_allowance_until_the_warmup_steps_are_seen() -> None:
    options = HangOptions(floor_seconds=2, multiplier=10, allowance_seconds=30, warmup_steps=3)
    assert step_timeout([], options) == 32
    assert step_timeout([5.0, 5.0], options) == 32  # a slow first step teaches nothing yet


def test_the_timeout_is_the_multiplier_times_the_p99_of_recent_steps_or_the_floor() -> None:
    options = HangOptions(floor_seconds=2, multiplier=10, warmup_steps=3, window=100)
    fast = [0.01] * 50
    assert step_timeout(fast, options) == 2  # 10 x 0.01 is below the floor
    slow = [0.5] * 98 + [1.0, 3.0]
    assert step_timeout(slow, options) == 10.0  # p99 of 100: the 99th, 1.0 s


def test_the_timeout_forgets_steps_older_than_the_window() -> None:
    options = HangOptions(floor_seconds=1, multiplier=4, warmup_steps=1, window=3)
    assert step_timeout([10.0, 1.0, 1.0, 1.0], options) == 4.0


def test_a_rank_persistently_slower_than_the_others_is_a_straggler() -> None:
    options = StragglerOptions(threshold=0.2, min_excess_seconds=0.0)
    even = [[1.0, 1.1, 0.9]] * 4
    assert stragglers(even, options) == {}
    slow = [*even[:3], [1.3, 1.3, 5.0]]
    assert stragglers(slow, options) == {3: pytest.approx(0.3)}


def test_one_slow_step_is_no_straggler_the_median_is() -> None:
    options = StragglerOptions(threshold=0.2, min_excess_seconds=0.0)
    assert stragglers([[1.0, 1.0, 1.0], [1.0, 9.0, 1.0]], options) == {}


def test_two_ranks_are_each_compared_with_the_other() -> None:
    options = StragglerOptions(threshold=0.2, min_excess_seconds=0.0)
    # Against the gang's median (1.5) the slow rank would be only 33 % slower.
    assert stragglers([[1.0], [2.0]], options) == {1: pytest.approx(1.0)}


def test_a_slowdown_smaller_than_the_excess_floor_is_jitter() -> None:
    options = StragglerOptions(threshold=0.2, min_excess_seconds=0.005)
    assert stragglers([[0.001], [0.003]], options) == {}
    assert stragglers([[0.01], [0.02]], options) == {1: pytest.approx(1.0)}


def test_a_train_request_has_both_watches_on_by_default() -> None:
    request = TrainRequest(steps=10)
    assert request.hang.enabled and request.stragglers.enabled
    assert request.hang.floor_seconds == 60 and request.hang.allowance_seconds == 600


@pytest.mark.parametrize(
    "changes",
    [
        {"hang": {"floor_seconds": 0}},
        {"hang": {"multiplier": 0.5}},
        {"hang": {"allowance_seconds": -1}},
        {"hang": {"warmup_steps": 0}},
        {"hang": {"timeout": 5}},
        {"stragglers": {"threshold": 0}},
        {"stragglers": {"window": 0}},
        {"stragglers": {"enabled": "yes"}},
    ],
)
def test_bad_watch_settings_are_refused_at_submit(changes: dict[str, object]) -> None:
    with pytest.raises(pydantic.ValidationError):
        TrainRequest(steps=10, **changes)

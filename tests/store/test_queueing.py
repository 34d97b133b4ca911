"""Queueing a run (store.queueing): the kinds are known above the database, which stores a
kind's name and nothing of its record, so a run of a kind no record is registered for is
refused before it reaches the database."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.stores import posix_store
from trainctl.store.db.records import RunToQueue
from trainctl.store.db.runs import RunStore
from trainctl.store.queueing import enqueue_pinned


def test_a_run_of_an_unregistered_kind_is_refused_and_none_of_its_request_is_queued(
    runs: RunStore, tmp_path: Path
) -> None:
    queue = [RunToQueue("benchmark", "benchmark", {}), RunToQueue("nope", "elsewhere", {})]
    with pytest.raises(ValueError, match=r"unknown run kind 'nope'; expected one of \('train'"):
        enqueue_pinned(queue, runs, posix_store(tmp_path / "checkpoints"))
    assert runs.list_runs() == ([], None)


def test_a_run_of_a_registered_kind_is_queued(runs: RunStore, tmp_path: Path) -> None:
    [run] = enqueue_pinned(
        [RunToQueue("benchmark", "benchmark", {})], runs, posix_store(tmp_path / "checkpoints")
    )
    assert runs.get(run.id).kind == "benchmark"

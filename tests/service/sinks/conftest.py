"""Fixtures of the sink tests: a run store on SQLite, and mirrors on it that a test ticks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.service.sinks.writes import MirrorFactory
from trainctl.service.sinks.base import Sink
from trainctl.service.sinks.mirror import SinkMirror
from trainctl.store.db.runs import RunStore
from trainctl.store.db.sinks import SinkStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunStore]:
    with RunStore(f"sqlite:///{tmp_path / 'trainctl.db'}") as run_store:
        run_store.create_all()
        yield run_store


@pytest.fixture
def mirror(store: RunStore) -> Iterator[MirrorFactory]:
    """Makes mirrors on `store` (their threads not started: a test ticks them) and stops them
    at the end, which closes their files."""
    made: list[SinkMirror] = []

    def make(sink: Sink, holder: str = "service-a", retry_max_seconds: float = 60) -> SinkMirror:
        cursors = SinkStore(store.engine, sink.name, holder, lease_seconds=30)
        made.append(
            SinkMirror(sink, store, cursors, poll_seconds=0.05, retry_max_seconds=retry_max_seconds)
        )
        return made[-1]

    yield make
    for sink_mirror in made:
        sink_mirror.stop()

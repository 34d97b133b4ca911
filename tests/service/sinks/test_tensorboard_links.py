"""The TensorBoard sink writes under folders users name (`<root>/<experiment>/<run id>`), in a
root others can write to: a link planted anywhere on that way, or swapped in between two
writes, ends the mirroring of the run, saying so, and nothing is written where it points
(docs/design/sinks.md, "Metrics sinks")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainctl.service.sinks.mirror import SinkMirror
from trainctl.service.sinks.tensorboard import TensorBoardSink
from trainctl.store.db.records import Run
from trainctl.store.db.runs import RunStore
from trainctl.store.db.sinks import SinkStore
from trainctl.store.kinds.train import TrainRequest, resolve_train

WORKER = "worker-1"


@pytest.fixture
def roots(tmp_path: Path) -> Path:
    (tmp_path / "roots" / "boards").mkdir(parents=True)
    return tmp_path / "roots"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    (tmp_path / "outside").mkdir()
    return tmp_path / "outside"


def start_run(store: RunStore, roots: Path, tensorboard_dir: str | None) -> Run:
    request = TrainRequest(
        experiment="exp", steps=20, trackers=["tensorboard"], tensorboard_dir=tensorboard_dir
    )
    plan = resolve_train(request, cuda_available=False, data_roots=[roots])
    store.enqueue("train", "exp", plan.model_dump(mode="json"))
    run = store.claim(WORKER, lease_seconds=60)
    assert run is not None
    return run


def log_steps(store: RunStore, run: Run, steps: range) -> None:
    for step in steps:
        metrics = {"kind": "train", "step": step, "total_steps": 20, "loss": 5.0}
        store.append_event(run.id, "metrics", metrics, worker_id=WORKER, attempt=run.attempt)


def mirror_of(store: RunStore, sink: TensorBoardSink) -> SinkMirror:
    cursors = SinkStore(store.engine, sink.name, "service-a", lease_seconds=30)
    return SinkMirror(sink, store, cursors, poll_seconds=0.05, retry_max_seconds=60)


def tick_until_idle(mirror: SinkMirror) -> None:
    for _ in range(100):
        if not mirror.tick():
            return
    raise AssertionError("still busy after 100 ticks")


def sink_errors(store: RunStore, run: Run) -> list[str]:
    logs = store.events(run.id, type="log")
    return [e.data["message"] for e in logs if e.data.get("sink") == "tensorboard"]


def everything_in(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*"))


@pytest.mark.parametrize("tensorboard_dir", ["boards", None], ids=["plan's", "default"])
@pytest.mark.parametrize("at", ["experiment", "run"])
def test_a_link_planted_on_the_way_to_the_event_file_is_never_written_through(
    store: RunStore,
    tmp_path: Path,
    roots: Path,
    outside: Path,
    tensorboard_dir: str | None,
    at: str,
) -> None:
    run = start_run(store, roots, tensorboard_dir)
    root = roots / "boards" if tensorboard_dir else tmp_path / "tensorboard"
    link = root / "exp" if at == "experiment" else root / "exp" / run.id
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(outside, link)
    log_steps(store, run, range(1, 4))
    mirror = mirror_of(store, TensorBoardSink(tmp_path / "tensorboard", [roots]))

    tick_until_idle(mirror)
    mirror.stop()

    assert everything_in(outside) == []
    [error] = sink_errors(store, run)
    assert "a link or a file stands on the way" in error


def test_a_link_swapped_in_between_two_writes_is_not_written_through(
    store: RunStore, tmp_path: Path, roots: Path, outside: Path
) -> None:
    """The first write made the folders; they are swapped for a link before the sink opens
    its file again (a service restart, or a file that failed)."""
    run = start_run(store, roots, "boards")
    log_steps(store, run, range(1, 3))
    sink = TensorBoardSink(tmp_path / "tensorboard", [roots])
    mirror = mirror_of(store, sink)
    tick_until_idle(mirror)
    sink.close()  # the next write opens a new file
    experiment = roots / "boards" / "exp"
    os.rename(experiment, tmp_path / "moved")
    os.symlink(outside, experiment)
    log_steps(store, run, range(3, 5))

    tick_until_idle(mirror)
    mirror.stop()

    assert everything_in(outside) == []
    assert len(everything_in(tmp_path / "moved" / run.id)) == 1  # the first file, only
    assert "a link or a file stands on the way" in sink_errors(store, run)[0]

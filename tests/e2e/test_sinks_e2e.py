"""Metrics out to TensorBoard and MLflow, end to end: the real service and worker train, the
service mirrors the event log into TensorBoard event files (read back with tbparse) and into
a real `mlflow server` (read back with MLflow's own client), across a service restart and a
tracking server that goes down mid-run."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from tbparse import SummaryReader

from tests.support.mlflow_server import MlflowServer
from tests.support.polling import poll
from tests.support.service_process import Service
from tests.support.tensorboard_files import float32, tensorboard_rows
from trainctl.service.schemas import EventPublic, RunPublic
from trainctl.service.sdk.client import TrainctlClient
from trainctl.service.sinks.base import scalars
from trainctl.store.vocabulary import TERMINAL_STATES

# tbparse 0.0.9 sorts with pandas' `inplace=`, which pandas 3.1 deprecates; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:The inplace keyword:DeprecationWarning")
FAST_SINKS = {"TRAINCTL_SINK_POLL_SECONDS": "0.2", "TRAINCTL_SINK_RETRY_MAX_SECONDS": "1"}
# Long enough that a server killed at the first mirrored step dies mid-run, even on a fast
# machine (a tiny model on synthetic tokens); short enough for a slow one.
STEPS = 100


def wait_done(client: TrainctlClient, run_id: str) -> RunPublic:
    return poll(
        lambda: (r := client.get_run(run_id)).state in TERMINAL_STATES and r,
        timeout=300,
        what=f"run {run_id} to finish",
        interval=0.5,
    )


def metric_rows(events: list[EventPublic], cast: Any = float) -> Counter[tuple[str, int, float]]:
    """The run's metrics as the sinks name them, (name, step, value), as often as logged."""
    return Counter(
        (name, e.data["step"], cast(value))
        for e in events
        if e.type == "metrics"
        for name, value in scalars(e.data)
    )


def sink_lines(events: list[EventPublic], sink: str) -> list[str]:
    return [e.data["message"] for e in events if e.type == "log" and e.data.get("sink") == sink]


def test_tensorboard_mirror_resumes_after_a_service_restart_without_repeating(
    service: Service,
) -> None:
    # The service's default tracker: a spec that names none is mirrored to TensorBoard.
    service.extra_env |= {"TRAINCTL_TRACKERS": "tensorboard", **FAST_SINKS}
    service.start()
    spec = {"experiment": "tb", "steps": 100_000, "checkpoint_every": 100_000, "log_every": 1,
            "data": {"source": "stdlib", "max_bytes": 1_000_000}, "sample_every": 3,
            "sample_prompts": ["def "], "sample_settings": {"max_new_tokens": 4}}  # fmt: skip
    with TrainctlClient(service.url) as client:
        run = client.submit("train", spec)
        assert run.spec["trackers"] == ["tensorboard"]
        folder = service.data_dir / "tensorboard" / "tb" / run.id
        poll(lambda: train_steps(folder) >= 4, 180, "steps in TensorBoard", interval=0.5)
    assert service.stop()  # the worker checkpoints and hands the run back

    service.start()
    with TrainctlClient(service.url) as client:
        restart = client.get_run(run.id).progress.step or 0
        poll(lambda: train_steps(folder) >= restart + 4, 180, "the next steps", interval=0.5)
        client.cancel_run(run.id)
        done = wait_done(client, run.id)
        assert done.state == "cancelled", done.error
        events = list(client.events(run.id))
    expected = metric_rows(events, cast=float32)
    # Every metric exactly once, across the two services' files: the cursor resumed.
    poll(lambda: tensorboard_rows(folder) == expected, 30, "TensorBoard to catch up", interval=0.5)
    assert len(list(folder.glob("events.out.tfevents.*"))) == 2
    texts = SummaryReader(str(folder)).text
    samples = [
        (e.data["step"], "def " + e.data["completion"]) for e in events if e.type == "sample"
    ]
    assert len(samples) >= 2 and set(texts["tag"]) == {"samples/0"}
    assert sorted(zip(texts["step"], texts["value"], strict=True)) == sorted(samples)


def train_steps(folder: Path) -> int:
    """How many train steps TensorBoard holds for the run so far."""
    return sum(1 for tag, _, _ in tensorboard_rows(folder) if tag == "train/loss")


def test_mlflow_mirror_catches_up_after_the_tracking_server_was_down(
    service: Service, mlflow_server: MlflowServer
) -> None:
    from mlflow.tracking import MlflowClient  # a few seconds to import: only this test needs it

    mlflow_server.launch()  # starting the two at once saves the slower one's start
    service.extra_env |= {
        "TRAINCTL_MLFLOW_URI": mlflow_server.url,
        "TRAINCTL_MLFLOW_TIMEOUT_SECONDS": "2",
        **FAST_SINKS,
    }
    service.start()
    mlflow_server.wait_ready()
    tracking = MlflowClient(mlflow_server.url)
    spec = {"experiment": "ml", "steps": STEPS, "log_every": 1, "checkpoint_every": STEPS,
            "data": {"source": "synthetic"}, "trackers": ["mlflow"]}  # fmt: skip
    with TrainctlClient(service.url) as client:
        run = client.submit("train", spec)
        mirrored = poll(lambda: mlflow_run(tracking, run.id), 120, "MLflow metrics", interval=0.2)
        mlflow_server.kill()
        assert client.get_run(run.id).state == "running"  # the outage starts mid-run

        done = wait_done(client, run.id)
        assert done.state == "succeeded", done.error
        poll(lambda: sink_lines(list(client.events(run.id)), "mlflow"), 30, "the log", interval=0.5)
    # The service restarts during the outage too: what it had not mirrored waits in the
    # database (the cursor, and the MLflow run it made), not in its memory.
    assert service.stop()
    mlflow_server.launch()
    service.start(workers=0)
    mlflow_server.wait_ready()

    with TrainctlClient(service.url) as client:
        events = list(client.events(run.id))
        expected = metric_rows(events)
        poll(
            lambda: (
                mlflow_metrics(tracking, mirrored) == expected
                and tracking.get_run(mirrored).info.status == "FINISHED"
            ),
            timeout=60,
            what="MLflow to catch up",
            interval=0.5,
        )
        lines = sink_lines(list(client.events(run.id)), "mlflow")

    (outage, back) = lines  # once per outage, not per event
    assert "not mirrored" in outage and "step" in outage
    # Killed between two requests it refuses connections; killed during one, it resets it.
    assert "connection refused" in outage or "connection reset" in outage, outage
    assert "mirroring again" in back
    assert len(mlflow_runs(tracking, run.id)) == 1  # the restarted service found its run
    mlflow_run_ = tracking.get_run(mirrored)
    assert mlflow_run_.info.run_name == run.id
    assert mlflow_run_.data.tags["trainctl.checkpoint"] == f"ml/step_{STEPS}"
    params = mlflow_run_.data.params
    assert params["steps"] == str(STEPS) and params["optimizer.muon_lr"] == "0.02"
    assert params["model.config.n_layers"] == str(done.spec["model"]["config"]["n_layers"])
    manifest = Path(tracking.download_artifacts(mirrored, "checkpoint/manifest.json"))
    checkpoint = service.data_dir / "checkpoints" / "ml" / f"step_{STEPS}" / "manifest.json"
    assert manifest.read_bytes() == checkpoint.read_bytes()


def mlflow_runs(tracking: Any, run_id: str) -> list[Any]:
    """The MLflow runs tagged with trainctl run `run_id`."""
    experiments = [e.experiment_id for e in tracking.search_experiments()]
    found: list[Any] = tracking.search_runs(
        experiments, filter_string=f"tags.`trainctl.run_id` = '{run_id}'"
    )
    return found


def mlflow_run(tracking: Any, run_id: str) -> str | None:
    """The MLflow run mirroring trainctl run `run_id`, once it has a loss."""
    found = mlflow_runs(tracking, run_id)
    if not found:
        return None
    mlflow_id: str = found[0].info.run_id
    losses = tracking.get_metric_history(mlflow_id, "train/loss")
    return mlflow_id if losses else None


def mlflow_metrics(tracking: Any, mlflow_id: str) -> Counter[tuple[str, int, float]]:
    keys = tracking.get_run(mlflow_id).data.metrics
    return Counter(
        (key, m.step, m.value) for key in keys for m in tracking.get_metric_history(mlflow_id, key)
    )

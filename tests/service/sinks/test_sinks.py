"""The sink mirrors (service/sinks): a run's events written as a worker writes them (and the
scores an evaluate run records on it), mirrored into real TensorBoard files read back with
tbparse and into a real `mlflow server`, and offered to tracking servers that are down or
hung, on real sockets."""

from __future__ import annotations

import http.server
import socket
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert
from tbparse import SummaryReader

from tests.service.sinks.writes import (
    MirrorFactory,
    finish,
    record_scores,
    run_until_idle,
    start_run,
    write_steps,
)
from tests.support.mlflow_server import MlflowServer
from tests.support.ports import free_port
from tests.support.stores import posix_store
from tests.support.tensorboard_files import float32, tensorboard_rows
from trainctl.service.sinks.base import scalars
from trainctl.service.sinks.mirror import BATCH_EVENTS
from trainctl.service.sinks.mlflow import MlflowSink
from trainctl.service.sinks.tensorboard import TensorBoardSink
from trainctl.store.db.records import Run
from trainctl.store.db.runs import RunStore
from trainctl.store.db.schema import run_events, write_transaction

# tbparse 0.0.9 sorts with pandas' `inplace=`, which pandas 3.1 deprecates; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:The inplace keyword:DeprecationWarning")


def tensorboard(tmp_path: Path) -> TensorBoardSink:
    return TensorBoardSink(tmp_path / "tensorboard", allowed_roots=[])


def logged_scalars(store: RunStore, run: Run) -> Counter[tuple[str, int, float]]:
    """The run's metrics as TensorBoard holds them: (name, step, value as a float32), each
    as often as the event log has it."""
    return Counter(
        (name, e.data["step"], float32(value))
        for e in store.events(run.id, type="metrics", limit=100_000)
        for name, value in scalars(e.data)
    )


def sink_log(store: RunStore, run: Run, sink: str) -> list[dict[str, Any]]:
    return [e.data for e in store.events(run.id, type="log") if e.data.get("sink") == sink]


def test_tensorboard_files_hold_the_metrics_and_samples_of_the_event_log(
    store: RunStore, tmp_path: Path, mirror: MirrorFactory
) -> None:
    run = start_run(store, ["tensorboard"])
    write_steps(store, run, range(1, 21))
    finish(store, run)
    tb = mirror(tensorboard(tmp_path))

    run_until_idle(tb)

    folder = tmp_path / "tensorboard" / "exp" / run.id
    scalars_written = tensorboard_rows(folder)
    assert scalars_written == logged_scalars(store, run)
    names = {"train/loss", "train/lr/muon", "train/lr/adamw", "train/grad_norm",
             "train/tokens_per_sec", "val/loss", "val/ppl", "val/bits_per_byte"}  # fmt: skip
    tags = {tag for tag, _, _ in scalars_written}
    assert names <= tags and not {"train/lr_muon", "train/lr_adamw"} & tags
    lr_steps = sorted(step for tag, step, _ in scalars_written if tag == "train/lr/muon")
    assert lr_steps == list(range(1, 21))  # the old name and the new are one series
    texts = SummaryReader(str(folder)).text
    assert sorted(zip(texts["tag"], texts["step"], texts["value"], strict=True)) == [
        ("samples/0", 10, "def x10"),
        ("samples/0", 20, "def x20"),
        ("samples/1", 10, "import x10"),
        ("samples/1", 20, "import x20"),
    ]
    assert tb.cursors.is_done(run.id)


def test_a_restarted_mirror_goes_on_from_its_cursor_without_repeating_anything(
    store: RunStore, tmp_path: Path, mirror: MirrorFactory
) -> None:
    run = start_run(store, ["tensorboard"])
    write_steps(store, run, range(1, 8))
    first = mirror(tensorboard(tmp_path), holder="service-a")
    run_until_idle(first)
    first.stop()  # the service stops; its file stays

    write_steps(store, run, range(8, 21))
    finish(store, run)
    second = mirror(tensorboard(tmp_path), holder="service-b")
    run_until_idle(second)
    second.stop()

    folder = tmp_path / "tensorboard" / "exp" / run.id
    assert len(list(folder.glob("events.out.tfevents.*"))) == 2
    assert tensorboard_rows(folder) == logged_scalars(store, run)


def test_eval_scores_reach_tensorboard_at_their_step_even_after_the_run_ended(
    store: RunStore, tmp_path: Path, mirror: MirrorFactory
) -> None:
    run = start_run(store, ["tensorboard"])
    write_steps(store, run, range(1, 11))
    record_scores(store, run, 10, acc=0.5)  # scored while the run trains
    write_steps(store, run, range(11, 21))
    finish(store, run)
    tb = mirror(tensorboard(tmp_path))
    run_until_idle(tb)
    assert tb.cursors.is_done(run.id)

    record_scores(store, run, 20, acc=0.625)  # the last checkpoint, scored after the end
    run_until_idle(tb)

    folder = tmp_path / "tensorboard" / "exp" / run.id
    written = tensorboard_rows(folder)
    assert written == logged_scalars(store, run)  # every metric once, the late ones too
    acc = sorted((step, value) for tag, step, value in written if tag == "eval/arc_easy/acc")
    assert acc == [(10, 0.5), (20, 0.625)]
    assert {tag for tag, _, _ in written if tag.startswith("eval/")} == {
        "eval/arc_easy/acc", "eval/arc_easy/acc_norm", "eval/arc_easy/bits_per_byte",
        "eval/mmlu_anatomy/acc",
    }  # fmt: skip
    assert tb.cursors.is_done(run.id)


@pytest.mark.slow
def test_eval_scores_reach_mlflow_under_their_names_at_their_step_even_after_the_run_ended(
    store: RunStore, tmp_path: Path, mirror: MirrorFactory, mlflow_server: MlflowServer
) -> None:
    from mlflow.tracking import MlflowClient  # a few seconds to import: only this test needs it

    mlflow_server.launch()
    run = start_run(store, ["mlflow"])
    write_steps(store, run, range(1, 11))
    record_scores(store, run, 10, acc=0.5)
    finish(store, run)
    mlflow_server.wait_ready()
    sink = MlflowSink(mlflow_server.url, posix_store(tmp_path / "checkpoints"), timeout=10)
    ml = mirror(sink)
    run_until_idle(ml)
    assert ml.cursors.is_done(run.id)

    record_scores(store, run, 20, acc=0.625)  # a later checkpoint's scores, after the end
    run_until_idle(ml)

    cursor = ml.cursors.cursor(run.id)
    assert cursor is not None and ml.cursors.is_done(run.id)
    tracking = MlflowClient(mlflow_server.url)
    mlflow_id = cursor.memo["run_id"]
    history = tracking.get_metric_history(mlflow_id, "eval/arc_easy/acc")
    assert sorted((m.step, m.value) for m in history) == [(10, 0.5), (20, 0.625)]
    metrics = tracking.get_run(mlflow_id).data.metrics
    assert metrics["eval/mmlu_anatomy/acc"] == 0.25 and "train/loss" in metrics
    assert not any("evaluate_run" in key for key in metrics)
    assert tracking.get_run(mlflow_id).info.status == "FINISHED"


@pytest.mark.slow
def test_a_backlog_is_worked_off_a_bounded_slice_per_tick(
    store: RunStore, tmp_path: Path, mirror: MirrorFactory
) -> None:
    run = start_run(store, ["tensorboard"])
    rows = [
        {"run_id": run.id, "type": "metrics", "data": {"kind": "train", "step": i, "loss": 1.0},
         "created_at": run.created_at}
        for i in range(1, 100_001)
    ]  # fmt: skip
    with write_transaction(store.engine) as conn:  # 100k events, faster than a worker writes
        conn.execute(insert(run_events), rows)
    tb = mirror(tensorboard(tmp_path))

    for ticks in (1, 2):
        assert tb.tick() is True  # more is left: the next tick comes at once
        cursor = tb.cursors.cursor(run.id)
        taken = store.events(run.id, limit=ticks * BATCH_EVENTS)
        assert cursor is not None and cursor.last_event_id == taken[-1].id


def test_a_tracking_server_that_is_down_is_logged_once_and_the_events_wait(
    store: RunStore, tmp_path: Path, mirror: MirrorFactory
) -> None:
    run = start_run(store, ["mlflow"])
    write_steps(store, run, range(1, 6))
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    sink = MlflowSink(down, posix_store(tmp_path / "checkpoints"), timeout=2)
    ml = mirror(sink, retry_max_seconds=0.01)

    for _ in range(5):
        ml.tick()
        ml._backoff.clear()  # do not wait out the delay: try again at once
    write_steps(store, run, range(6, 21))
    finish(store, run)  # the run itself never noticed
    ml.tick()

    (line,) = sink_log(store, run, "mlflow")
    assert line["level"] == "warning"
    assert "events from id" in line["message"] and "(step 1 on) not mirrored" in line["message"]
    assert "connection refused" in line["message"] and "retried after 1 s" in line["message"]
    cursor = ml.cursors.cursor(run.id)
    assert cursor is not None and cursor.last_event_id == 0 and cursor.outage_since is not None
    assert store.get(run.id).state == "succeeded"


@pytest.mark.slow
def test_a_hung_tracking_server_costs_the_mirror_its_timeout_and_is_logged_once(
    store: RunStore, tmp_path: Path, mirror: MirrorFactory
) -> None:
    run = start_run(store, ["mlflow"])
    write_steps(store, run, range(1, 3))
    with socket.socket() as hung:  # accepts connections (the kernel does) and never answers
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)
        uri = f"http://127.0.0.1:{hung.getsockname()[1]}"
        sink = MlflowSink(uri, posix_store(tmp_path / "checkpoints"), timeout=0.5)
        ml = mirror(sink)
        ml.tick()
        ml._backoff.clear()
        ml.tick()

    (line,) = sink_log(store, run, "mlflow")
    assert "no answer in time" in line["message"]


class HtmlPage(http.server.BaseHTTPRequestHandler):
    """What a proxy in front of a tracking server that is down may answer: 200 and a page."""

    def do_GET(self) -> None:
        self._page()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._page()

    def _page(self) -> None:
        body = b"<html><body>upstream is restarting</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass  # no access lines in the test output


def test_a_page_instead_of_an_answer_counts_as_the_server_being_down(
    store: RunStore, tmp_path: Path, mirror: MirrorFactory
) -> None:
    run = start_run(store, ["mlflow"])
    write_steps(store, run, range(1, 3))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HtmlPage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        uri = f"http://127.0.0.1:{server.server_address[1]}"
        ml = mirror(MlflowSink(uri, posix_store(tmp_path / "checkpoints"), timeout=2))
        ml.tick()
    finally:
        server.shutdown()
        server.server_close()

    (line,) = sink_log(store, run, "mlflow")
    assert "answered /api/2.0/mlflow/experiments/get-by-name with no JSON" in line["message"]


def test_mlflow_named_where_the_service_has_no_server_waits_and_says_why(
    store: RunStore, tmp_path: Path, mirror: MirrorFactory
) -> None:
    run = start_run(store, ["mlflow"])
    write_steps(store, run, range(1, 3))
    ml = mirror(MlflowSink(None, posix_store(tmp_path / "checkpoints"), timeout=1))

    ml.tick()

    (line,) = sink_log(store, run, "mlflow")
    assert "set TRAINCTL_MLFLOW_URI" in line["message"]


def test_a_sink_follows_only_the_runs_that_name_it(
    store: RunStore, tmp_path: Path, mirror: MirrorFactory
) -> None:
    run = start_run(store, ["mlflow"])
    write_steps(store, run, range(1, 3))
    tb = mirror(tensorboard(tmp_path))

    run_until_idle(tb)

    assert tb.cursors.cursor(run.id) is None
    assert not (tmp_path / "tensorboard").exists()

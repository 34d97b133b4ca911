"""The wandb tracker: named per run or by the service, refused without a project, linked from
the run's page, never imported without the setting, and, through the mirror into real offline
W&B files read back with wandb's own reader, eval scores under their names and one W&B run
across two services without a repeated step (tests/e2e/test_wandb_e2e.py trains for real)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from tests.service.sinks.writes import (
    MirrorFactory,
    finish,
    record_scores,
    run_until_idle,
    start_run,
    write_steps,
)
from tests.support.stores import posix_store
from tests.support.wandb_files import history_rows, wandb_files
from trainctl.service.app import create_app
from trainctl.service.settings import Settings
from trainctl.service.sinks.base import scalars
from trainctl.service.sinks.wandb import WandbConfig, WandbSink, wandb_id
from trainctl.store.db.runs import RunStore

CPU_TRAIN = {"experiment": "exp", "steps": 10, "device": "cpu"}
REPO = Path(__file__).resolve().parents[3]


def serve(tmp_path: Path, **settings: Any) -> TestClient:
    return TestClient(create_app(Settings(data_dir=tmp_path, workers=0, **settings)),
                      base_url="http://localhost")  # fmt: skip


def test_wandb_without_a_project_is_refused_naming_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serve(tmp_path) as client:
        response = client.post("/runs/train", json=CPU_TRAIN | {"trackers": ["wandb"]})
    assert response.status_code == 422
    assert "set TRAINCTL_WANDB_PROJECT" in response.json()["detail"]

    monkeypatch.setenv("TRAINCTL_TRACKERS", "wandb")
    monkeypatch.delenv("TRAINCTL_WANDB_PROJECT", raising=False)
    with pytest.raises(ValidationError, match="TRAINCTL_WANDB_PROJECT is not set"):
        Settings()


def test_a_run_mirrored_to_wandb_links_to_its_wandb_page(tmp_path: Path) -> None:
    # Queued runs with no worker: nothing is sent, so nothing reaches for W&B's server.
    settings = {"wandb_project": "lm", "wandb_entity": "team", "trackers": ["wandb"]}
    with serve(tmp_path, **settings) as client:
        mirrored = client.post("/runs/train", json=CPU_TRAIN).json()
        not_mirrored = client.post(
            "/runs/train", json=CPU_TRAIN | {"experiment": "other", "trackers": []}
        ).json()
        elsewhere = client.post(
            "/runs/train", json=CPU_TRAIN | {"experiment": "own", "wandb_project": "ablations"}
        ).json()
        untracked = client.post(
            "/runs/train", json=CPU_TRAIN | {"trackers": ["tensorboard"], "wandb_project": "x"}
        )
        listed = {r["id"]: r for r in client.get("/runs").json()["items"]}

    page = f"https://wandb.ai/team/lm/runs/{wandb_id(mirrored['id'])}"
    assert mirrored["spec"]["trackers"] == ["wandb"] and mirrored["wandb_url"] == page
    assert listed[mirrored["id"]]["wandb_url"] == page
    assert not_mirrored["wandb_url"] is None and listed[not_mirrored["id"]]["wandb_url"] is None
    # The project is pinned in the plan: the service's, or the run's own.
    assert (
        mirrored["spec"]["wandb_project"] == "lm" and not_mirrored["spec"]["wandb_project"] is None
    )
    assert elsewhere["wandb_url"] == f"https://wandb.ai/team/ablations/runs/{elsewhere['id']}"
    assert untracked.status_code == 422
    assert "wandb_project: the run has no 'wandb' tracker" in untracked.json()["detail"]

    # A self-hosted server's page; offline, or without an entity, there is none to link to.
    with serve(tmp_path / "b", **settings, wandb_base_url="https://wandb.lab:8443/") as client:
        assert (
            client.post("/runs/train", json=CPU_TRAIN)
            .json()["wandb_url"]
            .startswith("https://wandb.lab:8443/team/lm/runs/")
        )
    with serve(tmp_path / "c", **settings, wandb_mode="offline") as client:
        assert client.post("/runs/train", json=CPU_TRAIN).json()["wandb_url"] is None


NOT_IMPORTED = """
import sys, time
from pathlib import Path
from fastapi.testclient import TestClient
from trainctl.service.app import create_app
from trainctl.service.settings import Settings

data = Path(sys.argv[1])
app = create_app(Settings(data_dir=data, workers=0, trackers=["tensorboard"],
                          sink_poll_seconds=0.05))
with TestClient(app, base_url="http://localhost") as client:
    run = client.post("/runs/train", json={"experiment": "exp", "steps": 2, "device": "cpu"})
    assert run.status_code == 202, run.text
    store = app.state.runs
    claimed = store.claim("w", lease_seconds=60)
    for step in (1, 2):
        store.append_event(claimed.id, "metrics", {"kind": "train", "step": step,
                           "total_steps": 2, "loss": 1.0}, worker_id="w", attempt=1)
    store.finish(claimed.id, "w", 1, "succeeded", result={"step": 2})
    folder = data / "tensorboard" / "exp" / claimed.id
    deadline = time.monotonic() + 60
    while not list(folder.glob("events.out.tfevents.*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(folder.glob("events.out.tfevents.*")), "not mirrored"
    assert client.get(f"/runs/{claimed.id}").json()["wandb_url"] is None
print(sorted(m for m in sys.modules if m == "wandb" or m.startswith("wandb.")))
"""


def test_without_the_setting_the_service_never_imports_wandb(tmp_path: Path) -> None:
    """The service's app, a train run mirrored to TensorBoard through it: no wandb module."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINCTL_", "WANDB_"))}
    proc = subprocess.run(
        [sys.executable, "-c", NOT_IMPORTED, str(tmp_path)],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


@pytest.fixture(autouse=True)
def wandb_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B's client stages tables under WANDB_DATA_DIR (default ~/.local/share/wandb)."""
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb-data"))


def offline_sink(tmp_path: Path, store: RunStore) -> WandbSink:
    config = WandbConfig(project="unit", entity=None, mode="offline", base_url=None,
                         dir=tmp_path, timeout=60)  # fmt: skip
    return WandbSink(config, posix_store(tmp_path / "checkpoints"), store)


def test_wandb_gets_every_metric_once_across_two_services_and_late_eval_scores(
    store: RunStore,
    tmp_path: Path,
    mirror: MirrorFactory,
) -> None:
    run = start_run(store, ["wandb"])
    write_steps(store, run, range(1, 11))
    record_scores(store, run, 10, acc=0.5)  # scored while the run trains
    first = mirror(offline_sink(tmp_path, store))
    run_until_idle(first)
    first.stop()  # the service stops; its W&B run is left to be resumed

    # The next attempt resumes from step 5's checkpoint and repeats steps 6 to 10.
    write_steps(store, run, range(6, 21))
    finish(store, run)
    second = mirror(offline_sink(tmp_path, store), holder="service-b")
    run_until_idle(second)
    assert second.cursors.is_done(run.id)
    record_scores(store, run, 20, acc=0.625)  # the last checkpoint, scored after the end
    run_until_idle(second)
    second.stop()

    files = wandb_files(tmp_path, wandb_id(run.id))
    assert len(files) == 3  # one W&B run, opened by each service and again for the late score
    assert {r["run_id"] for f in files for r in f.runs} == {wandb_id(run.id)}
    steps = [row["_step"] for f in files for row in f.history]
    assert steps == sorted(set(steps)), "a step was logged twice or out of order"
    rows = history_rows(files)
    expected: dict[tuple[str, int], float] = {}
    for e in store.events(run.id, type="metrics", limit=10_000):
        if e.data["kind"] != "eval":
            for name, value in scalars(e.data):
                expected.setdefault((name, e.data["step"]), value)
    assert {k: rows.get(k) for k in expected} == expected
    scores = sorted(
        (row["eval/step"], row["eval/arc_easy/acc"])
        for f in files
        for row in f.history
        if "eval/arc_easy/acc" in row
    )
    assert scores == [(10, 0.5), (20, 0.625)]
    assert all(f.exits for f in files)


def test_without_a_key_wandb_waits_saying_so_once_and_gets_everything_once_after(
    store: RunStore,
    tmp_path: Path,
    mirror: MirrorFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An outage as the mirror sees it: online with no API key anywhere, the client cannot
    open the run; the events wait in the log, and the next service (offline here) sends them
    in order, once, and says so."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc
    monkeypatch.setenv("NETRC", str(tmp_path / "home" / ".netrc"))
    run = start_run(store, ["wandb"])
    write_steps(store, run, range(1, 6))
    online = WandbConfig(project="unit", entity=None, mode="online",
                         base_url="http://127.0.0.1:9", dir=tmp_path, timeout=5)  # fmt: skip
    sink = WandbSink(online, posix_store(tmp_path / "checkpoints"), store)
    down = mirror(sink, retry_max_seconds=1)
    for _ in range(2):
        down.tick()
    cursor = down.cursors.cursor(run.id)
    assert cursor is not None and cursor.last_event_id == 0 and cursor.outage_since is not None
    down.stop()

    write_steps(store, run, range(6, 11))
    finish(store, run)
    back = mirror(offline_sink(tmp_path, store), holder="service-b")
    run_until_idle(back)
    run_until_idle(back)  # past its own "mirroring again" line, the cursor is done
    assert back.cursors.is_done(run.id)

    (outage, recovered) = [e.data["message"] for e in store.events(run.id, type="log")
                           if e.data.get("sink") == "wandb"]  # fmt: skip
    assert "not mirrored: no W&B API key" in outage and "wandb login" in outage
    assert "mirroring again" in recovered
    (read,) = wandb_files(tmp_path, wandb_id(run.id))
    assert [row["_step"] for row in read.history] == list(range(1, 11))


def test_a_loss_health_rewind_reopens_the_wandb_run_from_the_step_it_went_back_to(
    store: RunStore, tmp_path: Path, mirror: MirrorFactory
) -> None:
    run = start_run(store, ["wandb"])
    write_steps(store, run, range(1, 15))  # a spike at step 15: back to step_10's checkpoint
    rewind = {"step": 15, "loss": 9.5, "reason": "spike", "action": "rewind", "statistic": 7.0,
              "window": [28, 30], "rewound_to": 10}  # fmt: skip
    store.append_event(run.id, "log", {"level": "warning", "message": "health: rewound",
                                       "health": rewind})  # fmt: skip
    for step in range(11, 17):  # steps 11 to 16 trained again, without the window
        again = {"kind": "train", "step": step, "total_steps": 20, "loss": 3.0 - step / 100}
        store.append_event(run.id, "metrics", again)
    finish(store, run)
    sink_mirror = mirror(offline_sink(tmp_path, store))
    run_until_idle(sink_mirror)
    sink_mirror.stop()

    before, after = wandb_files(tmp_path, wandb_id(run.id))
    assert [row["_step"] for row in before.history] == list(range(1, 15))
    (branch,) = {json.dumps(r.get("branch_point"), sort_keys=True) for r in after.runs}
    assert json.loads(branch) == {"metric": "_step", "run": wandb_id(run.id), "value": 10}
    assert [(row["_step"], row["train/loss"]) for row in after.history] == [
        (step, pytest.approx(3.0 - step / 100)) for step in range(11, 17)
    ]

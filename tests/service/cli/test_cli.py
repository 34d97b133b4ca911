"""`trainctl` against the real service (`python -m trainctl.service` with a worker process)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.service.cli.invoke import NO_CONFIG, trainctl
from tests.support.leftovers import RunsToStop
from tests.support.service_process import REPO, Service, StartService
from trainctl.store.data.shards import write_shard

TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(3000))


@pytest.fixture(scope="module")
def service(start_service: StartService, tmp_path_factory: pytest.TempPathFactory) -> Service:
    """The service with a worker, its data dir also its data root: prepare reads a corpus
    there."""
    root = tmp_path_factory.mktemp("cli")
    (root / "corpus").mkdir()
    return start_service(workers=1, data_dir=root, TRAINCTL_DATA_ROOTS=str(root))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_prepare_train_watch_validate_and_download_through_the_cli(
    service: Service, tmp_path: Path
) -> None:
    corpus = service.data_dir / "corpus"
    for i in range(20):  # 20 documents: one of them held out for validation
        (corpus / f"fox{i:02}.txt").write_text(TEXT[: len(TEXT) // 10])
    dataset = service.data_dir / "fox"

    code, out, err = trainctl(service, "data", "prepare", str(corpus), "--out", str(dataset))
    assert code == 0 and out.endswith(f"train on it with --dataset {dataset}\n"), err

    code, out, err = trainctl(
        service, "submit", "train", "-e", "cli", "--steps", "30", "--checkpoint-every", "10",
        "--dataset", str(dataset), "--set", "batch.seq_len=64", "--idempotency-key", "cli-1",
        "--watch",
    )  # fmt: skip
    assert code == 0, err
    run_id = out.split("submitted train run ")[1].split()[0]
    assert f"run {run_id} succeeded" in out and "saved checkpoint cli/step_30" in err
    code, out, _ = trainctl(service, "runs", "show", run_id)
    run = json.loads(out)
    assert run["spec"]["data"]["source"] == "dataset" and run["spec"]["batch"]["seq_len"] == 64
    assert run_id[:8] in trainctl(service, "runs", "list", "--kind", "train")[1]  # its short id

    code, out, err = trainctl(
        service, "submit", "validate", "--checkpoint", "latest", "-e", "cli",
        "--dataset", str(dataset), "--seq-len", "64", "--watch",
    )  # fmt: skip
    assert code == 0 and "succeeded: loss" in out, err

    code, out, _ = trainctl(service, "checkpoints", "list", "-e", "cli")
    assert "step_30" in out and "best" in out
    dest = tmp_path / "weights"
    dest.mkdir()
    (dest / "model.safetensors.part").write_bytes(b"\0" * 10)  # wrong bytes from a dead link
    code, out, err = trainctl(service, "checkpoints", "download", "cli", "latest", "-o", str(dest))
    assert code == 1 and "does not match the manifest" in err  # verified, and not kept
    code, out, err = trainctl(service, "checkpoints", "download", "cli", "latest", "-o", str(dest))
    assert code == 0 and "sha256 verified" in out, err
    latest = json.loads(trainctl(service, "checkpoints", "latest", "-e", "cli", "--json")[1])
    assert latest["tag"] == "step_30"
    for f in latest["files"]:
        assert sha256(dest / f["name"]) == f["sha256"]

    code, out, _ = trainctl(service, "checkpoints", "prune", "cli", "--keep-last", "1", "--dry-run")
    assert code == 0 and out.startswith("would delete: step_20")


@pytest.mark.slow
def test_cancel_and_watch_a_run_that_does_not_finish(
    service: Service, stop_runs: RunsToStop
) -> None:
    code, out, _ = trainctl(
        service, "submit", "benchmark", "--steps", "100000", "--warmup-steps", "0",
        "--set", 'model.overrides={"n_layers": 1}', "--json",
    )  # fmt: skip
    run = json.loads(out)
    stop_runs.track(run["id"])
    assert code == 0 and run["spec"]["model"]["overrides"] == {"n_layers": 1}

    code, out, _ = trainctl(service, "runs", "cancel", run["id"])
    assert code == 0 and run["id"] in out
    code, out, err = trainctl(service, "runs", "watch", run["id"])

    assert code == 1 and err.endswith(f"\nerror: run {run['id']} was cancelled\n")  # after the bar
    assert out == ""


@pytest.mark.slow
def test_every_error_is_one_line_and_its_exit_code_says_what_kind(service: Service) -> None:
    cases = [
        (service, ["runs", "show", "nope"], 1, "error: run 'nope' does not exist"),
        (service, ["checkpoints", "show", "nope", "step_1"], 1, "error: "),
        (service, ["runs", "shw"], 2, "error: No such command 'shw'"),
        (service, ["runs", "list", "--limit", "many"], 2, "error: Invalid value for '--limit'"),
        (service, ["submit", "train", "--steps", "0"], 2, "error: body.steps"),  # a 422
        (None, ["runs", "list"], 3, "error: cannot reach trainctl at http://127.0.0.1:9/"),
    ]
    for svc, args, expected, start in cases:
        code, out, err = trainctl(svc, *args)
        assert code == expected and err.startswith(start), (args, code, err)
        assert err.count("\n") == 1 and "Traceback" not in out + err


def test_a_command_group_without_a_command_prints_its_help_whole() -> None:
    code, _, err = trainctl(None, "runs")

    assert code == 2 and err.startswith("Usage: trainctl runs [OPTIONS] COMMAND")
    assert "\n  logs " in err and "error:" not in err


@pytest.mark.slow
def test_serve_refuses_an_open_host_without_a_token_and_worker_execs_python_m_worker() -> None:
    code, _, err = trainctl(None, "serve", "--host", "0.0.0.0", "--port", "1")
    worker = subprocess.run(
        [sys.executable, "-m", "trainctl.service.cli", "worker", "--help"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip

    assert code == 2 and "refusing to serve on 0.0.0.0" in err
    assert worker.returncode == 0 and "usage: python -m trainctl.worker" in worker.stdout


@pytest.fixture(scope="module")
def short_run(service: Service) -> str:
    """A short train run on synthetic tokens that saves step_4 and step_8; just queued."""
    code, out, err = trainctl(
        service, "submit", "train", "-e", "short", "--steps", "8", "--checkpoint-every", "4",
        "--source", "synthetic", "--set", "batch.seq_len=32", "--json",
    )  # fmt: skip
    assert code == 0, err
    run_id: str = json.loads(out)["id"]
    return run_id


@pytest.mark.slow
def test_runs_logs_follow_prints_the_lines_as_they_come_until_the_run_ends(
    service: Service, short_run: str
) -> None:
    code, followed, err = trainctl(service, "runs", "logs", short_run, "--follow")
    assert code == 0, err
    assert "saved checkpoint short/step_8" in followed  # one of the last lines the run logs

    code, logged, _ = trainctl(service, "runs", "logs", short_run)
    assert code == 0 and logged == followed
    assert re.match(r"\d{4}-\d\d-\d\dT[\d:.]+\+00:00 INFO    started on worker ", logged)


@pytest.mark.slow
def test_runs_metrics_prints_a_table_csv_or_json(service: Service, short_run: str) -> None:
    code, out, _ = trainctl(service, "runs", "watch", short_run, "--json")
    assert code == 0 and json.loads(out)["state"] == "succeeded"

    code, out, _ = trainctl(service, "runs", "metrics", short_run, "--kind", "train", "--csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and rows and {r["kind"] for r in rows} == {"train"}
    assert out.startswith("event_id,created_at,kind,") and rows[-1]["step"] == "8"
    assert float(rows[-1]["loss"]) > 0
    code, out, _ = trainctl(service, "runs", "metrics", short_run, "--kind", "train", "--json")
    assert [m["step"] for m in json.loads(out)] == [int(r["step"]) for r in rows]
    code, out, _ = trainctl(service, "runs", "metrics", short_run)
    header = out.splitlines()[0].split()
    assert code == 0 and {"KIND", "STEP", "LOSS"} <= set(header) and "EVENT_ID" not in header


@pytest.mark.slow
def test_checkpoints_delete_asks_first_unless_told_yes(service: Service, short_run: str) -> None:
    assert trainctl(service, "runs", "watch", short_run)[0] == 0

    code, out, err = trainctl(service, "checkpoints", "delete", "short", "step_4", input="n\n")
    assert code == 1 and out == ""
    assert err.startswith("delete checkpoint short/step_4 (step 4, ") and "nothing deleted" in err
    code, out, err = trainctl(service, "checkpoints", "delete", "short", "step_4", input="")
    assert code == 1 and "nothing deleted" in err  # no answer at all is no
    assert "step_4" in trainctl(service, "checkpoints", "list", "-e", "short")[1]

    code, out, err = trainctl(service, "checkpoints", "delete", "short", "step_4", input="y\n")
    assert code == 0 and out == "deleted short/step_4\n", err
    code, out, err = trainctl(service, "checkpoints", "delete", "short", "best", "--yes")
    assert code == 0 and out == "deleted short/best\n" and err == ""
    assert "step_4" not in trainctl(service, "checkpoints", "list", "-e", "short")[1]

    code, _, err = trainctl(service, "checkpoints", "delete", "short", "step_4", input="y\n")
    assert code == 1 and err.startswith("error: ") and "[y/N]" not in err  # gone: not asked


@pytest.mark.slow
def test_workers_lists_the_service_worker(service: Service) -> None:
    code, out, _ = trainctl(service, "workers")
    header = ["ID", "NODE", "HOST", "PID", "DEVICE", "GPUS", "CPUS", "STATE", "RUN", "LAST"]
    assert code == 0 and out.split()[: len(header)] == header
    assert "alive" in out

    code, out, _ = trainctl(service, "workers", "--json")
    assert code == 0 and any(
        w["alive"] and w["device"] and w["node_name"] and w["cpus"] >= 1 for w in json.loads(out)
    )
    # `workers drain ID` (the module's worker must live on: an unknown id, refused).
    code, out, err = trainctl(service, "workers", "drain", "nobody")
    assert code == 1 and out == "" and "worker 'nobody' is not registered" in err


@pytest.mark.slow
def test_submit_json_watch_prints_only_json_and_exits_1_when_the_run_fails(
    service: Service,
) -> None:
    # A shard submit accepts (its header is sound) that fails at the worker: its token ids
    # are beyond every vocabulary, which only reading every token tells.
    write_shard(service.data_dir / "beyond.bin", np.full(20_000, 1 << 21), dtype="uint32")

    code, out, err = trainctl(
        service, "submit", "train", "-e", "beyond", "--steps", "5", "--data", "beyond.bin",
        "--json", "--watch",
    )  # fmt: skip

    documents = [json.loads(line) for line in out.splitlines()]  # JSON lines, nothing else
    assert [d["state"] for d in documents] == ["queued", "failed"], err
    assert documents[0]["id"] == documents[1]["id"]
    assert f"data holds token id {1 << 21}" in documents[1]["error"]
    assert code == 1 and err.splitlines()[-1].startswith(f"error: run {documents[0]['id']} failed")


@pytest.mark.slow
def test_ctrl_c_stops_watching_with_130_and_the_run_goes_on(
    service: Service, stop_runs: RunsToStop
) -> None:
    _, out, _ = trainctl(
        service, "submit", "benchmark", "--steps", "100000", "--warmup-steps", "0", "--json"
    )
    run_id = stop_runs.track(json.loads(out)["id"])
    env = {**os.environ, "TRAINCTL_URL": service.url, "XDG_CONFIG_HOME": str(NO_CONFIG)}
    with subprocess.Popen(
        [sys.executable, "-m", "trainctl.service.cli", "runs", "watch", run_id],
        cwd=REPO, env=env, stderr=subprocess.PIPE, text=True,
    ) as watch:  # fmt: skip
        assert watch.stderr is not None
        try:
            assert watch.stderr.readline().startswith("  state: ")  # it follows the events
            watch.send_signal(signal.SIGINT)
            assert watch.wait(timeout=60) == 130
        finally:
            watch.kill()
        assert watch.stderr.read().endswith(
            f"error: stopped watching; run {run_id} goes on (trainctl runs cancel {run_id})\n"
        )
    state = json.loads(trainctl(service, "runs", "show", run_id)[1])["state"]
    assert state in ("queued", "running")
    assert trainctl(service, "runs", "cancel", run_id)[0] == 0

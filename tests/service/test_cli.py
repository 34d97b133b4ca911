"""`trainctl` against the real service (`python -m trainctl.service` with a worker process)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.e2e.conftest import REPO, Service
from trainctl.service.cli import app
from trainctl.service.cli.data import prepare_shards
from trainctl.store.tokens import read_shard

TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(3000))


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    root = tmp_path_factory.mktemp("cli")
    (root / "corpus").mkdir()
    svc = Service(root, extra_env={"TRAINCTL_DATA_ROOTS": str(root)})
    svc.start()
    yield svc
    svc.stop()


def trainctl(service: Service | None, *args: str) -> tuple[int, str, str]:
    env = {"TRAINCTL_URL": service.url if service else "http://127.0.0.1:9"}
    result = CliRunner().invoke(app, list(args), env=env)
    return result.exit_code, result.stdout, result.stderr


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_data_prepare_splits_text_into_train_and_val_shards(tmp_path: Path) -> None:
    (tmp_path / "in" / "sub").mkdir(parents=True)
    (tmp_path / "in" / "a.txt").write_text("a" * 9000)
    (tmp_path / "in" / "sub" / "b.txt").write_text("b" * 1000)
    (tmp_path / "in" / ".hidden").write_text("never read")

    shards = prepare_shards([tmp_path / "in"], tmp_path / "out", 0.1, shard_tokens=4096)

    assert [(s.path.name, s.tokens) for s in shards] == [
        ("train_000000.bin", 4096), ("train_000001.bin", 4096), ("train_000002.bin", 808),
        ("val_000000.bin", 1000),
    ]  # fmt: skip
    tokens = [read_shard(s.path) for s in shards]
    assert bytes(tokens[0][:3].astype("uint8")) == b"aaa"
    assert set(tokens[3].tolist()) == {ord("b")}  # the tail is held out


def test_prepare_train_watch_validate_and_download_through_the_cli(
    service: Service, tmp_path: Path
) -> None:
    corpus = service.data_dir / "corpus"
    (corpus / "fox.txt").write_text(TEXT)
    shards = service.data_dir / "shards"

    code, out, _ = trainctl(service, "data", "prepare", str(corpus), "--out", str(shards))
    assert code == 0 and "wrote" in out and "val_000000.bin" in out

    code, out, err = trainctl(
        service, "submit", "train", "-e", "cli", "--steps", "30", "--checkpoint-every", "10",
        "--data", f"{shards}/train_*.bin", "--val-data", f"{shards}/val_*.bin",
        "--set", "batch.seq_len=64", "--idempotency-key", "cli-1", "--watch",
    )  # fmt: skip
    assert code == 0, err
    run_id = out.split("submitted train run ")[1].split()[0]
    assert f"run {run_id} succeeded" in out and "saved checkpoint cli/step_30" in out
    code, out, _ = trainctl(service, "runs", "show", run_id)
    run = json.loads(out)
    assert run["spec"]["data"]["source"] == "shards" and run["spec"]["batch"]["seq_len"] == 64
    assert run_id in trainctl(service, "runs", "list", "--kind", "train")[1]

    code, out, err = trainctl(
        service, "submit", "validate", "--checkpoint", "latest", "-e", "cli",
        "--data", f"{shards}/val_*.bin", "--seq-len", "64", "--watch",
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


def test_cancel_and_watch_a_run_that_does_not_finish(service: Service) -> None:
    code, out, _ = trainctl(
        service, "submit", "benchmark", "--steps", "100000", "--warmup-steps", "0",
        "--set", 'model.overrides={"n_layers": 1}', "--json",
    )  # fmt: skip
    run = json.loads(out)
    assert code == 0 and run["spec"]["model"]["overrides"] == {"n_layers": 1}

    code, out, _ = trainctl(service, "runs", "cancel", run["id"])
    assert code == 0 and run["id"] in out
    code, out, err = trainctl(service, "runs", "watch", run["id"])

    assert code == 1 and err == f"error: run {run['id']} was cancelled\n"


def test_every_error_is_one_line_and_a_non_zero_exit(service: Service) -> None:
    cases = [
        (service, ["runs", "show", "nope"], "error: run 'nope' does not exist"),
        (service, ["submit", "train", "--steps", "0"], "error: body.steps"),
        (service, ["checkpoints", "show", "nope", "step_1"], "error: "),
        (service, ["runs", "shw"], "error: No such command 'shw'"),
        (None, ["runs", "list"], "error: cannot reach trainctl at http://127.0.0.1:9/"),
    ]
    for svc, args, start in cases:
        code, out, err = trainctl(svc, *args)
        assert code != 0 and err.startswith(start), (args, err)
        assert err.count("\n") == 1 and "Traceback" not in out + err


def test_serve_refuses_an_open_host_without_a_token_and_worker_execs_python_m_worker() -> None:
    code, _, err = trainctl(None, "serve", "--host", "0.0.0.0", "--port", "1")
    worker = subprocess.run(
        [sys.executable, "-m", "trainctl.service.cli", "worker", "--help"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip

    assert code == 2 and "refusing to serve on 0.0.0.0" in err
    assert worker.returncode == 0 and "usage: python -m trainctl.worker" in worker.stdout

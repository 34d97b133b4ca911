"""How trainctl is installed and imported: one package name that a user's own `service`,
`store` or `worker` package cannot shadow, and a client install without the server's or
the worker's dependencies that still drives a remote service."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.service_process import REPO, Service
from trainctl import Client

TOKEN = "install-test-token"
ROOMS = ("service", "store", "worker")
# What a client install must not bring: the service's and the worker's dependencies.
# Not sources, wherever they are; and the checkout's own folders of output (.gitignore's
# /data/, /build/), at its root only: `store/data/` is a package.
NOT_SOURCE = (".venv", ".git", "__pycache__", "*.egg-info")
ROOT_OUTPUT = frozenset({"build", "data", "test-artifacts"})
HEAVY = ("torch", "fastapi", "starlette", "uvicorn", "sqlalchemy", "psycopg", "numpy")


def not_source(folder: str, names: list[str]) -> set[str]:
    """What copying the checkout leaves out of `folder` (shutil.copytree's `ignore`)."""
    ignored = set(shutil.ignore_patterns(*NOT_SOURCE)(folder, names))
    return ignored | (ROOT_OUTPUT & set(names) if Path(folder) == REPO else set())


def plant_rooms(folder: Path) -> Path:
    """Packages named like trainctl's rooms, as a user's project might have (a Celery app's
    worker/, a service.py): importing any of them leaves a marker file behind."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ROOMS:
        (folder / name).mkdir(exist_ok=True)
        (folder / name / "__init__.py").write_text(
            f"import pathlib\npathlib.Path({str(folder / f'imported-{name}')!r}).touch()\n"
        )
        (folder / name / "__main__.py").write_text("raise SystemExit('the user package ran')\n")
    return folder


def imported_rooms(*folders: Path) -> list[str]:
    return sorted(p.name for f in folders for p in f.glob("imported-*"))


def test_a_users_own_service_store_and_worker_packages_never_shadow_trainctl(
    service: Service, tmp_path: Path
) -> None:
    cwd, on_path = plant_rooms(tmp_path / "project"), plant_rooms(tmp_path / "on-path")
    env = {**os.environ, "PYTHONPATH": str(on_path), "TRAINCTL_API_TOKEN": TOKEN}
    service.cwd = cwd
    service.extra_env = {"PYTHONPATH": str(on_path), "TRAINCTL_API_TOKEN": TOKEN}
    service.start(workers=1)  # its local worker starts from the same folder and path

    sdk = subprocess.run(
        [sys.executable, "-c", SUBMIT_AND_WAIT, service.url, TOKEN],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert sdk.returncode == 0, sdk.stderr
    assert json.loads(sdk.stdout)["state"] == "succeeded"
    cli = subprocess.run(
        [str(Path(sys.executable).parent / "trainctl"), "--url", service.url, "runs", "list"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    assert "benchmark" in cli.stdout and "succeeded" in cli.stdout

    assert imported_rooms(cwd, on_path) == []


SUBMIT_AND_WAIT = """
import json, sys
from trainctl import Client
with Client(sys.argv[1], token=sys.argv[2]) as api:
    run = api.submit("benchmark", {"steps": 2, "warmup_steps": 0, "device": "cpu",
                                   "batch": {"micro_batch_size": 1, "seq_len": 16}})
    print(json.dumps({"state": api.wait(run.id, timeout=240).state}))
"""


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh virtualenv with `pip install <this repository>`: the client alone."""
    folder = tmp_path_factory.mktemp("client-venv")
    venv.create(folder, with_pip=True)
    # A copy of the sources (symlinks kept): pip builds in the source tree, and the checkout
    # should not collect a build/ folder.
    source = tmp_path_factory.mktemp("client-src") / "trainctl"
    shutil.copytree(REPO, source, symlinks=True, ignore=not_source)
    install = subprocess.run(
        [str(folder / "bin" / "python"), "-m", "pip", "install", "-q", str(source)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    yield folder


def test_the_client_install_brings_none_of_the_servers_or_workers_dependencies(
    client_venv: Path,
) -> None:
    code = (
        "import importlib.util, json, sys\n"
        "import trainctl\n"
        "assert trainctl.__file__.startswith(sys.prefix), trainctl.__file__\n"
        "from trainctl import ApiError, AsyncClient, Client\n"
        "import trainctl.service.cli\n"
        f"heavy = {HEAVY!r}\n"
        "print(json.dumps({\n"
        "    'installed': [m for m in heavy if importlib.util.find_spec(m)],\n"
        "    'loaded': sorted({n.split('.')[0] for n in sys.modules} & set(heavy)),\n"
        "}))\n"
    )
    # -P and a neutral folder: the installed package, not this checkout, is what loads.
    probe = subprocess.run(
        [str(client_venv / "bin" / "python"), "-P", "-c", code],
        cwd=client_venv, capture_output=True, text=True,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout) == {"installed": [], "loaded": []}


def test_the_client_installs_cli_lists_runs_and_finds_the_latest_checkpoint(
    client_venv: Path, service: Service
) -> None:
    service.extra_env = {"TRAINCTL_API_TOKEN": TOKEN}
    service.start(workers=1)
    with Client(service.url, token=TOKEN) as api:
        run = api.submit("train", {"experiment": "remote", "steps": 4, "device": "cpu"})
        assert api.wait(run.id, timeout=240).state == "succeeded"
    env = {**os.environ, "TRAINCTL_URL": service.url, "TRAINCTL_API_TOKEN": TOKEN}
    trainctl = str(client_venv / "bin" / "trainctl")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [trainctl, *args], cwd=client_venv, env=env, capture_output=True, text=True
        )

    runs, latest = cli("runs", "list"), cli("checkpoints", "latest", "-e", "remote")

    assert runs.returncode == 0, runs.stderr
    assert run.short_id in runs.stdout and "succeeded" in runs.stdout
    assert latest.returncode == 0, latest.stderr
    assert "step_4" in latest.stdout

"""The client-only install (`pip install trainctl`): the commands that only talk HTTP import none
of the server's or the worker's dependencies, and the commands that need them say which extra
to install. Each case runs in a fresh interpreter, so nothing another test imported counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.service.cli.invoke import NO_CONFIG
from tests.service.fakes import save_checkpoint
from tests.support.service_process import REPO, Service, StartService
from tests.support.stores import posix_store

# What `pip install "trainctl[server]"` or `"trainctl[worker]"` brings, and the client lacks.
HEAVY = (
    "numpy", "fastapi", "starlette", "uvicorn", "sqlalchemy", "psycopg", "alembic",
    "prometheus_client", "pydantic_settings", "torch",
)  # fmt: skip

RUN_COMMANDS = """
import json, sys
from trainctl.service.cli import app
codes = []
for args in (["--help"], ["runs", "list"], ["checkpoints", "latest"]):
    try:
        app(args, prog_name="trainctl")
    except SystemExit as exit:
        codes.append(exit.code)
heavy = [name for name in sys.argv[1].split(",") if name in sys.modules]
print(json.dumps({"codes": codes, "heavy": heavy}))
"""

WITHOUT_EXTRAS = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # as if not installed: importing it raises ModuleNotFoundError
from trainctl.service.cli import app
app(sys.argv[2:], prog_name="trainctl")
"""


@pytest.fixture(scope="module")
def service(start_service: StartService) -> Service:
    """The service with no workers, and one checkpoint: `checkpoints latest` has one to show."""
    svc = start_service()
    save_checkpoint(posix_store(svc.data_dir / "checkpoints"), "light", step=10)
    return svc


def python(
    code: str, *args: str, url: str = "http://127.0.0.1:9"
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRAINCTL_URL": url, "XDG_CONFIG_HOME": str(NO_CONFIG)}
    env.pop("TRAINCTL_API_TOKEN", None)
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=120,
    )  # fmt: skip


def test_importing_the_cli_loads_nothing_heavy() -> None:
    result = python(
        "import sys; import trainctl.service.cli; "
        "print(sorted(n for n in sys.argv[1].split(',') if n in sys.modules))",
        ",".join(HEAVY),
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout == "[]\n"


@pytest.mark.slow
def test_help_runs_list_and_checkpoints_latest_load_nothing_heavy(service: Service) -> None:
    result = python(RUN_COMMANDS, ",".join(HEAVY), url=service.url)

    assert result.returncode == 0, result.stderr
    *printed, last = result.stdout.splitlines()
    outcome = json.loads(last)
    assert outcome == {"codes": [0, 0, 0], "heavy": []}, result.stderr
    assert "no runs" in result.stderr and any("light" in line for line in printed)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "args", "missing", "extra"),
    [
        ("data prepare", ["data", "prepare", "corpus", "--out", "shards"], "numpy", "worker"),
        ("serve", ["serve"], "uvicorn", "server"),
        ("worker", ["worker", "--help"], "torch", "worker"),
    ],
)
def test_a_command_that_needs_a_missing_extra_says_which_to_install(
    tmp_path: Path, command: str, args: list[str], missing: str, extra: str
) -> None:
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("text " * 1000)
    args = [str(tmp_path / a) if a in ("corpus", "shards") else a for a in args]

    result = python(WITHOUT_EXTRAS, ",".join(HEAVY), *args)

    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        f"error: trainctl {command} needs {missing}, which is not installed: "
        f'pip install "trainctl[{extra}]"\n'
    )

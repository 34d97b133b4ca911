"""How trainctl starts its own Python processes (store/processes.py): isolated, with the
trainctl of their parent and nothing else from the working folder or the environment."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import trainctl
from trainctl.store.processes import isolated_env, python_command


def plant(folder: Path, name: str) -> Path:
    (folder / name).mkdir(parents=True)
    marker = folder / f"imported-{name}"
    (folder / name / "__init__.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
        f"raise ImportError('the planted {name} ran')\n"
    )
    return folder


def test_a_started_process_and_what_it_spawns_import_nothing_planted(tmp_path: Path) -> None:
    cwd, on_path = plant(tmp_path / "cwd", "numpy"), plant(tmp_path / "path", "numpy")
    # PYTHONPATH left in on purpose: the flag alone keeps it out.
    env = {**os.environ, "PYTHONPATH": str(on_path)}
    done = subprocess.run(
        python_command("tests.store.isolation_probe"),
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    for process in ("started", "spawned"):
        assert report[process]["isolated"], process
        assert not report[process]["numpy"].startswith(str(tmp_path)), process
        assert report[process]["trainctl"] == trainctl.__file__, process
    assert sorted(p.name for p in tmp_path.glob("*/imported-*")) == []


def test_a_started_process_inherits_no_variable_that_steers_python() -> None:
    env = {"PYTHONPATH": "/x", "PYTHONHOME": "/y", "PYTHONSTARTUP": "/z", "HOME": "/h", "A": "1"}

    assert isolated_env(env) == {"HOME": "/h", "A": "1"}

"""The supervisor's local workers as it would start them, without starting any."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

import trainctl.service.supervisor as supervisor_module
from trainctl.service.settings import Settings
from trainctl.service.supervisor import Supervisor
from trainctl.store.db.runs import RunStore


def spawned_envs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpus: int, **settings: Any
) -> list[dict[str, str]]:
    """The environments the supervisor starts its workers with, on a node with `gpus` GPUs."""
    monkeypatch.setattr(supervisor_module, "gpu_count", lambda: gpus)
    envs: list[dict[str, str]] = []

    class FakePopen:
        pid = 1

        def __init__(self, args: list[str], env: dict[str, str], **kw: Any) -> None:
            assert args[1] == "-I" and args[-1] == "trainctl.worker"  # isolated
            envs.append(env)

    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    runs = RunStore(f"sqlite:///{tmp_path / 'runs.db'}")
    try:
        sup = Supervisor(Settings(data_dir=tmp_path, **settings), runs)
        sup.settings.log_dir.mkdir(parents=True, exist_ok=True)
        for slot in sup.slots:
            sup._spawn(slot)
    finally:
        runs.close()
    return envs

"""How the supervisor shares a node's GPUs among its local workers."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

import service.supervisor as supervisor_module
from service.settings import Settings
from service.supervisor import Supervisor, gpu_groups
from store.runs import RunStore


@pytest.mark.parametrize(
    ("workers", "gpus", "per_worker", "expected"),
    [
        (8, 8, 1, [(i,) for i in range(8)]),
        (2, 8, 4, [(0, 1, 2, 3), (4, 5, 6, 7)]),
        (1, 8, 8, [tuple(range(8))]),
        (3, 2, 1, [(0,), (1,), ()]),  # more workers than GPUs: the rest run on the CPU
        (1, 0, 1, [()]),  # a CPU-only node
        (2, 3, 2, [(0, 1), ()]),  # a group is never cut short
    ],
)
def test_gpu_groups(
    workers: int, gpus: int, per_worker: int, expected: list[tuple[int, ...]]
) -> None:
    assert gpu_groups(workers, gpus, per_worker) == expected


def spawned_envs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpus: int, **settings: Any
) -> list[dict[str, str]]:
    """The environments the supervisor starts its workers with, on a node with `gpus` GPUs."""
    monkeypatch.setattr(supervisor_module, "gpu_count", lambda: gpus)
    envs: list[dict[str, str]] = []

    class FakePopen:
        pid = 1

        def __init__(self, args: list[str], env: dict[str, str], **kw: Any) -> None:
            assert args[1:] == ["-m", "worker"]
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


def test_each_worker_sees_its_group_of_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    envs = spawned_envs(tmp_path, monkeypatch, gpus=8, gpus_per_worker=4)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0,1,2,3", "4,5,6,7"]


def test_a_worker_beyond_the_gpus_sees_none_rather_than_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    envs = spawned_envs(tmp_path, monkeypatch, gpus=1, workers=2)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", ""]


def test_on_a_cpu_node_the_environment_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    envs = spawned_envs(tmp_path, monkeypatch, gpus=0)
    assert len(envs) == 1 and "CUDA_VISIBLE_DEVICES" not in envs[0]

"""Code from the environment (store/processes.py): the service started from a folder that
holds packages named like its dependencies, with a planted `torch` first on PYTHONPATH, serves
a two-process train run, and none of the planted packages is ever imported: not by the
service, its worker, torchrun or the ranks. Each planted package leaves a marker file when
imported (and then fails, as a stand-in would)."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from tests.support.polling import poll
from tests.support.service_process import REPO, Service

IN_WORKING_FOLDER = ("fastapi", "uvicorn", "starlette", "torch")
ON_PYTHONPATH = ("torch",)
CONSOLE_SCRIPT = Path(sys.executable).parent / "trainctl"


def plant(folder: Path, names: tuple[str, ...]) -> Path:
    for name in names:
        package = folder / name
        package.mkdir(parents=True)
        marker = folder / f"imported-{name}"
        (package / "__init__.py").write_text(
            f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
            f"raise ImportError('the planted {name} ran')\n"
        )
    return folder


def imported(*folders: Path) -> list[str]:
    return sorted(str(p) for f in folders for p in f.glob("imported-*"))


@pytest.mark.parametrize(
    "argv",
    [
        [sys.executable, "-m", "trainctl.service"],
        # The same guard in the console script's start; ~30 s, make soak.
        pytest.param([str(CONSOLE_SCRIPT), "serve"], marks=pytest.mark.soak),
    ],
    ids=["python -m trainctl.service", "trainctl serve"],
)
def test_nothing_planted_in_the_working_folder_or_on_pythonpath_is_imported(
    service: Service, tmp_path: Path, argv: list[str]
) -> None:
    cwd = plant(tmp_path / "project", IN_WORKING_FOLDER)
    on_path = plant(tmp_path / "on-path", ON_PYTHONPATH)
    service.cwd, service.argv = cwd, argv
    # trainctl itself comes from this checkout, after the planted torch.
    service.extra_env["PYTHONPATH"] = f"{on_path}:{REPO}"
    service.start(workers=1)

    body = {
        "experiment": "planted",
        "steps": 3,
        "model": {"preset": "tiny"},
        "data": {"source": "synthetic"},
        "batch": {"micro_batch_size": 2, "seq_len": 32},
        "device": "cpu",
        "nproc_per_node": 2,
    }
    answer = httpx.post(f"{service.url}/runs/train", json=body, timeout=30)
    assert answer.status_code == 202, answer.text
    url = f"{service.url}/runs/{answer.json()['id']}"
    run = poll(
        lambda: (
            (r := httpx.get(url, timeout=10).json())["state"]
            in ("succeeded", "failed", "cancelled")
            and r
        ),
        timeout=300,
        what="the two-process run to finish",
    )

    assert run["state"] == "succeeded", (run["error"], service.log_tail())
    assert imported(cwd, on_path) == []

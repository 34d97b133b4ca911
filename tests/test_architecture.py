"""The walls of the house (docs/architecture.md, "Rooms"): each package imported in a fresh
interpreter."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "service": {"torch", "trainctl.worker"},
    "store": {"torch", "fastapi", "starlette", "trainctl.service", "trainctl.worker"},
    "worker": {"fastapi", "starlette", "trainctl.service"},
}
# The rooms are installed as trainctl.<room>; the bare names belong to the user.
BARE = {"service", "store", "worker"}


# Scripts that something runs rather than imports: `python -m`, and alembic's env.py, which
# runs inside alembic's own context.
SCRIPTS = ("__main__", "migrations.env")


def modules_of(package: str) -> list[str]:
    """Every module of a room, its sub-packages' too."""
    found = pkgutil.walk_packages([str(REPO / package)], prefix=f"trainctl.{package}.")
    modules = sorted(m.name for m in found if not m.name.endswith(SCRIPTS))
    return [f"trainctl.{package}", *modules]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_never_imports_what_its_wall_forbids(package: str) -> None:
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules_of(package)!r}: importlib.import_module(m)\n"
        "names = {'.'.join(n.split('.')[:2 if n.startswith('trainctl.') else 1])"
        " for n in sys.modules}\n"
        "print(json.dumps(sorted(names)))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    loaded = set(json.loads(proc.stdout))
    assert not (loaded & FORBIDDEN[package]), f"{package} imports {loaded & FORBIDDEN[package]}"
    assert not (loaded & BARE), f"{package} imports a bare room name: {loaded & BARE}"


def test_no_code_path_unpickles_with_weights_only_false() -> None:
    """A checkpoint is data: every torch.load passes weights_only=True, none passes False."""
    for package in FORBIDDEN:
        for path in (REPO / package).rglob("*.py"):
            text = path.read_text()
            assert "weights_only=False" not in text, path
            for line in text.splitlines():
                if "torch.load(" in line and "def " not in line:
                    call = text[text.index(line) :]
                    assert "weights_only=True" in call[: call.index(")") + 80], (path, line)


def test_code_cites_the_architecture_document_in_the_repository_only() -> None:
    """docs/architecture.md is the design's one home; nothing points outside the repository."""
    assert (REPO / "docs" / "architecture.md").is_file()
    for package in [*FORBIDDEN, "bench", "tests"]:
        for path in (REPO / package).rglob("*.py"):
            if path == Path(__file__):
                continue
            text = path.read_text()
            for outside in ("DESIGN.md", "../shared", "shared/seed"):
                assert outside not in text, (path, outside)

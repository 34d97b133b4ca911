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


# The storage seam (docs/architecture.md, "Storage"): how files are locked, opened without
# following links and reopened by descriptor is the POSIX backend's alone (and, for the files
# outside the seam, data and trackers, `store/files.py`'s), and stores are built in one place.
POSIX_MECHANICS = ("/proc/self/fd", "import fcntl", "fcntl.", "O_NOFOLLOW", "sync_file_range")
POSIX_BACKEND = REPO / "store" / "checkpoints" / "posix.py"
FILE_OPENING = REPO / "store" / "files.py"
FACTORY = REPO / "store" / "checkpoints" / "factory.py"


def room_files() -> list[Path]:
    return [path for package in FORBIDDEN for path in (REPO / package).rglob("*.py")]


def test_only_the_posix_storage_locks_files_or_opens_them_by_descriptor() -> None:
    for path in room_files():
        if path in (POSIX_BACKEND, FILE_OPENING):
            continue
        text = path.read_text()
        for mechanic in POSIX_MECHANICS:
            assert mechanic not in text, (path.relative_to(REPO), mechanic)


def test_stores_are_built_by_the_factory_alone() -> None:
    for path in room_files():
        if path == FACTORY:
            continue
        for line in path.read_text().splitlines():
            if not line.lstrip().startswith("class "):
                assert "CheckpointStore(" not in line, (path.relative_to(REPO), line)
                assert "PosixStorage(" not in line, (path.relative_to(REPO), line)


def test_the_checkpoint_types_and_the_client_import_without_fcntl() -> None:
    """The laptop install (the SDK, the CLI, the plans it sends) never needs the POSIX
    backend: each imports in an interpreter where fcntl cannot be imported."""
    modules = [
        "trainctl.service.sdk",
        "trainctl.service.cli",
        "trainctl.store.plans",
        "trainctl.store.checkpoints.info",
        "trainctl.store.checkpoints.store",
        "trainctl.store.checkpoints.memory",
    ]
    code = (
        "import importlib, sys\n"
        "sys.modules['fcntl'] = None\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "assert 'trainctl.store.checkpoints.posix' not in sys.modules\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert proc.returncode == 0, proc.stderr

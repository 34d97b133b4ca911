"""The walls of the house (docs/architecture.md, "Rooms"): each package imported in a fresh
interpreter."""

from __future__ import annotations

import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The rooms are installed as trainctl.<room>; the bare names belong to the user.
ROOMS = ("service", "store", "worker")
BARE = set(ROOMS)
# What each room, and each part of one with a wall of its own, must never import; a name
# stands for its submodules too.
FORBIDDEN = {
    "service": {"torch", "trainctl.worker"},
    # The SDK is what a laptop installs (`from trainctl import Client`): no server, no
    # database, no POSIX locking, no checkpoint store.
    "service.sdk": {
        "torch",
        "trainctl.worker",
        "fastapi",
        "starlette",
        "sqlalchemy",
        "fcntl",
        "trainctl.store.checkpoints.store",
        "trainctl.store.checkpoints.posix",
        "trainctl.store.kinds",
    },
    "store": {"torch", "fastapi", "starlette", "trainctl.service", "trainctl.worker"},
    # The database stores a run's kind by name; the kinds are known a layer above it
    # (store.queueing), so a new kind never touches it.
    "store.db": {"trainctl.store.kinds"},
    "worker": {"fastapi", "starlette", "trainctl.service"},
}


# Scripts that something runs rather than imports: `python -m`, and alembic's env.py, which
# runs inside alembic's own context.
SCRIPTS = ("__main__", "migrations.env")


def modules_of(package: str) -> list[str]:
    """Every module of a room (`store`) or of a package in one (`service.sdk`), its
    sub-packages' too."""
    folder = REPO.joinpath(*package.split("."))
    found = pkgutil.walk_packages([str(folder)], prefix=f"trainctl.{package}.")
    modules = sorted(m.name for m in found if not m.name.endswith(SCRIPTS))
    return [f"trainctl.{package}", *modules]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_never_imports_what_its_wall_forbids(package: str) -> None:
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules_of(package)!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    loaded = set(json.loads(proc.stdout))
    crossed = {
        name
        for name in FORBIDDEN[package]
        if any(n == name or n.startswith(f"{name}.") for n in loaded)
    }
    assert not crossed, f"{package} imports {crossed}"
    bare = {n.split(".")[0] for n in loaded} & BARE
    assert not bare, f"{package} imports a bare room name: {bare}"


# What the laptop installs loads of trainctl, and what it must not load. Measured when each run
# kind became a module of store/kinds/ (issue 41): `from trainctl import Client, AsyncClient`
# loaded 18 modules / 3,203 lines (37 / 7,114 before, with the kind registry, every kind's
# request and plan, the models and training shelves); the CLI 70 / 10,600 (62 / 9,843 before:
# it reads the kinds' requests for its options, and a kind's module now holds its resolver,
# whose readers of files and of the database are imported only when one runs). Each bound
# leaves about 1.3 times that.
CLOSURES = {
    "from trainctl import Client, AsyncClient": (
        24,
        4_200,
        {"trainctl.store.kinds", "trainctl.store.specs", "trainctl.store.models"},
    ),
    "import trainctl.service.cli": (
        91,
        13_800,
        {"trainctl.store.resolve", "trainctl.store.db.runs", "sqlalchemy", "numpy"},
    ),
}


@pytest.mark.parametrize("statement", sorted(CLOSURES))
def test_the_light_clients_import_a_bounded_part_of_trainctl(statement: str) -> None:
    most_modules, most_lines, forbidden = CLOSURES[statement]
    code = (
        "import json, sys\n"
        f"{statement}\n"
        "mods = {n: getattr(m, '__file__', None) for n, m in list(sys.modules.items())}\n"
        "print(json.dumps(mods))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout)
    crossed = {f for f in forbidden if any(n == f or n.startswith(f"{f}.") for n in loaded)}
    assert not crossed, f"{statement} imports {crossed}"
    ours = {n: f for n, f in loaded.items() if n == "trainctl" or n.startswith("trainctl.")}
    lines = sum(len(Path(f).read_text().splitlines()) for f in ours.values() if f)
    assert len(ours) <= most_modules, f"{statement}: {len(ours)} trainctl modules: {sorted(ours)}"
    assert lines <= most_lines, f"{statement}: {lines:,} lines of trainctl: {sorted(ours)}"


def test_no_code_path_unpickles_with_weights_only_false() -> None:
    """A checkpoint is data: every torch.load passes weights_only=True, none passes False."""
    for package in ROOMS:
        for path in (REPO / package).rglob("*.py"):
            text = path.read_text()
            assert "weights_only=False" not in text, path
            for line in text.splitlines():
                if "torch.load(" in line and "def " not in line:
                    call = text[text.index(line) :]
                    assert "weights_only=True" in call[: call.index(")") + 80], (path, line)


def test_code_cites_the_architecture_document_in_the_repository_only() -> None:
    """The design lives in docs/ (the map, architecture.md, and the design pages it links);
    nothing points outside the repository."""
    assert (REPO / "docs" / "architecture.md").is_file()
    for package in [*ROOMS, "bench", "tests"]:
        for path in (REPO / package).rglob("*.py"):
            if path == Path(__file__):
                continue
            text = path.read_text()
            for outside in ("DESIGN.md", "../shared", "shared/seed"):
                assert outside not in text, (path, outside)


# The storage seam (docs/design/checkpoints.md, "Checkpoint store", "Storage"): how files are
# locked, opened without following links and reopened by descriptor is the POSIX backend's alone
# (and, for the files outside the seam, data and trackers, `store/files.py`'s), and stores are built
# in one place.
POSIX_MECHANICS = ("/proc/self/fd", "import fcntl", "fcntl.", "O_NOFOLLOW", "sync_file_range")
POSIX_BACKEND = REPO / "store" / "checkpoints" / "posix.py"
FILE_OPENING = REPO / "store" / "files.py"
FACTORY = REPO / "store" / "checkpoints" / "factory.py"


def room_files() -> list[Path]:
    return [path for package in ROOMS for path in (REPO / package).rglob("*.py")]


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
                assert "DatasetStore(" not in line, (path.relative_to(REPO), line)


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


# The tests are shelved like the code (tests/service/{api,cli,sdk,...}): what two test modules
# share is a fixture in the nearest conftest.py, or a helper in a plain module beside them.
# A test module imported by another would run its tests' module-level code twice over and
# tie the two together; a conftest is pytest's to load, not a module to import from.
TEST_IMPORT = re.compile(
    r"^\s*(?:from\s+(tests(?:\.\w+)*)\s+import\s+(\([^)]*\)|[^\n]*)|import\s+(tests(?:\.\w+)*))",
    re.MULTILINE,
)


def imported_test_modules(text: str) -> list[str]:
    """The test modules and conftests that `text` imports, in code or in a script it holds."""
    found = []
    for module, names, plain in TEST_IMPORT.findall(text):
        dotted = (module or plain).split(".")
        if any(part.startswith("test_") or part == "conftest" for part in dotted):
            found.append(module or plain)
        for name in re.findall(r"\w+", names.split("#")[0]):
            if name.startswith("test_") or name == "conftest":
                found.append(f"{module}.{name}")
    return found


def test_imported_test_modules_are_found_however_they_are_imported() -> None:
    script = (
        "from tests.service.sdk.clients import CPU_TRAIN\n"
        "from tests.e2e import test_service_e2e as flows\n"
        "    from tests.worker.checkpoints.test_checkpoint import make_parts  # in a script\n"
        "import tests.service.conftest\n"
        "from tests.service.cli import (\n    invoke,\n    test_cli,\n)\n"
    )
    assert imported_test_modules(script) == [
        "tests.e2e.test_service_e2e",
        "tests.worker.checkpoints.test_checkpoint",
        "tests.service.conftest",
        "tests.service.cli.test_cli",
    ]


def test_no_test_module_imports_another_or_a_conftest() -> None:
    offenders = {
        str(path.relative_to(REPO)): found
        for path in sorted((REPO / "tests").rglob("*.py"))
        if path != Path(__file__) and (found := imported_test_modules(path.read_text()))
    }
    assert not offenders, offenders

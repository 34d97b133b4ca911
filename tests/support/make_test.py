"""Which tests `make test` runs, read from the Makefile, pyproject.toml and the test files
themselves, without running pytest: what docs/extending.md may name as "the test that proves
it" (tests/test_docs.py).

A test node (`tests/x/test_y.py` or `tests/x/test_y.py::test_z`) is run by `make test` when
its file exists under the configured test paths and is named as pytest collects files, the
named test function is in it, no path or node the `make test` recipe's pytest lines
(`--ignore`, `--ignore-glob`, `--deselect`) leaves out holds it, no marker those lines
deselect (`-m "not slow"`) is on it, and it is not skipped there: `make test` skips the tests
marked `soak` (tests/conftest.py, tests/support/soak.py) and, on a machine without CUDA, those
marked `gpu`, and a test marked `skip` or `skipif` may not run at all.
"""

from __future__ import annotations

import ast
import fnmatch
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

# Skipped by `make test` (tests/conftest.py), or perhaps skipped: never a recipe's proof.
SKIPPED_MARKERS = frozenset({"soak", "gpu", "skip", "skipif"})
TEST_FILE = "test_*.py"  # pytest's default python_files, which pyproject.toml keeps
VARIABLE = re.compile(r"^([A-Za-z_][\w.]*)\s*(?::=|\?=|\+=|=)\s*(.*)$")
RULE = re.compile(r"^([^\s:=#][^:=]*?)\s*:(?!=)\s*(.*)$")
REFERENCE = re.compile(r"(?<!\$)\$\(([^)]+)\)")  # `$$(...)` is the shell's


@dataclass
class Selection:
    """What the pytest lines of `make test` leave out."""

    paths: list[str] = field(default_factory=list)
    """Folders and files (`--ignore`), or globs of them (`--ignore-glob`)."""
    nodes: list[str] = field(default_factory=list)
    """Test nodes (`--deselect`)."""
    markers: set[str] = field(default_factory=set)
    """Markers deselected (`-m "not slow and not gpu"`)."""
    roots: list[str] = field(default_factory=list)
    """The paths collected (pyproject's `testpaths`, or a pytest line's own)."""


def _logical_lines(makefile: str) -> list[str]:
    """The Makefile's lines, a trailing backslash joining the next."""
    joined, lines = "", []
    for line in makefile.splitlines():
        if line.endswith("\\"):
            joined += line[:-1] + " "
            continue
        lines.append(joined + line)
        joined = ""
    return lines


def _expand(text: str, variables: dict[str, str], depth: int = 0) -> str:
    if depth > 20:
        return text
    expanded = REFERENCE.sub(lambda m: variables.get(m.group(1), ""), text)
    return expanded if expanded == text else _expand(expanded, variables, depth + 1)


def recipe_commands(makefile: str, target: str) -> list[str]:
    """The commands `make <target>` runs, its prerequisites' first, variables expanded."""
    variables: dict[str, str] = {}
    rules: dict[str, tuple[list[str], list[str]]] = {}
    current: list[str] | None = None
    for line in _logical_lines(makefile):
        if line.startswith("\t"):
            if current is not None:
                current.append(line.strip())
            continue
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if variable := VARIABLE.match(line):
            variables[variable.group(1)] = variable.group(2).strip()
            current = None
        elif rule := RULE.match(line):
            current = []
            for name in rule.group(1).split():
                rules[name] = (rule.group(2).split(), current)
    commands: list[str] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen or name not in rules:
            return
        seen.add(name)
        prerequisites, recipe = rules[name]
        for prerequisite in prerequisites:
            visit(prerequisite)
        commands.extend(_expand(command, variables) for command in recipe)

    visit(target)
    return commands


def _read_pytest_args(words: list[str], selection: Selection) -> None:
    """Add what one pytest command line's arguments leave out, and the paths it names."""
    takes_value = {"--ignore", "--ignore-glob", "--deselect", "-m", "-k", "-n", "--dist", "-p"}
    i = 0
    while i < len(words):
        word, value = words[i], None
        option, _, inline = word.partition("=")
        if option in takes_value:
            value = inline if inline else (words[i + 1] if i + 1 < len(words) else "")
            i += 0 if inline else 1
        if option in ("--ignore", "--ignore-glob"):
            selection.paths.append(str(value).rstrip("/"))
        elif option == "--deselect":
            selection.nodes.append(str(value))
        elif option == "-m":
            selection.markers |= set(re.findall(r"\bnot\s+(\w+)", str(value)))
        elif value is None and not word.startswith("-") and word.startswith("tests"):
            selection.roots.append(word.rstrip("/"))
        i += 1


def make_test_selection(root: Path, target: str = "test") -> Selection:
    """What `make <target>` collects and leaves out, from the repository at `root`."""
    selection = Selection()
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        options = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        ini = options.get("tool", {}).get("pytest", {}).get("ini_options", {})
        addopts = ini.get("addopts", "")
        _read_pytest_args(shlex.split(addopts) if isinstance(addopts, str) else addopts, selection)
        testpaths = [p.rstrip("/") for p in ini.get("testpaths", [])]
    else:
        testpaths = []
    for command in recipe_commands((root / "Makefile").read_text(encoding="utf-8"), target):
        if "pytest" not in command:
            continue
        words = shlex.split(command)
        # `pytest ...`, `.venv/bin/pytest ...`, `python -m pytest ...`, `VAR=1 pytest ...`
        starts = [i for i, word in enumerate(words) if Path(word).name == "pytest"]
        if starts:
            own = Selection()
            _read_pytest_args(words[starts[0] + 1 :], own)
            selection.paths += own.paths
            selection.nodes += own.nodes
            selection.markers |= own.markers
            selection.roots += own.roots
    selection.roots = selection.roots or testpaths or ["."]
    return selection


def _under(path: str, folder: str) -> bool:
    return folder in (".", "") or path == folder or path.startswith(folder + "/")


def _markers(decorators: list[ast.expr]) -> set[str]:
    """The pytest markers a list of decorators (or a `pytestmark` value's items) applies
    itself: `pytest.mark.soak`, `pytest.mark.skipif(...)`; not those inside its arguments
    (a `pytest.param(..., marks=...)` marks one case of a parametrized test only)."""
    found = set()
    for node in decorators:
        target = node.func if isinstance(node, ast.Call) else node
        if (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Attribute)
            and target.value.attr == "mark"
        ):
            found.add(target.attr)
    return found


def _module_markers(tree: ast.Module) -> set[str]:
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in statement.targets
        ):
            value = statement.value
            items = value.elts if isinstance(value, ast.List | ast.Tuple) else [value]
            return _markers(items)
    return set()


def _tests_of(tree: ast.Module) -> dict[str, set[str]]:
    """Each test function (`test_x`, or `Class::test_x` in a `Test*` class) and its own
    markers and its class's."""
    found: dict[str, set[str]] = {}
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    for node in tree.body:
        if isinstance(node, functions) and node.name.startswith("test"):
            found[node.name] = _markers(node.decorator_list)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            own = _markers(node.decorator_list)
            for item in node.body:
                if isinstance(item, functions) and item.name.startswith("test"):
                    found[f"{node.name}::{item.name}"] = own | _markers(item.decorator_list)
    return found


def why_not_run(root: Path, node: str, selection: Selection) -> str | None:
    """Why `make test` does not run the test node `node` (a file, or `file::test`), or None."""
    path, _, name = node.partition("::")
    file = root / path
    if not file.is_file():
        return "no such file"
    if not fnmatch.fnmatch(file.name, TEST_FILE):
        return f"pytest collects no file named {file.name}"
    if not any(_under(path, r) for r in selection.roots):
        return f"not under the paths make test collects ({', '.join(selection.roots)})"
    for left_out in selection.paths:
        if _under(path, left_out) or fnmatch.fnmatch(path, left_out):
            return f"make test leaves out {left_out}"
    if any(node == n or node.startswith(n + "::") or n == path for n in selection.nodes):
        return "make test deselects it"
    tree = ast.parse(file.read_text(encoding="utf-8"))
    skipped = SKIPPED_MARKERS | selection.markers
    if marked := _module_markers(tree) & skipped:
        return f"the whole file is marked {', '.join(sorted(marked))}"
    tests = _tests_of(tree)
    if not name:
        return None if any(not m & skipped for m in tests.values()) else "it runs no test"
    if name not in tests:
        return f"it has no test {name}"
    if marked := tests[name] & skipped:
        return f"{name} is marked {', '.join(sorted(marked))}"
    return None

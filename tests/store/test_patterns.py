"""Every pattern that checks a name or user input matches the whole text: Python's `re` reads
`$` as "the end, or before a final newline" (store/names.py), so a `$`-anchored pattern
matched with `re.match` or `search` takes 'x\\n'. The first test reads the code for the
mistake itself; the second gives 'x\\n' to each check of a name-like value."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import TypeAdapter, ValidationError

from trainctl.service.webhooks.targets import check_url
from trainctl.store.backends.slurm import SlurmOptions, time_limit_seconds
from trainctl.store.db.records import is_whole_run_id
from trainctl.store.kinds.forks import check_fork_ref
from trainctl.store.models.plugin import check_plugin_request
from trainctl.store.names import (
    ExperimentName,
    Name,
    is_valid_experiment,
    is_valid_name,
    parse_step,
)

PLUGIN_SIZES = {"vocab_size": 256, "max_seq_len": 64}
ROOT = Path(__file__).resolve().parents[2]
ROOMS = ("store", "service", "worker")
RE_CALLS = {"compile", "match", "search", "fullmatch", "findall", "finditer", "sub", "split"}
# `$` that is not escaped (`\$`) and not inside a character class is an anchor.
DOLLAR_ANCHOR = re.compile(r"(?<!\\)\$")


def _python_files() -> list[Path]:
    return sorted(p for room in ROOMS for p in (ROOT / room).rglob("*.py"))


def _literal(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)
        )
    return None


def _mistakes(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        where = f"{path.relative_to(ROOT)}:{node.lineno}"
        # re.match or a compiled pattern's: anchored at the start only.
        if node.func.attr == "match":
            found.append(f"{where}: .match() (use fullmatch)")
        is_re = isinstance(node.func.value, ast.Name) and node.func.value.id == "re"
        if is_re and node.func.attr in RE_CALLS and node.args:
            pattern = _literal(node.args[0])
            if pattern is not None and DOLLAR_ANCHOR.search(pattern):
                found.append(f"{where}: a $-anchored pattern in Python's re (use fullmatch)")
    return found


def test_no_python_regex_is_anchored_with_dollar_or_matched_from_the_start_only() -> None:
    mistakes = [m for path in _python_files() for m in _mistakes(path)]
    assert not mistakes, "\n".join(mistakes)


def _refuses(check: Callable[[str], object]) -> Callable[[str], bool]:
    """True when `check` refuses the value: raises, or answers False or None."""

    def refused(value: str) -> bool:
        try:
            return check(value) in (False, None)
        except (ValueError, ValidationError):
            return True

    return refused


NAME_CHECKS: dict[str, tuple[Callable[[str], bool], str]] = {
    "name": (lambda v: not is_valid_name(v), "x"),
    "experiment": (lambda v: not is_valid_experiment(v), "x"),
    "Name field": (_refuses(TypeAdapter(Name).validate_python), "x"),
    "ExperimentName field": (_refuses(TypeAdapter(ExperimentName).validate_python), "x"),
    "step tag": (lambda v: parse_step(v) is None, "step_1"),
    "run id": (lambda v: not is_whole_run_id(v), "0" * 32),
    "fork ref": (_refuses(lambda v: check_fork_ref("fork_from", v)), "exp/step_1"),
    "plug-in model name": (
        _refuses(lambda v: check_plugin_request({"name": v, "config": PLUGIN_SIZES})),
        "p",
    ),
    "slurm partition": (_refuses(lambda v: SlurmOptions(partition=v)), "gpu"),
    "slurm time_limit": (_refuses(time_limit_seconds), "10"),
    "webhook url": (_refuses(check_url), "https://example.com/hook"),
}


@pytest.mark.parametrize("check", NAME_CHECKS)
def test_a_value_with_a_final_newline_is_refused(check: str) -> None:
    refused, valid = NAME_CHECKS[check]
    assert not refused(valid), f"{check}: the valid {valid!r} must be accepted"
    for bad in (f"{valid}\n", f"{valid}\r\n", f"\n{valid}"):
        assert refused(bad), f"{check}: {bad!r} accepted"

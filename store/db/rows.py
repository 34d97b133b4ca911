"""Reading stored rows so that one bad row never breaks a listing (docs/design/kinds.md,
"Requests and plans", "A row never breaks a listing").

A row may hold what the code that reads it cannot show, written by an older trainctl, by hand
or by a bug; read as it was, one such row made every listing that held it an error, for every
user. Here each column is read on its own terms, and what cannot be read is repaired or
replaced and said so.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from trainctl.store.exceptions import InvalidRequest
from trainctl.store.text import repair as repair_text
from trainctl.store.text import repaired, text_problem, unencodable

MAX_DEPTH = 64
"""Deeper than any value trainctl stores (a plan is five levels): a value nested deeper is
not one of ours, and is replaced rather than walked and shown."""
UNREADABLE = "unreadable"
"""The one key of the object that stands in for a stored JSON value that cannot be read."""

sqlite_text = partial(str, encoding="utf-8", errors="surrogateescape")
"""SQLite's text as Python reads it: bytes that are not UTF-8 become lone surrogates (which
`repair` then shows as U+FFFD) instead of failing the whole query (sqlite3's default)."""


@dataclass(frozen=True)
class Unreadable:
    """A stored JSON value that does not parse: what the engine's deserializer gives back."""

    reason: str


def read_json(text: str) -> Any:
    """The engines' JSON deserializer: the value, or `Unreadable` saying why it is not one."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        return Unreadable(f"not JSON ({type(exc).__name__}: {str(exc)[:200]})")


def is_clean(value: Any) -> bool:
    """Whether `value` (as JSON gives it) nests at most MAX_DEPTH deep and all its strings can
    be written as UTF-8: one pass, made for speed, since every row read takes it (a page of
    events is a thousand)."""
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if level > MAX_DEPTH:
            return False
        pairs = item.items() if isinstance(item, dict) else enumerate(item)
        for key, inner in pairs:
            if type(key) is str and not key.isascii() and text_problem(key) is not None:
                return False
            kind = type(inner)
            if kind is str:
                if not inner.isascii() and text_problem(inner) is not None:
                    return False
            elif kind is dict or kind is list:
                stack.append((inner, level + 1))
    return True


def depth(value: Any) -> int:
    """How deeply `value`'s lists and objects nest (a loop: any depth is measured)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            stack.extend(
                (inner, level + 1) for inner in (item.values() if isinstance(item, dict) else item)
            )
    return deepest


def as_json(value: dict[str, Any]) -> dict[str, Any]:
    """The value as it will come back from a JSON column (tuples become lists, and so on).

    Normalising before storing lets an idempotent replay compare like with like, and rejects
    values JSON cannot hold here, with a clear error, rather than inside the driver.
    """
    try:
        normalised: dict[str, Any] = json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"value is not JSON-serialisable: {exc}") from exc
    return normalised


def storable_json(value: Any) -> Any:
    """`value` as a JSON column can hold it on either database and give it back: strings
    repaired, and the non-finite numbers that PostgreSQL's JSON refuses written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, str):
        return repair_text(value)
    if isinstance(value, dict):
        return {repair_text(str(k)): storable_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable_json(item) for item in value]
    return value


@dataclass
class RowReader:
    """Reads the columns of one row, noting what it had to replace or repair."""

    what: str
    """The row in words, for the notes: 'run 0f3a...'."""
    problems: list[str] = field(default_factory=list)

    def text(self, column: str, value: str | None) -> str | None:
        if value is None or unencodable(value) is None:
            return value
        self.problems.append(f"{column} held text UTF-8 cannot encode (shown as U+FFFD)")
        return repair_text(value)

    def json(self, column: str, value: Any, kind: type = dict, *, repair: bool = True) -> Any:
        """A JSON column's value, if it is a `kind`; else `{"unreadable": why}` (for a dict)
        or None. Strings UTF-8 cannot encode are repaired, or with `repair` False (a plan,
        which a worker must run as it was asked or not at all) make the value unreadable."""
        if isinstance(value, Unreadable):
            return self._replaced(column, value.reason, kind)
        if not isinstance(value, kind):
            shape = f"a JSON {type(value).__name__}, not a {kind.__name__}"
            return self._replaced(column, shape, kind)
        if is_clean(value):
            return value  # nearly every row: one quick pass, no description built
        if depth(value) > MAX_DEPTH:
            return self._replaced(column, f"nested more than {MAX_DEPTH} deep", kind)
        problem = unencodable(value)
        if problem is None:
            return value
        if not repair:
            return self._replaced(column, problem, kind)
        self.problems.append(f"{column}: {problem} (shown as U+FFFD)")
        return repaired(value)

    def _replaced(self, column: str, reason: str, kind: type) -> Any:
        self.problems.append(f"{column} cannot be read: {reason}")
        if kind is not dict:
            return None
        return {UNREADABLE: f"the stored {column} of {self.what} cannot be shown: {reason}"}

    @property
    def note(self) -> str | None:
        return "; ".join(self.problems) or None

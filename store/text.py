"""Text at the boundary: every string the service takes in can be written as UTF-8
(docs/design/kinds.md, "Requests and plans", "Text").

A lone surrogate (JSON's `"\\ud800"`, which Python's `json` reads back without complaint),
taken into a request, was stored in the run's plan and then broke every answer that showed
the run. Request models refuse it through their base (`TextChecked`); what is stored from
elsewhere is `repaired`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, field_validator

REPLACEMENT = "\ufffd"


def text_problem(value: str) -> str | None:
    """Why UTF-8 cannot encode `value` (the first lone surrogate, and where), or None."""
    if value.isascii():
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        char = value[exc.start]
        return (
            f"holds a lone surrogate (U+{ord(char):04X}) at character {exc.start}, which is "
            "not a character and which UTF-8 cannot encode; send text (JSON's \\uD83D\\uDE00 "
            "pairs are one character and fine)"
        )
    return None


def _strings(value: Any) -> Iterator[tuple[str, str]]:
    """(where, string) for every string in `value`: dict keys and values, list items. A loop,
    not a recursion: a value nested a thousand deep is walked like any other."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            yield where, item
        elif isinstance(item, dict):
            for key, inner in reversed(item.items()):
                stack.append((f"{where}[{key!r}]", inner))
                if isinstance(key, str):
                    stack.append((f"{where} key {key!r}".lstrip(), key))
        elif isinstance(item, list | tuple | set | frozenset):
            stack.extend((f"{where}[{i}]", inner) for i, inner in reversed(list(enumerate(item))))
        elif isinstance(item, BaseModel) and not isinstance(item, TextChecked):
            prefix = f"{where}." if where else ""
            stack.extend((prefix + name, inner) for name, inner in reversed(vars(item).items()))


def unencodable(value: Any) -> str | None:
    """Where in `value` (a string, or any JSON-like container of them) the first string is that
    UTF-8 cannot encode, and why; None when every one can."""
    for where, text in _strings(value):
        problem = text_problem(text)
        if problem is not None:
            return f"{where or 'the text'} {problem}"
    return None


def repair(text: str) -> str:
    """`text` with what UTF-8 cannot encode replaced by U+FFFD; two surrogates that make a
    pair become the one character they stand for."""
    if text.isascii() or text_problem(text) is None:
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def repaired(value: Any) -> Any:
    """`value` (JSON-like) with every string in it, dict keys too, `repair`ed."""
    if isinstance(value, str):
        return repair(value)
    if isinstance(value, dict):
        return {repaired(k): repaired(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [repaired(item) for item in value]
    return value


def column_text(text: str) -> str:
    """`text` as a text column of either database can hold it: `repair`ed, and a NUL (which
    PostgreSQL's text refuses) written as the two characters `\\0`."""
    return repair(text).replace("\x00", "\\0")


class TextChecked(BaseModel):
    """A model every string of which UTF-8 can encode: the base of every request body.

    One validator for every field (`"*"`), so a field added later is checked too; a string
    refused here is a 422 naming the field (and, inside it, the item or key)."""

    @field_validator("*", mode="after")
    @classmethod
    def _strings_are_text(cls, value: Any) -> Any:
        if isinstance(value, TextChecked | int | float | bool | None):
            return value  # a nested request model checked its own strings
        problem = unencodable(value)
        if problem is not None:
            raise ValueError(problem)
        return value


def ids_span(first: int, stop: int) -> str | None:
    """`range(first, stop)` in a sentence: 'id 7', 'ids 7..9'; None when it is empty, so
    that nothing is said of no ids ("ids 256..255")."""
    if stop <= first:
        return None
    return f"id {first}" if stop == first + 1 else f"ids {first}..{stop - 1}"


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """'1 file', '2 files', '0 files' (`plural` where adding an s is wrong)."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"

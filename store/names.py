"""The one rule for names that become path components: experiments, tags, checkpoint files.

A name is 1-128 letters, digits, '.', '_' or '-', starts with a letter or digit and has no
'..': it can never climb out of the checkpoint store, nor hide among the store's own
dot-folders (``.staging-*``, ``.trash-*``, ``.guard-*``). Requests, plans, the checkpoint
store and its manifests all check names here.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

from trainctl.store.exceptions import InvalidName

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
_NAME_RE = re.compile(NAME_PATTERN)
NAME_RULE = (
    "1-128 letters, digits, '.', '_' or '-', starting with a letter or digit and without '..'"
)


def is_valid_name(value: object) -> bool:
    # fullmatch, not match: `$` also matches before a trailing newline.
    return isinstance(value, str) and _NAME_RE.fullmatch(value) is not None and ".." not in value


def validate_name(kind: str, value: object) -> str:
    """Return `value` if it is a valid name, else raise `InvalidName` saying what to use."""
    if not is_valid_name(value):
        raise InvalidName(f"invalid {kind} name {value!r}: use {NAME_RULE}")
    assert isinstance(value, str)
    return value


def _checked(value: str) -> str:
    if not is_valid_name(value):
        raise ValueError(f"use {NAME_RULE}")
    return value


Name = Annotated[
    str,
    # The pattern publishes the rule in the OpenAPI schema; the validator also refuses '..',
    # which a regular expression without look-ahead cannot say.
    Field(pattern=NAME_PATTERN, description="Letters, digits, '.', '_', '-'; no '..'."),
    AfterValidator(_checked),
]

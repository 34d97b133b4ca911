"""The one rule for names that become path components: experiments, tags, checkpoint files.

A name is 1-128 letters, digits, '.', '_' or '-', starts with a letter or digit and has no
'..': it can never climb out of the checkpoint store, nor hide among the store's own
dot-folders (``.staging-*``, ``.trash-*``, ``.guard-*``). Requests, plans, the checkpoint
store, its manifests and the API's path and query parameters all check names here, and the
OpenAPI schema publishes the same pattern and length, so a client can check a name first.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field

from trainctl.store.exceptions import InvalidName

MAX_NAME_LENGTH = 128
# Every '.' is followed by a letter, digit, '_' or '-', or ends the name: no '..', written
# without look-ahead so that JSON Schema validators (ECMA 262) and pydantic's regex engine,
# which has none, read it as Python does. The length is MAX_NAME_LENGTH, checked apart.
NAME_REGEX = r"[A-Za-z0-9](?:[A-Za-z0-9_-]|\.[A-Za-z0-9_-])*\.?"
"""A name, unanchored: for patterns that hold names (`<experiment>/<tag>`)."""
NAME_PATTERN = f"^{NAME_REGEX}$"
_NAME_RE = re.compile(NAME_PATTERN)
NAME_RULE = (
    f"1-{MAX_NAME_LENGTH} letters, digits, '.', '_' or '-', starting with a letter or digit "
    "and without '..'"
)
NAME_DESCRIPTION = f"A name of {NAME_RULE}."

STEP_PREFIX = "step_"
BEST_TAG = "best"
"""The tag a train run saves whenever validation improves its best loss."""
LATEST_REF = "latest"
"""A reference to an experiment's highest step checkpoint, never a tag of its own."""
# Canonical step tags only: "step_007" would be a second name for step 7.
_STEP_RE = re.compile(rf"^{STEP_PREFIX}(0|[1-9][0-9]*)$")


def is_valid_name(value: object) -> bool:
    # fullmatch, not match: `$` also matches before a trailing newline.
    return (
        isinstance(value, str)
        and len(value) <= MAX_NAME_LENGTH
        and _NAME_RE.fullmatch(value) is not None
    )


def validate_name(kind: str, value: object) -> str:
    """Return `value` if it is a valid name, else raise `InvalidName` saying what to use."""
    if not is_valid_name(value):
        raise InvalidName(f"invalid {kind} name {value!r}: use {NAME_RULE}")
    assert isinstance(value, str)
    return value


# The pattern and the length are the whole rule: pydantic checks them, the schema shows them.
Name = Annotated[
    str, Field(pattern=NAME_PATTERN, max_length=MAX_NAME_LENGTH, description=NAME_DESCRIPTION)
]


def step_tag(step: int) -> str:
    """The tag of the checkpoint saved at `step`."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return f"{STEP_PREFIX}{step}"


def parse_step(tag: str) -> int | None:
    """The step of a ``step_<N>`` tag, or None for ``best`` and user tags."""
    match = _STEP_RE.fullmatch(tag)
    return int(match.group(1)) if match else None

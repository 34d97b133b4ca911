"""The one rule for names that become path components: experiments, tags, checkpoint files
(docs/design/checkpoints.md, "Checkpoint store", "Names").

Requests, plans, the checkpoint store, its manifests and the API's path and query parameters
all check names here. A final '.' is refused because Windows drops it, so a store copied to or
shared with Windows holds the same names. `latest` and `best` are no experiments: they are
references to checkpoints (`latest`, `best`, `<experiment>/<tag>`), so an experiment of
either name would be ambiguous.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

from trainctl.store.exceptions import InvalidName

MAX_NAME_LENGTH = 128
# Every '.' is followed by a letter, digit, '_' or '-': no '..' and no final '.'. Written
# without look-ahead so that JSON Schema validators (ECMA 262) and pydantic's regex engine,
# which has none, read it as Python does. The length is MAX_NAME_LENGTH, checked apart.
NAME_REGEX = r"[A-Za-z0-9](?:\.?[A-Za-z0-9_-])*"
"""A name, unanchored: for patterns that hold names (`<experiment>/<tag>`)."""
# `$` in a pattern is the very end of the text for pydantic (Rust's regex) and JSON Schema
# (ECMA 262); Python's `re` reads it as "the end, or before a final newline", so Python code
# matches names with fullmatch, never with this pattern and `match`.
NAME_PATTERN = f"^{NAME_REGEX}$"
_NAME_RE = re.compile(NAME_REGEX)
# Windows' reserved device names: a file of this stem (`aux`, `aux.txt`, `Aux.tar.gz`) opens
# the device instead. COM0 and LPT0 are reserved too since Windows 11.
WINDOWS_DEVICE_NAMES = frozenset(
    ["CON", "PRN", "AUX", "NUL"] + [f"{port}{n}" for port in ("COM", "LPT") for n in range(10)]
)
NAME_RULE = (
    f"1-{MAX_NAME_LENGTH} letters, digits, '.', '_' or '-', starting with a letter or digit, "
    "without '..', not ending in '.', and not a Windows device name (CON, PRN, AUX, NUL, "
    "COM0-9, LPT0-9, with or without an extension, in any case)"
)
NAME_DESCRIPTION = f"A name of {NAME_RULE}."

STEP_PREFIX = "step_"
BEST_TAG = "best"
"""The tag a train run saves whenever validation improves its best loss."""
LATEST_REF = "latest"
"""A reference to an experiment's highest step checkpoint, never a tag of its own."""
CHECKPOINT_REFERENCES = (LATEST_REF, BEST_TAG)
"""The words that name a checkpoint by role: never an experiment's name."""
EXPERIMENT_RULE = f"{NAME_RULE}; nor 'latest' or 'best', which name checkpoints"
# Canonical step tags only: "step_007" would be a second name for step 7.
_STEP_RE = re.compile(rf"{STEP_PREFIX}(0|[1-9][0-9]*)")


def is_device_name(value: str) -> bool:
    """Whether Windows reserves `value` for a device: its part before the first '.'."""
    return value.split(".", 1)[0].upper() in WINDOWS_DEVICE_NAMES


def is_valid_name(value: object) -> bool:
    # fullmatch, not match: `$` also matches before a trailing newline.
    return (
        isinstance(value, str)
        and len(value) <= MAX_NAME_LENGTH
        and _NAME_RE.fullmatch(value) is not None
        and not is_device_name(value)
    )


def is_valid_experiment(value: object) -> bool:
    return is_valid_name(value) and value not in CHECKPOINT_REFERENCES


def validate_name(kind: str, value: object) -> str:
    """Return `value` if it is a valid name, else raise `InvalidName` saying what to use.
    (Requests refuse `latest` and `best` as experiments, and the store writes none of that
    name; a reader takes any name of the rule.)"""
    if not is_valid_name(value):
        raise InvalidName(f"invalid {kind} name {value!r}: use {NAME_RULE}")
    assert isinstance(value, str)
    return value


def _not_a_device(value: str) -> str:
    if is_device_name(value):
        raise ValueError(
            f"{value!r} is a Windows device name (CON, PRN, AUX, NUL, COM0-9, LPT0-9, with or "
            "without an extension): choose another name"
        )
    return value


def _not_a_reference(value: str) -> str:
    if value in CHECKPOINT_REFERENCES:
        raise ValueError(
            f"{value!r} names a checkpoint ('latest', 'best'), so it cannot name an "
            "experiment: choose another name"
        )
    return value


# The pattern and the length are what pydantic checks first and the schema shows; the
# validator adds the device names.
Name = Annotated[
    str,
    Field(pattern=NAME_PATTERN, max_length=MAX_NAME_LENGTH, description=NAME_DESCRIPTION),
    AfterValidator(_not_a_device),
]
ExperimentName = Annotated[
    str,
    Field(
        pattern=NAME_PATTERN,
        max_length=MAX_NAME_LENGTH,
        description=f"A name of {EXPERIMENT_RULE}.",
    ),
    AfterValidator(_not_a_device),
    AfterValidator(_not_a_reference),
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

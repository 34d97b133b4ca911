"""Data mixtures (docs/design/data.md, "Data mixtures"): what a checkpoint records of each
dataset of a mixture, and the one rule a resume or a fork continues them by.

No torch: the worker writes and reads these records, the store reads their token counts back
for the API (`CheckpointInfo.source_tokens`), and submit checks a mixture's datasets against each
other (`store.resolve`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trainctl.store.exceptions import InvalidRequest

SOURCES_KEY = "data_sources"
"""metadata.json's record of a mixture's datasets, beside `data_position` (None: no mixture)."""


@dataclass(frozen=True)
class SourcePosition:
    """One dataset of a mixture at a checkpoint: where it is within itself, what it gave."""

    folder: str
    """Its pinned folder: what a fork matches its parent's datasets by."""
    sequences: int
    """Sequences read from it so far: its position within itself."""
    tokens: int
    """Tokens trained on from it: `sequences` x the sequence length(s) they were read at."""

    @property
    def name(self) -> str:
        """Its name in metrics and results (`tokens/<name>`): its folder's name, which is the
        name a dataset under the data dir's datasets/ is asked for by."""
        return source_name(self.folder)


def source_name(folder: str) -> str:
    return Path(folder).name


def token_metric(name: str) -> str:
    """The train metric of the tokens trained on from one dataset of a mixture."""
    return f"tokens/{name}"


def continue_sources(
    saved: Sequence[SourcePosition] | None, folders: Sequence[str]
) -> list[SourcePosition]:
    """The positions a mixture of `folders` starts at from a checkpoint that recorded `saved`
    (None: a checkpoint of no mixture). The rule for a resume and a fork alike: a dataset the
    checkpoint's mixture also read continues where it was, with its token count; any other
    starts at its beginning, with none. A requeued run finds every dataset where it was, so
    it resumes bit for bit; a fork that changes the mixture goes on through the datasets it
    shares with its parent (never replaying their windows in the order the parent read them)
    and reads its new ones from their start."""
    by_folder = {s.folder: s for s in saved or []}
    return [by_folder.get(f, SourcePosition(f, 0, 0)) for f in folders]


def sources_metadata(sources: Sequence[SourcePosition]) -> list[dict[str, Any]]:
    return [asdict(s) | {"name": s.name} for s in sources]


def source_tokens(sources: Sequence[SourcePosition]) -> dict[str, int]:
    """Tokens trained on from each dataset, by its name: a run's result, a checkpoint's."""
    return {s.name: s.tokens for s in sources}


def read_sources(meta: dict[str, Any]) -> list[SourcePosition] | None:
    """A checkpoint's record of its mixture's datasets; None where it records none (no
    mixture, or a checkpoint from before mixtures), or none readable."""
    saved = meta.get(SOURCES_KEY)
    if not isinstance(saved, list):
        return None
    try:
        return [
            SourcePosition(str(s["folder"]), int(s["sequences"]), int(s["tokens"])) for s in saved
        ]
    except (KeyError, TypeError, ValueError):
        return None


def check_distinct_names(fields: Sequence[str], folders: Sequence[str]) -> None:
    """Each dataset once (two names of one folder are one dataset), and each with a name of
    its own: its token count is reported under it."""
    by_folder: dict[str, str] = {}
    by_name: dict[str, str] = {}
    for field, folder in zip(fields, folders, strict=True):
        if folder in by_folder:
            raise InvalidRequest(
                f"{field} names the dataset {by_folder[folder]} names ({folder}); name each "
                "dataset of a mixture once"
            )
        name = source_name(folder)
        if name in by_name:
            raise InvalidRequest(
                f"{field} and {by_name[name]} are both datasets named {name!r} (in other "
                "folders): each dataset's tokens are reported under its name, so rename one"
            )
        by_folder[folder], by_name[name] = field, field

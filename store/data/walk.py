"""Walking data folders and expanding globs within bounds, following no link to a folder
(docs/design/data.md, "Datasets", "Walks and opens").

Python's `glob` follows links to folders under `**`, so two links to `.` make it visit
2^40 paths, and a bound checked only when it yields a match never fires when nothing
matches. Here every entry a walk looks at is a step of its `Bounds` (time, a stop request),
every file it yields counts against them, and `**` and folder walks never descend through a
link: a walk ends, and ends within its bounds, whatever the tree. A link to a file is yielded
like a file; callers confine its real path. Entries come in name order, folder by folder, so
a walk's order is that of the sorted paths (`Path` order: component by component).

Patterns mean what they mean to `glob.glob(pattern, recursive=True)`: `*`, `?` and `[...]`
within one component, `**` as a whole component for zero or more folders, and a wildcard
matches a hidden name only when the pattern's component starts with a dot itself.
"""

from __future__ import annotations

import fnmatch
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from trainctl.store.data.shards import DataError

_MAGIC = frozenset("*?[")
MAX_FILES = 100_000
"""The files one request's data paths may reach: submit's bound, and the worker's."""
EXPAND_SECONDS = 5.0
"""How long expanding them may take."""


class WalkBounded(DataError):
    """A walk went past one of its bounds; the message says which, in words that can follow
    the name of what was walked ("takes more than 5 s to expand")."""


class Bounds:
    """What one walk, or all the walks of one request together, may spend: `check` is called
    at every step, and raises to stop it (a prepare run's cancel)."""

    def __init__(
        self,
        *,
        max_files: int | None = None,
        seconds: float | None = None,
        check: Callable[[], None] | None = None,
    ) -> None:
        self.max_files, self.seconds, self.check = max_files, seconds, check
        self.deadline = None if seconds is None else time.monotonic() + seconds
        self.files = 0

    def step(self) -> None:
        """One entry looked at: past the deadline, or asked to stop, the walk ends here."""
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise WalkBounded(f"takes more than {self.seconds:g} s to expand")
        if self.check is not None:
            self.check()

    def found(self) -> None:
        """One file yielded."""
        self.files += 1
        if self.max_files is not None and self.files > self.max_files:
            raise WalkBounded(f"matches more than {self.max_files:,} files; narrow it")


def has_magic(part: str) -> bool:
    return bool(_MAGIC & set(part))


def glob_paths(pattern: str, bounds: Bounds) -> Iterator[str]:
    """What `pattern` matches (files and folders), in name order. Only `**` walks a tree,
    and never through a link; a literal or one-level wildcard component may be a link (the
    pattern's length bounds how many are followed)."""
    parts = Path(pattern).parts
    if not parts:
        return
    base, rest = (parts[0], parts[1:]) if os.path.isabs(pattern) else (os.curdir, parts)
    for path in _expand(base, list(rest), bounds):
        yield path[2:] if not os.path.isabs(pattern) and path.startswith("./") else path


def _expand(base: str, parts: list[str], bounds: Bounds) -> Iterator[str]:
    if not parts:
        yield base
        return
    head, rest = parts[0], parts[1:]
    if head == "**":
        if not rest:  # a final `**`: the folder and all below it, which walking it gives
            yield base
            return
        yield from _expand(base, rest, bounds)
        for folder in _folders_below(base, bounds):
            yield from _expand(folder, rest, bounds)
    elif not has_magic(head):
        bounds.step()
        path = os.path.join(base, head)
        if rest and os.path.isdir(path):
            yield from _expand(path, rest, bounds)
        elif not rest and os.path.lexists(path):
            yield path
    else:
        for entry in _entries(base, bounds):
            if _matches(entry.name, head):
                if not rest:
                    yield entry.path
                elif entry.is_dir():
                    yield from _expand(entry.path, rest, bounds)


def _matches(name: str, part: str) -> bool:
    if name.startswith(".") and not part.startswith("."):
        return False  # glob's rule: a wildcard does not match a hidden name
    return fnmatch.fnmatchcase(name, part)


def _entries(folder: str, bounds: Bounds, *, quiet: bool = True) -> list[os.DirEntry[str]]:
    """The entries of `folder` by name, each a step. `quiet` (as glob): [] for what is not a
    readable folder; else its OSError."""
    bounds.step()
    try:
        with os.scandir(folder) as found:
            entries = []
            for entry in found:
                bounds.step()
                entries.append(entry)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        if not quiet:
            raise
        return []
    return sorted(entries, key=lambda e: e.name)


def _folders_below(top: str, bounds: Bounds) -> Iterator[str]:
    """Every folder under `top` that `**` reaches, in name order: not hidden, never through a
    link."""
    for entry in _tree(top, bounds, skip_hidden=True, quiet=True):
        if entry.is_dir(follow_symlinks=False):
            yield entry.path


def _tree(
    top: str, bounds: Bounds, *, skip_hidden: bool, quiet: bool
) -> Iterator[os.DirEntry[str]]:
    """Every entry under `top`, depth first in name order (a folder just before what it
    holds), descending into real folders only. Iterative: a tree deeper than Python's
    recursion limit is walked too."""
    stack = [iter(_entries(top, bounds, quiet=quiet))]
    while stack:
        entry = next(stack[-1], None)
        if entry is None:
            stack.pop()
            continue
        if skip_hidden and entry.name.startswith("."):
            continue
        yield entry
        if entry.is_dir(follow_symlinks=False):
            stack.append(iter(_entries(entry.path, bounds, quiet=quiet)))


def walk_files(top: str | Path, bounds: Bounds, *, skip_hidden: bool = False) -> Iterator[str]:
    """Everything under the folder `top` that is not a folder (files, links to files, and
    whatever else is planted there: the caller checks), in name order; sub-folders reached
    through a link are not walked. `skip_hidden`: hidden entries are left out."""
    for entry in _tree(str(top), bounds, skip_hidden=skip_hidden, quiet=False):
        if not entry.is_dir():  # a link to a folder is neither walked nor a file
            bounds.found()
            yield entry.path


def files_under(path: str | Path, bounds: Bounds, *, skip_hidden: bool = False) -> Iterator[str]:
    """`path` itself when it is not a folder, else `walk_files` of it."""
    if os.path.isdir(path):
        yield from walk_files(path, bounds, skip_hidden=skip_hidden)
    else:
        bounds.found()
        yield str(path)

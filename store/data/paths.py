"""Where runs may read training data: patterns checked against the data roots before they are
expanded, and expanded within bounds (docs/design/kinds.md, "Requests and plans").

Submit resolves `data.paths` into files, so a typo is a 422 rather than a failed run. That
must cost the API little whatever a request says: a pattern whose fixed part lies outside
the roots is refused before anything is read, the expansion stops at `MAX_DATA_FILES` files
or `EXPAND_SECONDS`, checked at every entry it looks at (`store.data.walk`: `**` and folders
are walked without following links, so a link loop ends too), and a refusal names only the
request's own pattern, never a file outside the roots. Every file reached must be a regular
file: a FIFO, a socket or a device is refused, since reading it would block the run or read
what is no data. A hardlink is a regular file and is read: every name of a file is as
real as another, datasets use them (deduplicated copies, snapshots), and the kernel lets a
user link only a file they could read and write already (`fs.protected_hardlinks`).

The same rules confine a prepare run's inputs (whose folders are walked without their hidden
files, as `trainctl data prepare` reads them) and tokenizer, and the dataset folder a run
names by a path (`dataset_folder`: a folder inside the roots; a dataset's name is the dataset
store's), down to each file its dataset.json lists (`confine_dataset`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from trainctl.store.data import walk
from trainctl.store.data.datasets import Dataset
from trainctl.store.data.walk import Bounds, WalkBounded, files_under, glob_paths
from trainctl.store.exceptions import InvalidRequest
from trainctl.store.files import NotRegularFile, check_regular
from trainctl.store.specs import DataSpec

MAX_DATA_FILES = walk.MAX_FILES
EXPAND_SECONDS = walk.EXPAND_SECONDS
_GLOB_CHARS = frozenset("*?[")
ROOTS_SETTING = "TRAINCTL_DATA_ROOTS"


def resolve_data(data: DataSpec, roots: list[Path]) -> DataSpec:
    """Expand globs now (so a typo is a 422, not a failed run) and confine them to the roots."""
    if data.source in ("synthetic", "stdlib", "dataset"):
        return data  # a dataset is resolved with its dataset.json (store.plans)
    return data.model_copy(
        update={
            "paths": [str(p) for p in confine_paths(data.paths, roots, "data.paths")],
            "val_paths": [str(p) for p in confine_paths(data.val_paths, roots, "data.val_paths")],
        }
    )


class _Expansion:
    """The files a request's patterns reach, counted and timed across all of them."""

    def __init__(self, roots: list[Path], field: str) -> None:
        self.roots, self.field = roots, field
        self.bounds = Bounds(max_files=MAX_DATA_FILES, seconds=EXPAND_SECONDS)
        self.files: list[Path] = []

    def inside(self, path: str) -> bool:
        real = Path(os.path.realpath(path))
        return any(real.is_relative_to(r) for r in self.roots)

    def refuse(self, pattern: str, problem: str) -> InvalidRequest:
        return InvalidRequest(f"{self.field}: {pattern!r} {problem}")

    def add(self, pattern: str, file: str) -> None:
        if not self.inside(file):
            raise self.refuse(pattern, f"reaches a file outside the data roots ({ROOTS_SETTING})")
        real = Path(os.path.realpath(file))
        try:
            check_regular(os.stat(real), real)
        except NotRegularFile as exc:
            raise self.refuse(pattern, f"reaches {self.shown(real)}, {exc.strerror}") from None
        except OSError as exc:
            raise self.refuse(
                pattern, f"reaches {self.shown(real)}, which cannot be read ({exc.strerror})"
            ) from None
        self.files.append(real)

    def shown(self, real: Path) -> str:
        """A path inside the roots, relative to its root: the user's own name for it."""
        root = next(r for r in self.roots if real.is_relative_to(r))
        return repr(str(real.relative_to(root)))


def confine_paths(
    patterns: list[str], roots: list[Path], field: str, *, skip_hidden: bool = False
) -> list[Path]:
    """The real files `patterns` reach, each inside the roots; `skip_hidden`: a folder's
    hidden files and folders are not read (a file named in a pattern always is)."""
    if patterns and not roots:
        raise InvalidRequest(
            f"{field}: no data roots are configured (set {ROOTS_SETTING}), so no files may be read"
        )
    expansion = _Expansion([Path(os.path.realpath(r)) for r in roots], field)
    for pattern in patterns:
        if "\x00" in pattern:
            raise expansion.refuse(pattern.replace("\x00", "\\x00"), "contains a NUL byte")
        full = pattern if os.path.isabs(pattern) else str(expansion.roots[0] / pattern)
        # Before anything is read: the fixed part of the pattern must lie inside a root.
        if not expansion.inside(_fixed_part(full)):
            raise expansion.refuse(pattern, f"is outside the data roots ({ROOTS_SETTING})")
        before = len(expansion.files)
        try:
            for match in sorted(glob_paths(full, expansion.bounds), key=Path):
                for file in files_under(match, expansion.bounds, skip_hidden=skip_hidden):
                    expansion.add(pattern, file)
        except WalkBounded as exc:
            raise expansion.refuse(pattern, str(exc)) from None
        except OSError as exc:
            raise expansion.refuse(pattern, f"cannot be read ({exc.strerror})") from None
        if len(expansion.files) == before:
            raise expansion.refuse(pattern, "matches no files")
    return expansion.files


def _fixed_part(pattern: str) -> str:
    """The folder a glob pattern starts from: its components before the first wildcard."""
    fixed = list(_until_wildcard(Path(pattern).parts))
    return str(Path(*fixed)) if fixed else os.sep


def _until_wildcard(parts: tuple[str, ...]) -> Iterator[str]:
    for part in parts:
        if _GLOB_CHARS & set(part):
            return
        yield part


# --- a dataset folder -----------------------------------------------------------------------


def dataset_folder(ref: str, roots: list[Path], field: str) -> Path:
    """The real folder a path with a '/' names inside the data roots (relative to the
    first); a dataset's name is the dataset store's (`store.data.pins`)."""
    folder = confine_path(ref, roots, field)
    if not folder.is_dir():
        raise InvalidRequest(f"{field}: {ref!r} is not a folder")
    return folder


def confine_path(ref: str, roots: list[Path], field: str) -> Path:
    """The real path of one file or folder (no pattern) inside the roots: absolute, or
    relative to the first root."""
    if not roots:
        raise InvalidRequest(
            f"{field}: no data roots are configured (set {ROOTS_SETTING}), so nothing there may "
            "be read"
        )
    if "\x00" in ref:
        raise InvalidRequest(f"{field}: {ref!r} contains a NUL byte")  # repr shows it
    expansion = _Expansion([Path(os.path.realpath(r)) for r in roots], field)
    full = ref if os.path.isabs(ref) else str(expansion.roots[0] / ref)
    if not expansion.inside(full):
        raise expansion.refuse(ref, f"is outside the data roots ({ROOTS_SETTING})")
    if not os.path.exists(full):
        raise expansion.refuse(ref, "does not exist")
    return Path(os.path.realpath(full))


def confine_dataset(dataset: Dataset, allowed: list[Path], field: str) -> None:
    """Every file a dataset names (its shards, its tokenizer) is a file inside `allowed`:
    a shard that is a link out of the roots, or missing, is refused before a worker reads it."""
    roots = [Path(os.path.realpath(r)) for r in allowed]
    names = [name for split in dataset.splits.values() for name in split.shards]
    if dataset.tokenizer_path is not None:
        names.append(dataset.tokenizer_path.name)
    if len(names) > MAX_DATA_FILES:
        raise InvalidRequest(f"{field}: names more than {MAX_DATA_FILES:,} files")
    for name in names:
        real = Path(os.path.realpath(dataset.folder / name))
        if not any(real.is_relative_to(r) for r in roots):
            raise InvalidRequest(f"{field}: its file {name!r} lies outside the data roots")
        try:
            check_regular(os.stat(real), real)
        except NotRegularFile as exc:
            raise InvalidRequest(f"{field}: its file {name!r} is {exc.strerror}") from None
        except OSError:
            raise InvalidRequest(
                f"{field}: its dataset.json lists {name!r}, which is missing; prepare it again"
            ) from None

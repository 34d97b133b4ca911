"""Data paths of a request: checked against the data roots before they are expanded, expanded
within bounds, and refused with a message that names only the request's own pattern."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

import trainctl.store.data.paths as datapaths
from tests.support.special_files import plant, self_loops, without_blocking
from trainctl.store.data.paths import confine_paths
from trainctl.store.exceptions import InvalidRequest


@pytest.fixture
def roots(tmp_path: Path) -> list[Path]:
    root = tmp_path / "datasets"
    (root / "corpus" / "b").mkdir(parents=True)
    for name in ["corpus/z.txt", "corpus/b/a.txt", "corpus/a.txt", "train_000.bin"]:
        (root / name).write_text(name)
    return [root]


def test_globs_and_folders_expand_to_sorted_real_files(roots: list[Path]) -> None:
    root = roots[0]
    assert confine_paths(["corpus"], roots, "data.paths") == [
        root / "corpus/a.txt", root / "corpus/b/a.txt", root / "corpus/z.txt",
    ]  # fmt: skip
    assert confine_paths([str(root / "*.bin")], roots, "data.paths") == [root / "train_000.bin"]


@pytest.mark.parametrize("pattern", ["/", "/usr", "/proc/**", "../../../etc/*", "/etc/passwd"])
def test_a_pattern_outside_the_roots_is_refused_before_anything_is_read(
    roots: list[Path], pattern: str
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        confine_paths([pattern], roots, "data.paths")

    message = str(refused.value)
    assert message == f"data.paths: {pattern!r} is outside the data roots (TRAINCTL_DATA_ROOTS)"


def test_a_link_out_of_the_roots_is_refused_without_naming_its_target(
    roots: list[Path], tmp_path: Path
) -> None:
    secret = tmp_path / "elsewhere" / "secret-file-name.txt"
    secret.parent.mkdir()
    secret.write_text("not for the API")
    os.symlink(secret, roots[0] / "corpus" / "leak.txt")

    with pytest.raises(InvalidRequest, match="reaches a file outside the data roots") as refused:
        confine_paths(["corpus/*.txt"], roots, "data.paths")

    assert "secret-file-name" not in str(refused.value)
    assert "elsewhere" not in str(refused.value)


def test_a_link_to_a_folder_is_not_walked(roots: list[Path], tmp_path: Path) -> None:
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "x.txt").write_text("x")
    os.symlink(tmp_path / "big", roots[0] / "corpus" / "linked")

    found = confine_paths(["corpus"], roots, "data.paths")

    assert all("linked" not in str(f) for f in found)


def test_a_pattern_matching_too_many_files_is_refused(
    roots: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(datapaths, "MAX_DATA_FILES", 2)
    with pytest.raises(InvalidRequest, match="'corpus' matches more than 2 files; narrow it"):
        confine_paths(["corpus"], roots, "data.paths")


def test_the_bound_counts_every_pattern_of_the_request(
    roots: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(datapaths, "MAX_DATA_FILES", 3)
    with pytest.raises(InvalidRequest, match="matches more than 3 files"):
        confine_paths(["corpus", "train_000.bin"], roots, "data.paths")


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [("nothing-*.bin", "matches no files"), ("corp\x00us", "contains a NUL byte")],
)
def test_other_refusals_name_the_pattern(roots: list[Path], pattern: str, problem: str) -> None:
    with pytest.raises(InvalidRequest, match=problem):
        confine_paths([pattern], roots, "data.val_paths")


def test_without_roots_no_path_is_read(roots: list[Path]) -> None:
    with pytest.raises(InvalidRequest, match="no data roots are configured"):
        confine_paths(["corpus"], [], "data.paths")


# --- special files and walks that end --------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "socket"])
@pytest.mark.parametrize("pattern", ["corpus/pipe", "corpus/*", "corpus", "**/pipe"])
def test_a_fifo_or_socket_a_pattern_reaches_is_refused_naming_it(
    roots: list[Path], kind: str, pattern: str
) -> None:
    """A FIFO would block the run's read for good; by name, by glob or in a walked folder,
    it is refused at submit."""
    plant(roots[0] / "corpus" / "pipe", kind)
    what = "a FIFO" if kind == "fifo" else "a socket"

    with pytest.raises(InvalidRequest) as refused:
        without_blocking(lambda: confine_paths([pattern], roots, "data.paths"), "the expansion")

    assert str(refused.value) == (
        f"data.paths: {pattern!r} reaches 'corpus/pipe', {what}, not a regular file"
    )


def test_a_hardlink_inside_the_roots_is_read_like_any_file(roots: list[Path]) -> None:
    """Datasets use hardlinks (deduplicated copies, snapshots); every name of a file is as
    real as another, and the kernel lets a user link only what they could read already."""
    os.link(roots[0] / "corpus" / "a.txt", roots[0] / "corpus" / "c.txt")
    assert roots[0] / "corpus" / "c.txt" in confine_paths(["corpus"], roots, "data.paths")


@pytest.mark.parametrize("pattern", ["**/nomatch", "**/*.nomatch", "corpus/**/x/*.txt"])
def test_link_loops_end_a_pattern_that_matches_nothing(roots: list[Path], pattern: str) -> None:
    """Two links to `.` make a walk that follows links visit 2^40 paths; with nothing
    matching, a bound checked on matches alone never fires."""
    self_loops(roots[0], "a", "b")
    self_loops(roots[0] / "corpus", "c", "d")

    with pytest.raises(InvalidRequest, match="matches no files"):
        without_blocking(lambda: confine_paths([pattern], roots, "data.paths"), "the expansion")


def test_link_loops_are_not_followed_by_a_pattern_that_matches(roots: list[Path]) -> None:
    self_loops(roots[0], "a", "b")
    self_loops(roots[0] / "corpus", "c")

    found = without_blocking(lambda: confine_paths(["**/*.txt"], roots, "data.paths"), "a glob")

    assert found == [
        roots[0] / "corpus/a.txt",
        roots[0] / "corpus/b/a.txt",
        roots[0] / "corpus/z.txt",
    ]


class SteppingClock:
    """A monotonic clock that moves a second each time it is read: the expansion's time bound
    is then reached after a fixed number of looks, on any machine."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_the_time_bound_is_checked_at_every_entry_even_when_none_matches(
    roots: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tree of empty folders gives a glob nothing to yield: the bound must be checked on
    the entries it looks at, not on its matches."""
    for i in range(200):
        (roots[0] / "tree" / f"d{i:03d}" / "e").mkdir(parents=True)

    for pattern in ["tree/**/nomatch", "tree"]:
        with monkeypatch.context() as clocked, pytest.raises(InvalidRequest) as refused:
            clocked.setattr(time, "monotonic", SteppingClock())
            confine_paths([pattern], roots, "data.paths")
        assert str(refused.value) == f"data.paths: {pattern!r} takes more than 5 s to expand"


def test_a_tree_deeper_than_the_recursion_limit_is_walked(roots: list[Path]) -> None:
    """A walk is a loop, not a recursion. The limit is lowered for the call, so that the tree
    stays shallow enough for pytest's own cleanup (shutil.rmtree recurses)."""
    bottom = roots[0] / "deep" / "/".join(["d"] * 300)
    bottom.mkdir(parents=True)
    (bottom / "leaf.txt").write_text("leaf")
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(250)
    try:
        found = confine_paths(["deep"], roots, "data.paths")
    finally:
        sys.setrecursionlimit(limit)

    assert found == [bottom / "leaf.txt"]

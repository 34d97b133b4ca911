"""Data paths of a request: checked against the data roots before they are expanded, expanded
within bounds, and refused with a message that names only the request's own pattern."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import trainctl.store.data.paths as datapaths
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

"""docs/performance.md's summary table is what bench/results.json writes (bench/summary.py), so
a hand edit of the table fails here; and a run's figures land in the rows they belong to.
Nothing here measures anything."""

from __future__ import annotations

import copy

import pytest

from bench import summary
from bench.common import Figure


def test_the_summary_table_in_the_doc_is_the_one_the_records_write() -> None:
    doc = summary.DOC.read_text(encoding="utf-8")
    assert summary.rewrite(doc, summary.load()) == doc, (
        "docs/performance.md's summary differs from bench/results.json: edit the records and "
        "run `python -m bench --summary`"
    )


def test_a_hand_edit_of_the_table_is_caught() -> None:
    doc = summary.DOC.read_text(encoding="utf-8")
    edited = doc.replace("| 1.029× |", "| 1.100× |", 1)
    assert edited != doc
    assert summary.rewrite(edited, summary.load()) != edited


def test_a_doc_without_the_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="no summary markers"):
        summary.rewrite("# Performance\n\n| # | what |\n", summary.load())


def test_every_record_is_a_row_the_bench_measures_or_one_kept_by_hand() -> None:
    rows = [r.row for r in summary.load()]
    assert len(rows) == len(set(rows))
    by_hand = set(rows) - set(summary.ROWS)
    assert by_hand == {"7"}, "row 7 is bench/gpu.sh's; every other row comes from python -m bench"
    assert set(summary.ROWS) <= set(rows)


def figures_of(row: str, values: list[float], targets: list[float | None]) -> list[Figure]:
    names = summary.ROWS[row].figures
    return [
        Figure(name, value, "x", target=target, lower_is_better=row in {"12c", "6a"})
        for name, value, target in zip(names[: len(values)], values, targets, strict=True)
    ]


def test_a_run_rewrites_the_rows_it_measured_and_no_other() -> None:
    records = summary.load()
    before = copy.deepcopy(records)
    figures = [
        *figures_of("1", [0.951], [0.97]),
        *figures_of("12c", [0.12, 0.004], [0.10, 0.10]),
        *figures_of("9a", [2.0, 1.9, 1.2], [1.0, 1.0, 1.0]),  # one of four: not this row
        Figure("model step: a figure no row reads", 1.0, "x"),
    ]
    updated = summary.record(records, figures, "2027-01-02", "1 CPU cores, no GPU, torch 9")
    assert updated == ["1", "12c"]
    one = next(r for r in records if r.row == "1")
    assert (one.figure, one.met, one.date, one.machine, one.note) == (
        "0.951×",
        "**no**",
        "2027-01-02",
        "1 CPU cores, no GPU, torch 9",
        "",
    )
    stalls = next(r for r in records if r.row == "12c")
    assert (stalls.figure, stalls.met) == ("0.120× / 0.004×", "background only")
    assert stalls.what == next(r for r in before if r.row == "12c").what
    untouched = [(a, b) for a, b in zip(before, records, strict=True) if a.row not in updated]
    assert all(a == b for a, b in untouched)


def test_rows_show_their_figures_as_the_doc_does() -> None:
    show = {row: spec.show for row, spec in summary.ROWS.items()}
    assert show["5a"]([3.04e6]) == "3.0e6×"
    assert (
        show["9b"]([2.91, 10.6, 3.9, 16.04])
        == "2.9× / 10.6× (tiny, batch 1 / 8); 3.9× / 16.0× (d256x4)"
    )
    assert show["10b"]([221.2, 194.4, 0.879]) == (
        "221 / 194 runs/s (10k / 1k = 0.88×), every run claimed once"
    )
    state = figures_of("12d", [0.5, 0.25, 1.45, 1.28], [None] * 4)
    assert summary.ROWS["12d"].judge(state) == "yes (state)"
    assert summary.ROWS["12d"].judge(figures_of("12d", [0.6, 0.25, 1, 1], [None] * 4)) == (
        "**no** (state)"
    )
    assert summary.ROWS["8d"].judge(figures_of("8d", [3.6, 2.8, 1.3], [None] * 3)) == "–"


def test_the_machine_line_names_each_machine_with_its_rows() -> None:
    records = summary.load()[:3]
    records[2].machine = "8 CPU cores, 1× NVIDIA H200, torch 2.13.0"
    lines = summary.table(records).splitlines()
    assert lines[-2:] == [
        "Rows 1, 2 ran on: 2 CPU cores, no GPU, torch 2.13.0+cpu.",
        "Rows 3 ran on: 8 CPU cores, 1× NVIDIA H200, torch 2.13.0.",
    ]

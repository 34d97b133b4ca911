"""One bad row never breaks a listing (store/db/rows.py): rows written straight into the
database with what this trainctl never writes (a lone surrogate, bytes that are not UTF-8,
JSON that does not parse, a value of the wrong shape, one nested too deep) are listed, read
and cancelled, with that part replaced or repaired; on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.rows import SURROGATE_SPEC, Poison
from trainctl.store.db.records import Run
from trainctl.store.db.rows import UNREADABLE
from trainctl.store.db.runs import RunStore
from trainctl.store.text import unencodable

DEEP = '{"a": ' * 100 + "1" + "}" * 100


@pytest.fixture
def store(database_url: str) -> Iterator[RunStore]:
    with RunStore(database_url) as run_store:
        run_store.create_all()
        yield run_store


def replaced(why: str) -> Callable[[Any], bool]:
    return lambda value: (
        isinstance(value, dict) and list(value) == [UNREADABLE] and why in value[UNREADABLE]
    )


RUN_CASES = {
    # A plan is replaced, never repaired: a worker runs it as asked or not at all.
    "spec-lone-surrogate": (Poison("spec", SURROGATE_SPEC), "spec", replaced("lone surrogate")),
    "spec-not-an-object": (Poison("spec", "[1, 2]"), "spec", replaced("a JSON list, not a dict")),
    "spec-nested-too-deep": (Poison("spec", DEEP), "spec", replaced("nested more than 64")),
    "spec-not-json": (Poison("spec", raw=b'{"a":'), "spec", replaced("not JSON")),
    "spec-not-utf8": (Poison("spec", raw=b'{"a": "\xed\xa0\x80"}'), "spec", replaced("surrogate")),
    "result-lone-surrogate": (
        Poison("result", '{"completions": ["ok\\ud800"]}'),
        "result",
        lambda r: r == {"completions": ["ok\ufffd"]},
    ),
    "result-a-string": (Poison("result", '"done"'), "result", replaced("a JSON str")),
    "error-not-utf8": (Poison("error", raw=b"oops \xff"), "error", lambda e: e == "oops \ufffd"),
    "experiment-not-utf8": (
        Poison("experiment", raw=b"exp\xc3"),
        "experiment",
        lambda e: e == "exp\ufffd",
    ),
    "depends-on-of-another-shape": (
        Poison("depends_on", '[["a"], 5, ["exp", "step_1"], "x"]'),
        "depends_on",
        lambda d: d == [("exp", "step_1")],
    ),
}


@pytest.mark.parametrize("case", list(RUN_CASES), ids=list(RUN_CASES))
def test_a_run_row_that_cannot_be_shown_as_it_is_is_listed_read_and_cancelled(
    store: RunStore, case: str
) -> None:
    poison, field, expected = RUN_CASES[case]
    if poison.raw is not None and store.engine.dialect.name != "sqlite":
        pytest.skip("PostgreSQL refuses text that is not UTF-8, so no such row can exist")
    good = store.enqueue("benchmark", "good", {"steps": 1})
    bad = store.enqueue("benchmark", "bad", {"steps": 1})
    poison.write(store, "runs", "id", bad.id)

    listed, _ = store.list_runs()
    read = store.get(bad.id)
    cancelled = store.request_cancel(bad.id)

    assert [run.id for run in listed] == [bad.id, good.id]
    assert listed[1] == store.get(good.id) and listed[1].unreadable is None
    for run in (listed[0], read, cancelled):
        assert expected(getattr(run, field)), getattr(run, field)
        assert run.unreadable is not None and field in run.unreadable
        assert shown_whole(run)
    assert cancelled.state == "cancelled"


def shown_whole(run: Run) -> bool:
    """Every string of the run can be written as UTF-8: an answer can show it."""
    return unencodable(list(vars(run).values())) is None


def test_a_claimed_run_whose_plan_cannot_be_read_reaches_its_worker_as_unreadable(
    store: RunStore,
) -> None:
    queued = store.enqueue("benchmark", "bad", {"steps": 1})
    Poison("spec", SURROGATE_SPEC).write(store, "runs", "id", queued.id)

    claimed = store.claim("w1", lease_seconds=60)

    assert claimed is not None and claimed.id == queued.id
    assert replaced("lone surrogate")(claimed.spec)  # the worker's read_plan refuses it


def test_protection_reads_past_a_dependency_of_another_shape(store: RunStore) -> None:
    kept = store.enqueue("validate", "e", {}, depends_on=[("e", "step_1")])
    bad = store.enqueue("validate", "e", {}, depends_on=[("e", "step_2")])
    Poison("depends_on", '{"not": "a list"}').write(store, "runs", "id", bad.id)

    assert store.protected_checkpoints() == {("e", "step_1")}
    assert store.get(kept.id).depends_on == [("e", "step_1")]


@pytest.mark.parametrize(
    ("poison", "expected"),
    [
        (Poison("data", '{"kind": "train", "loss": 1.5, "note": "\\udc80"}'), {"note": "\ufffd"}),
        (Poison("data", raw=b'{"kind": "tr'), {UNREADABLE: "not JSON"}),
        (Poison("data", "[1]"), {UNREADABLE: "a JSON list"}),
    ],
    ids=["lone-surrogate", "not-json", "not-an-object"],
)
def test_an_event_that_cannot_be_shown_as_it_is_is_read_with_the_others(
    store: RunStore, poison: Poison, expected: dict[str, str]
) -> None:
    if poison.raw is not None and store.engine.dialect.name != "sqlite":
        pytest.skip("PostgreSQL's JSON refuses what does not parse, so no such row can exist")
    run = store.enqueue("benchmark", "e", {"steps": 1})
    first = store.append_event(run.id, "metrics", {"kind": "train", "loss": 2.0})
    bad = store.append_event(run.id, "metrics", {"kind": "train", "loss": 1.5})
    poison.write(store, "run_events", "id", str(bad))

    events = store.events(run.id)

    assert [e.id for e in events] == [first, bad]
    assert events[0].data == {"kind": "train", "loss": 2.0}
    ((key, value),) = expected.items()
    assert value in events[1].data[key]
    assert unencodable(events[1].data) is None


@pytest.mark.parametrize(
    "poison",
    [
        Poison("info", '{"gpus": ["\\ud800"], "memory_bytes": 1}'),
        Poison("info", "[]"),
        Poison("host", raw=b"node-\xff"),
    ],
    ids=["info-lone-surrogate", "info-not-an-object", "host-not-utf8"],
)
def test_a_worker_row_that_cannot_be_shown_as_it_is_is_listed(
    store: RunStore, poison: Poison
) -> None:
    if poison.raw is not None and store.engine.dialect.name != "sqlite":
        pytest.skip("PostgreSQL refuses text that is not UTF-8, so no such row can exist")
    store.workers.register("good", host="n1", pid=1, device="cpu", info={"cores": 2})
    store.workers.register("bad", host="n2", pid=2, device="cpu", info={"cores": 2})
    poison.write(store, "workers", "id", "bad")

    workers = {w.id: w for w in store.workers.list_workers()}

    assert workers["good"].info == {"cores": 2}
    assert unencodable([workers["bad"].host, workers["bad"].info]) is None


def test_what_a_worker_reports_is_stored_so_that_it_can_be_shown(store: RunStore) -> None:
    """Text from a worker (an error, a log line, a result) is repaired, not refused: the run
    must finish whatever its text holds. A NUL fits no PostgreSQL text, and an infinity no
    PostgreSQL JSON."""
    run = store.enqueue("benchmark", "e", {"steps": 1})
    claimed = store.claim("w1", lease_seconds=60)
    assert claimed is not None
    store.append_event(
        run.id, "log", {"level": "info", "message": "a\ud800b\x00"}, worker_id="w1", attempt=1
    )
    store.append_event(
        run.id, "metrics", {"kind": "val", "val_ppl": float("inf")}, worker_id="w1", attempt=1
    )
    finished = store.finish(
        run.id,
        "w1",
        1,
        "failed",
        result={"x": "\udc80", "nan": float("nan")},
        error="bad\x00\ud800",
    )

    log, metrics = (e.data for e in store.events(run.id)[1:3])
    assert log["message"] == "a\ufffdb\x00"  # a NUL in JSON is fine, on both databases
    assert metrics["val_ppl"] is None
    assert finished.result == {"x": "\ufffd", "nan": None}
    assert finished.error == "bad\\0\ufffd"
    assert store.get(run.id).unreadable is None

"""Migration 0006 (store/db/migrations/versions/0006_*.py) on SQLite and PostgreSQL: a
database of revision 0005, with runs, events and tokens whose names differ only by case,
keeps every row; its idempotency keys become their submitter's own, its token names one in
any case (the younger renamed, its runs following it), and its other constraints and
indexes stay as they were."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from alembic import command
from sqlalchemy import insert, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from trainctl.store.db.migrations import alembic_config, head_revision
from trainctl.store.db.runs import RunStore
from trainctl.store.db.schema import (
    api_tokens,
    build_engine,
    run_events,
    runs,
    schema_transaction,
    webhooks,
    write_transaction,
)
from trainctl.store.db.tokens import TokenStore
from trainctl.store.exceptions import Conflict, ExperimentBusy

T0 = datetime(2027, 1, 1, tzinfo=UTC)
TOKENS = [("T-READ", T0), ("t-read", T0 + timedelta(days=1)), ("Bootstrap", T0), ("bob", T0)]


def at_0005_with_rows(url: str) -> None:
    """A database as trainctl left it at revision 0005, and rows in it."""
    engine = build_engine(url)
    with schema_transaction(engine) as conn:
        command.upgrade(alembic_config(conn), "0005")
        for name, when in TOKENS:
            conn.execute(insert(api_tokens).values(
                name=name, scope="submit", token_sha256=name.encode().hex().ljust(64, "0"),
                created_by="T-READ" if name == "bob" else None, created_at=when,
            ))  # fmt: skip
        for i, (by, key) in enumerate([("T-READ", "k"), ("t-read", "k2"), ("Bootstrap", None)]):
            add_run(conn, f"run-{i}", by, key)
            conn.execute(insert(run_events).values(
                run_id=f"run-{i}", type="state", data={"state": "queued"}, created_at=T0,
            ))  # fmt: skip
        conn.execute(insert(webhooks).values(
            url="http://hooks.example/", events=["failed"], secret="whsec_x", after_event_id=0,
            created_by="t-read", created_at=T0,
        ))  # fmt: skip
    engine.dispose()


def add_run(conn: Connection, run_id: str, by: str | None, key: str | None) -> None:
    conn.execute(insert(runs).values(
        id=run_id, kind="benchmark", experiment="exp", state="queued", spec={}, step=0,
        attempt=1, max_attempts=3, cancel_requested=False, depends_on=[], created_at=T0,
        submitted_by=by, idempotency_key=key, priority=0, nnodes=1, gpus_per_node=0,
        procs_per_node=1, spread="any", queued_at=T0,
    ))  # fmt: skip


def index_sql(conn: Connection, name: str) -> str:
    if conn.dialect.name == "sqlite":
        query = "SELECT sql FROM sqlite_master WHERE name = :name"
    else:
        query = "SELECT indexdef FROM pg_indexes WHERE indexname = :name"
    return str(conn.execute(text(query), {"name": name}).scalar_one())


@pytest.fixture
def migrated(database_url: str) -> Iterator[RunStore]:
    at_0005_with_rows(database_url)
    with RunStore(database_url) as store:
        store.create_all()
        yield store


def test_every_row_is_kept_and_the_younger_of_two_names_is_renamed_with_its_runs(
    migrated: RunStore,
) -> None:
    with migrated.engine.connect() as conn:
        names = dict(conn.execute(select(api_tokens.c.name, api_tokens.c.created_by)).all())
        submitters = dict(conn.execute(select(runs.c.id, runs.c.submitted_by)).all())
        hook_by = conn.execute(select(webhooks.c.created_by)).scalar_one()
        events = conn.execute(select(run_events.c.run_id)).scalars().all()

    assert names == {"T-READ": None, "t-read-2": None, "Bootstrap-2": None, "bob": "T-READ"}
    assert submitters == {"run-0": "T-READ", "run-1": "t-read-2", "run-2": "Bootstrap-2"}
    assert hook_by == "t-read-2"
    assert sorted(events) == ["run-0", "run-1", "run-2"]


def test_keys_become_their_submitters_own(migrated: RunStore) -> None:
    def submit(by: str) -> str:
        return migrated.enqueue("benchmark", "exp", {}, idempotency_key="k", submitted_by=by).id

    assert submit("bob") != "run-0"  # T-READ's key, bob's own run
    assert submit("BOB") == submit("bob")
    assert submit("t-read") == "run-0"  # T-READ's, in any case
    with pytest.raises(IntegrityError), write_transaction(migrated.engine) as conn:
        add_run(conn, "run-9", "bob", "k")  # the database itself refuses a second


def test_token_names_are_one_in_any_case_in_the_database_too(migrated: RunStore) -> None:
    with pytest.raises(Conflict, match="'T-READ' exists already"):
        TokenStore(migrated.engine).create("t-Read", "read", None)
    with pytest.raises(IntegrityError), write_transaction(migrated.engine) as conn:
        conn.execute(insert(api_tokens).values(
            name="BOB", scope="read", token_sha256="f" * 64, created_at=T0,
        ))  # fmt: skip


def test_the_other_constraints_and_indexes_stay_as_they_were(migrated: RunStore) -> None:
    with migrated.engine.connect() as conn:
        queue = index_sql(conn, "ix_runs_queue")
        one_train = index_sql(conn, "uq_runs_one_active_train")
        revision = conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one()
    with pytest.raises(IntegrityError), write_transaction(migrated.engine) as conn:
        conn.execute(insert(run_events).values(
            run_id="no-such-run", type="log", data={}, created_at=T0,
        ))  # fmt: skip

    assert revision == head_revision()
    assert "priority DESC" in queue
    assert "train" in one_train and "queued" in one_train
    migrated.enqueue("train", "busy", {})
    with pytest.raises(ExperimentBusy):
        migrated.enqueue("train", "busy", {})

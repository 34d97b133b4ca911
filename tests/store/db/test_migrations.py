"""Schema migrations (store/db/migrations): every database, new or made before migrations
existed, ends at the schema store/db/schema.py declares, even when several processes start at
once."""

from __future__ import annotations

import multiprocessing
import warnings
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import insert, inspect, text

from trainctl.store.db.migrations import current_revision, head_revision
from trainctl.store.db.runs import RunStore
from trainctl.store.db.schema import build_engine, metadata, runs, write_transaction


def schema_differences(url: str) -> list[Any]:
    """What differs from the declared schema. SQLAlchemy reflects no index on an expression
    on SQLite (it warns, and the comparison passes over them): those are tested by use."""
    engine = build_engine(url)
    try:
        with engine.connect() as conn, warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Skipped unsupported reflection of expression")
            warnings.filterwarnings("ignore", "autogenerate skipping metadata-specified expr")
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            return list(compare_metadata(context, metadata))
    finally:
        engine.dispose()


def revision(url: str) -> str | None:
    engine = build_engine(url)
    try:
        with engine.connect() as conn:
            return current_revision(conn)
    finally:
        engine.dispose()


def test_a_fresh_database_migrates_to_exactly_the_declared_schema(database_url: str) -> None:
    with RunStore(database_url) as store:
        store.create_all()

    assert revision(database_url) == head_revision()
    assert schema_differences(database_url) == []


def test_migrating_again_changes_nothing(database_url: str) -> None:
    with RunStore(database_url) as store:
        store.create_all()
        run = store.enqueue("benchmark", "exp", {"steps": 1})
        store.create_all()

        assert store.get(run.id) == run
    assert schema_differences(database_url) == []


def test_a_database_made_before_migrations_is_adopted_with_its_runs(database_url: str) -> None:
    """Older trainctl created the tables with metadata.create_all, before `request_digest`."""
    engine = build_engine(database_url)
    with write_transaction(engine) as conn:
        metadata.create_all(conn)
        # What that trainctl had: none of the later columns, indexes and tables.
        conn.execute(text("DROP INDEX uq_runs_idempotency"))
        conn.execute(text("ALTER TABLE runs DROP COLUMN request_digest"))
        conn.execute(text("DROP INDEX ix_runs_submitted_by"))
        conn.execute(text("ALTER TABLE runs DROP COLUMN submitted_by"))
        conn.execute(text("DROP TABLE api_tokens"))
        conn.execute(
            insert(runs).values(
                seq=1, id="old-run", kind="benchmark", experiment="exp", state="queued",
                spec={}, step=0, attempt=1, max_attempts=3, cancel_requested=False,
                depends_on=[], created_at=text("CURRENT_TIMESTAMP"),
            )
        )  # fmt: skip
    with engine.connect() as conn:
        assert "request_digest" not in {c["name"] for c in inspect(conn).get_columns("runs")}
    engine.dispose()

    with RunStore(database_url) as store:
        store.create_all()
        assert store.get("old-run").state == "queued"

    assert revision(database_url) == head_revision()
    assert schema_differences(database_url) == []


def _migrate(url: str, start: Any) -> None:
    start.wait()
    with RunStore(url) as store:
        store.create_all()


@pytest.mark.slow
def test_several_processes_migrating_one_new_database_at_once_all_succeed(
    database_url: str,
) -> None:
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(4)
    processes = [context.Process(target=_migrate, args=(database_url, start)) for _ in range(4)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)

    assert [process.exitcode for process in processes] == [0, 0, 0, 0]
    assert revision(database_url) == head_revision()
    assert schema_differences(database_url) == []

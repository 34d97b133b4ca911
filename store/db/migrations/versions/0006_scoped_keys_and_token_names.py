"""Idempotency keys per submitter; token names one in any case.

Revision ID: 0006
Revises: 0005
Create Date: 2027-03-01

`runs.idempotency_key` was unique across the table, so a token reusing another token's key
got that token's run. It is now unique per submitter: `uq_runs_idempotency` on the
submitter's name in lower case ('' for none) and the key. On PostgreSQL the old constraint
is dropped. On SQLite a table's constraint goes only with the table, so `runs` is built anew
from its own CREATE statement less that constraint, its rows copied over and its indexes
made again from their own statements: SQLite's way of altering a table (foreign keys are
checked once, at the end: store/db/schema.py, `schema_transaction`).

Token names become one in any case: `uq_api_tokens_name_lower`. Where names differ only by
case already, the oldest token keeps its name and each other is renamed `<name>-2` (or -3,
...), and the runs it submitted and the tokens and webhooks it created follow it: its holder
goes on using it, under the name `trainctl tokens list` shows, and owns the same runs. So is
a token named `bootstrap` in another case: that name is TRAINCTL_API_TOKEN's.

The names are spelled out here, not imported from store/db/schema.py: a revision records
the schema as it was.
"""

from __future__ import annotations

import re

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

MAX_NAME = 128
BOOTSTRAP = "bootstrap"
SCOPE = "lower(coalesce(submitted_by, ''))"
# How SQLAlchemy wrote the constraint: a table constraint (0001, create_all); or inline.
_TABLE_UNIQUE = re.compile(r",\s*UNIQUE \(idempotency_key\)")
_INLINE_UNIQUE = re.compile(r"(idempotency_key VARCHAR\(200\)) UNIQUE")

tokens = sa.table("api_tokens", sa.column("name"), sa.column("created_at"), sa.column("created_by"))
runs = sa.table("runs", sa.column("submitted_by"))
webhooks = sa.table("webhooks", sa.column("created_by"))


def upgrade() -> None:
    bind = op.get_bind()
    _one_name_in_any_case(bind)
    if not _has_index(bind, "uq_api_tokens_name_lower"):
        op.create_index(
            "uq_api_tokens_name_lower", "api_tokens", [sa.text("lower(name)")], unique=True
        )
    _drop_global_key_constraint(bind)
    if not _has_index(bind, "uq_runs_idempotency"):
        op.create_index(
            "uq_runs_idempotency", "runs", [sa.text(SCOPE), "idempotency_key"], unique=True
        )


def downgrade() -> None:
    """Back to one key per table (fails if two submitters use one key); names stay renamed."""
    bind = op.get_bind()
    op.drop_index("uq_runs_idempotency", table_name="runs")
    op.drop_index("uq_api_tokens_name_lower", table_name="api_tokens")
    if bind.dialect.name == "sqlite":
        table = _sqlite_table_sql(bind)
        end = table.rindex(")")
        _sqlite_rebuild_runs(bind, f"{table[:end].rstrip()}, \n\tUNIQUE (idempotency_key)\n)")
    else:
        op.create_unique_constraint("runs_idempotency_key_key", "runs", ["idempotency_key"])


def _has_index(bind: sa.Connection, name: str) -> bool:
    """By name: SQLAlchemy reflects no index on an expression on SQLite (it warns instead)."""
    if bind.dialect.name == "sqlite":
        query = "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = :name"
    else:
        query = "SELECT 1 FROM pg_indexes WHERE indexname = :name"
    return bind.execute(sa.text(query), {"name": name}).first() is not None


def _one_name_in_any_case(bind: sa.Connection) -> None:
    """Rename every token whose name another, older one has in another case."""
    names = list(
        bind.execute(
            sa.select(tokens.c.name).order_by(tokens.c.created_at, tokens.c.name)
        ).scalars()
    )
    existing = {name.lower() for name in names}
    kept = {BOOTSTRAP}
    for name in names:
        if name.lower() not in kept:
            kept.add(name.lower())
            continue
        new = _free_name(name, existing | kept)
        kept.add(new.lower())
        bind.execute(sa.update(tokens).where(tokens.c.name == name).values(name=new))
        bind.execute(sa.update(tokens).where(tokens.c.created_by == name).values(created_by=new))
        bind.execute(sa.update(runs).where(runs.c.submitted_by == name).values(submitted_by=new))
        bind.execute(
            sa.update(webhooks).where(webhooks.c.created_by == name).values(created_by=new)
        )


def _free_name(name: str, taken: set[str]) -> str:
    """`<name>-2`, `-3`, ...: the first that no token has in any case (at most 128 long)."""
    n = 2
    while True:
        suffix = f"-{n}"
        candidate = name[: MAX_NAME - len(suffix)] + suffix
        if candidate.lower() not in taken:
            return candidate
        n += 1


def _drop_global_key_constraint(bind: sa.Connection) -> None:
    if bind.dialect.name != "sqlite":
        for unique in sa.inspect(bind).get_unique_constraints("runs"):
            if unique["column_names"] == ["idempotency_key"] and unique["name"]:
                op.drop_constraint(unique["name"], "runs", type_="unique")
        return
    table = _sqlite_table_sql(bind)
    scoped = _INLINE_UNIQUE.sub(r"\1", _TABLE_UNIQUE.sub("", table))
    if scoped != table:  # a database created after this revision has none
        _sqlite_rebuild_runs(bind, scoped)


def _sqlite_table_sql(bind: sa.Connection) -> str:
    query = "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'runs'"
    return str(bind.exec_driver_sql(query).scalar_one())


def _sqlite_rebuild_runs(bind: sa.Connection, table_sql: str) -> None:
    """`runs` anew from `table_sql`, with its rows and its indexes (as they were written)."""
    query = "SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'runs'"
    indexes = [sql for sql in bind.exec_driver_sql(query).scalars() if sql is not None]
    bind.exec_driver_sql(re.sub(r'^CREATE TABLE "?runs"?', "CREATE TABLE runs_0006", table_sql))
    bind.exec_driver_sql("INSERT INTO runs_0006 SELECT * FROM runs")
    bind.exec_driver_sql("DROP TABLE runs")
    bind.exec_driver_sql("ALTER TABLE runs_0006 RENAME TO runs")
    for sql in indexes:
        bind.exec_driver_sql(sql)

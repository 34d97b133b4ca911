"""The initial schema: runs, run_events, workers (as store/db/schema.py had them before migrations).

Revision ID: 0001
Revises:
Create Date: 2025-01-01

Databases created before trainctl had migrations (by `metadata.create_all`) already hold
these tables, some without the later `request_digest` column. This revision adopts them:
it creates only what is missing, so every database, new or old, ends at the same schema.
The types are spelled out here rather than imported from store/db/schema.py: a revision records the
schema as it was, and must not change when db.py does.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# SQLite's INTEGER PRIMARY KEY is the rowid; PostgreSQL gets a 64-bit identity.
ID_INT = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
ACTIVE_TRAIN = sa.text("kind = 'train' AND state IN ('queued', 'running')")


def _timestamp(name: str, nullable: bool) -> sa.Column[Any]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _create_runs() -> None:
    op.create_table(
        "runs",
        sa.Column("seq", ID_INT, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(32), nullable=False, unique=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("experiment", sa.String(200), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("total_steps", sa.Integer(), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("worker_id", sa.String(100), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        _timestamp("lease_expires_at", nullable=True),
        sa.Column("idempotency_key", sa.String(200), nullable=True, unique=True),
        sa.Column("request_digest", sa.String(64), nullable=True),
        sa.Column("depends_on", sa.JSON(), nullable=False),
        _timestamp("created_at", nullable=False),
        _timestamp("started_at", nullable=True),
        _timestamp("finished_at", nullable=True),
    )
    op.create_index("ix_runs_state_created", "runs", ["state", "created_at", "seq"])
    op.create_index("ix_runs_created", "runs", ["created_at", "seq"])
    op.create_index("ix_runs_experiment", "runs", ["experiment"])
    op.create_index("ix_runs_worker", "runs", ["worker_id"])
    op.create_index(
        "uq_runs_one_active_train",
        "runs",
        ["experiment"],
        unique=True,
        sqlite_where=ACTIVE_TRAIN,
        postgresql_where=ACTIVE_TRAIN,
    )


def _create_run_events() -> None:
    op.create_table(
        "run_events",
        sa.Column("id", ID_INT, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("type", sa.String(16), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        _timestamp("created_at", nullable=False),
        # Event ids are never reused (clients resume streams by id): AUTOINCREMENT on SQLite.
        sqlite_autoincrement=True,
    )
    op.create_index("ix_run_events_run", "run_events", ["run_id", "id"])


def _create_workers() -> None:
    op.create_table(
        "workers",
        sa.Column("id", sa.String(100), primary_key=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("device", sa.String(100), nullable=False),
        sa.Column("info", sa.JSON(), nullable=False),
        _timestamp("started_at", nullable=False),
        _timestamp("last_seen_at", nullable=False),
    )


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    tables = set(inspector.get_table_names())
    if "runs" not in tables:
        _create_runs()
    elif "request_digest" not in {c["name"] for c in inspector.get_columns("runs")}:
        op.add_column("runs", sa.Column("request_digest", sa.String(64), nullable=True))
    if "run_events" not in tables:
        _create_run_events()
    if "workers" not in tables:
        _create_workers()


def downgrade() -> None:
    op.drop_table("workers")
    op.drop_table("run_events")
    op.drop_table("runs")

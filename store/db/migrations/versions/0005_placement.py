"""Placement and gangs: run priorities and needs, worker capacities, gang members.

Revision ID: 0005
Revises: 0004
Create Date: 2027-02-01

`runs` gains `priority`, what each node of the run needs (`nnodes`, `gpus_per_node`,
`procs_per_node`, `spread`) and `queued_at`, with the index claims read in order; `workers`
gains what a worker has (`node_name`, `gpus`, `cpus`), its rendezvous `address` and the
`run_id` it is busy with; `run_slots` holds the members of running gangs. Existing runs get
the single-node, CPU-sized defaults, which every worker serves, as before. The types are
spelled out here, not imported from store/db/schema.py: a revision records the schema as it was.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def _run_columns() -> list[sa.Column[Any]]:
    return [
        sa.Column("priority", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("nnodes", sa.Integer(), nullable=False, server_default="1"),
        sa.Column("gpus_per_node", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("procs_per_node", sa.Integer(), nullable=False, server_default="1"),
        sa.Column("spread", sa.String(16), nullable=False, server_default="any"),
        sa.Column("queued_at", sa.DateTime(timezone=True), nullable=True),
    ]


def _worker_columns() -> list[sa.Column[Any]]:
    return [
        sa.Column("node_name", sa.String(255), nullable=False, server_default=""),
        sa.Column("gpus", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("cpus", sa.Integer(), nullable=False, server_default="1"),
        sa.Column("address", sa.String(255), nullable=True),
        sa.Column("run_id", sa.String(32), nullable=True),
    ]


def _missing(table: str, columns: list[sa.Column[Any]]) -> list[sa.Column[Any]]:
    """A database made by `metadata.create_all` has the columns already."""
    existing = {c["name"] for c in sa.inspect(op.get_bind()).get_columns(table)}
    return [c for c in columns if c.name not in existing]


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    # Fresh Column objects each time: one is bound to the table it is added to.
    for table, columns in (("runs", _run_columns()), ("workers", _worker_columns())):
        missing = _missing(table, columns)
        if missing:
            with op.batch_alter_table(table) as batch:
                for column in missing:
                    batch.add_column(column)
    indexes = {i["name"] for i in inspector.get_indexes("runs")}
    if "ix_runs_queue" not in indexes:
        queue_order: list[str | sa.TextClause] = [
            "state",
            sa.text("priority DESC"),
            "created_at",
            "seq",
        ]
        op.create_index("ix_runs_queue", "runs", queue_order)
    if "run_slots" not in set(inspector.get_table_names()):
        op.create_table(
            "run_slots",
            sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.id"), primary_key=True),
            sa.Column("node_rank", sa.Integer(), primary_key=True),
            sa.Column("attempt", sa.Integer(), nullable=False),
            sa.Column("worker_id", sa.String(100), nullable=False, unique=True),
            sa.Column("rendezvous", sa.String(300), nullable=False),
            sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=False),
        )


def downgrade() -> None:
    op.drop_table("run_slots")
    op.drop_index("ix_runs_queue", table_name="runs")
    for table, columns in (("runs", _run_columns()), ("workers", _worker_columns())):
        with op.batch_alter_table(table) as batch:
            for column in columns:
                batch.drop_column(column.name)

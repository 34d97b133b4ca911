"""Run parents: the lineage of forks.

Revision ID: 0009
Revises: 0008
Create Date: 2027-06-01

`runs` gains a fork's parent (docs/design/forks.md, "Forks"): `parent_run_id` (the run that
saved the checkpoint the fork started from; indexed, so a run's forks are one lookup),
`parent_experiment`, `parent_tag` and `parent_step`; null for every run that is no fork, as
every existing run is. The types are spelled out here, not imported from
store/db/schema.py: a revision records the schema as it was.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

INDEX = "ix_runs_parent"


def _columns() -> list[sa.Column[object]]:
    return [
        sa.Column("parent_run_id", sa.String(32), nullable=True),
        sa.Column("parent_experiment", sa.String(200), nullable=True),
        sa.Column("parent_tag", sa.String(200), nullable=True),
        sa.Column("parent_step", sa.Integer(), nullable=True),
    ]


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    # A database made by `metadata.create_all` has the columns and the index already; the
    # index comes with the columns (one revision, one transaction).
    existing = {c["name"] for c in inspector.get_columns("runs")}
    if "parent_run_id" in existing:
        return
    with op.batch_alter_table("runs") as batch:
        for column in _columns():
            batch.add_column(column)
    op.create_index(INDEX, "runs", ["parent_run_id"])


def downgrade() -> None:
    op.drop_index(INDEX, table_name="runs")
    with op.batch_alter_table("runs") as batch:
        for column in _columns():
            batch.drop_column(column.name)

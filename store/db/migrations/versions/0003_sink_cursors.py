"""Metrics sinks: a cursor per (train run, sink), and a row per sink for its mirror.

Revision ID: 0003
Revises: 0002
Create Date: 2027-01-10

`sink_cursors` holds how far each sink (TensorBoard, MLflow) has mirrored each train run's
event log, so a restarted service goes on where the last one stopped; `sink_mirrors` one row
per sink: which service mirrors it (a lease) and how far it has looked through the runs.
Like 0001 it creates only the tables that are missing: a database made by
`metadata.create_all` holds them already. The types are spelled out here, not imported from
store/db/schema.py: a revision records the schema as it was.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    tables = set(sa.inspect(op.get_bind()).get_table_names())
    if "sink_cursors" not in tables:
        op.create_table(
            "sink_cursors",
            sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.id"), primary_key=True),
            sa.Column("sink", sa.String(32), primary_key=True),
            sa.Column("last_event_id", sa.BigInteger(), nullable=False),
            sa.Column("done", sa.Boolean(), nullable=False),
            sa.Column("memo", sa.JSON(), nullable=False),
            sa.Column("outage_since", sa.DateTime(timezone=True), nullable=True),
            sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        )
        op.create_index("ix_sink_cursors_open", "sink_cursors", ["sink", "done", "updated_at"])
    if "sink_mirrors" not in tables:
        op.create_table(
            "sink_mirrors",
            sa.Column("sink", sa.String(32), primary_key=True),
            sa.Column("runs_seen", sa.BigInteger(), nullable=False),
            sa.Column("holder", sa.String(100), nullable=True),
            sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        )


def downgrade() -> None:
    op.drop_table("sink_mirrors")
    op.drop_index("ix_sink_cursors_open", "sink_cursors")
    op.drop_table("sink_cursors")

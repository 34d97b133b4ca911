"""Workers can be asked to drain.

Revision ID: 0011
Revises: 0010
Create Date: 2027-06-01

`workers` gains `drain_requested_at`: when an operator asked the worker to drain
(POST /workers/{id}/drain); null: it was not asked, as every existing worker reads. The
worker's heartbeat reads it and stops as on SIGTERM (docs/operations.md, "Preemption and
drain"). The type is spelled out here, not imported from store/db/schema.py: a revision
records the schema as it was.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

COLUMN = "drain_requested_at"


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    # A database made by `metadata.create_all` has the column already.
    if COLUMN not in {c["name"] for c in inspector.get_columns("workers")}:
        with op.batch_alter_table("workers") as batch:
            batch.add_column(sa.Column(COLUMN, sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column(COLUMN)

"""Nodes a run's next attempt avoids.

Revision ID: 0014
Revises: 0013
Create Date: 2027-06-27

`runs` gains `avoid_nodes`: the nodes of the ranks a run that asked to avoid its stragglers'
nodes (`stragglers.avoid`) last reported as stragglers, which its next placement keeps clear
of where it can (docs/design/hangs.md, "Stragglers"); null: none, as every existing run reads.
The type is spelled out here, not imported from store/db/schema.py: a revision records the
schema as it was.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    # A database made by `metadata.create_all` has the column already.
    if "avoid_nodes" not in {c["name"] for c in inspector.get_columns("runs")}:
        with op.batch_alter_table("runs") as batch:
            batch.add_column(sa.Column("avoid_nodes", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("avoid_nodes")

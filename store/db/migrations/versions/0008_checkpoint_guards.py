"""Checkpoint guards: a lease per experiment, the guard of an object store.

Revision ID: 0008
Revises: 0007
Create Date: 2027-05-01

An object store has no lock, so the guard that is a flock beside the folders on POSIX is a
row here for a bucket (store/db/guards.py). The types are spelled out here, not imported
from store/db/schema.py: a revision records the schema as it was.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A database made by `metadata.create_all` has the table already.
    if "checkpoint_guards" not in sa.inspect(op.get_bind()).get_table_names():
        op.create_table(
            "checkpoint_guards",
            sa.Column("experiment", sa.String(500), primary_key=True),
            sa.Column("holder", sa.String(100), nullable=False),
            sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=False),
        )


def downgrade() -> None:
    op.drop_table("checkpoint_guards")

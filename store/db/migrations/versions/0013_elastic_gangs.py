"""Elastic gangs.

Revision ID: 0013
Revises: 0012
Create Date: 2027-06-20

`runs` gains `min_nnodes` and `shrink_after_seconds` (a gang that may run on fewer nodes than
`nnodes` once it has waited that long for all of them) and `gang_nnodes` (the nodes its
current or last attempt was placed on); null: a run of exactly `nnodes` nodes, as every
existing run reads (docs/design/placement.md, "Elastic gangs"). The types are spelled out
here, not imported from store/db/schema.py: a revision records the schema as it was.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

COLUMNS: dict[str, sa.types.TypeEngine[Any]] = {
    "min_nnodes": sa.Integer(),
    "shrink_after_seconds": sa.Float(),
    "gang_nnodes": sa.Integer(),
}


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    # A database made by `metadata.create_all` has the columns already.
    have = {c["name"] for c in inspector.get_columns("runs")}
    with op.batch_alter_table("runs") as batch:
        for name, kind in COLUMNS.items():
            if name not in have:
                batch.add_column(sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        for name in COLUMNS:
            batch.drop_column(name)

"""Plug-in models: the plug-in a run's model is, and the plug-ins each worker has.

Revision ID: 0007
Revises: 0006
Create Date: 2027-04-01

`runs` gains `model_plugin` (the plug-in model a worker must have to take the run; null for
a built-in or transformers model, as every existing run's is) and `workers` gains
`model_plugins` (the names a worker reported when it registered; null reads as none).
The types are spelled out here, not imported from store/db/schema.py: a revision records
the schema as it was.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def _columns() -> dict[str, sa.Column[object]]:
    return {
        "runs": sa.Column("model_plugin", sa.String(100), nullable=True),
        "workers": sa.Column("model_plugins", sa.JSON(), nullable=True),
    }


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    for table, column in _columns().items():
        # A database made by `metadata.create_all` has the column already.
        if column.name not in {c["name"] for c in inspector.get_columns(table)}:
            with op.batch_alter_table(table) as batch:
                batch.add_column(column)


def downgrade() -> None:
    for table, column in _columns().items():
        with op.batch_alter_table(table) as batch:
            batch.drop_column(column.name)

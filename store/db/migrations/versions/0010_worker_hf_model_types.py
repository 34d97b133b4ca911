"""Workers report the transformers model types they accept.

Revision ID: 0010
Revises: 0009
Create Date: 2027-05-01

`workers` gains `hf_model_types`: the causal-LM model types of the transformers installed
where the worker runs, as it reported them when it registered (null: it reported none, as
every existing worker's reads). GET /models lists those of the live workers. The type is
spelled out here, not imported from store/db/schema.py: a revision records the schema as it
was.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

COLUMN = "hf_model_types"


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    # A database made by `metadata.create_all` has the column already.
    if COLUMN not in {c["name"] for c in inspector.get_columns("workers")}:
        with op.batch_alter_table("workers") as batch:
            batch.add_column(sa.Column(COLUMN, sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column(COLUMN)

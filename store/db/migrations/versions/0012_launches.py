"""Runs launched by a backend (Slurm).

Revision ID: 0012
Revises: 0011
Create Date: 2027-07-01

`runs` gains `launch`: what the run asked of its launch backend (null: nothing, as every
existing run reads). `launches` records each job a backend submitted (docs/design/
backends.md). The types are spelled out here, not imported from store/db/schema.py: a
revision records the schema as it was.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    # A database made by `metadata.create_all` has both already.
    if "launch" not in {c["name"] for c in inspector.get_columns("runs")}:
        with op.batch_alter_table("runs") as batch:
            batch.add_column(sa.Column("launch", sa.JSON(), nullable=True))
    if "launches" not in inspector.get_table_names():
        op.create_table(
            "launches",
            sa.Column(
                "id",
                sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                primary_key=True,
                autoincrement=True,
            ),
            sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.id"), nullable=False),
            sa.Column("attempt", sa.Integer(), nullable=False),
            sa.Column("backend", sa.String(16), nullable=False),
            sa.Column("job_id", sa.String(64), nullable=False),
            sa.Column("state", sa.String(32), nullable=False),
            sa.Column("reason", sa.Text(), nullable=True),
            sa.Column("nodes", sa.Text(), nullable=True),
            sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=False),
            sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
            sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
            sa.UniqueConstraint("backend", "job_id", name="uq_launches_job"),
        )
        op.create_index("ix_launches_run_id", "launches", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_launches_run_id", "launches")
    op.drop_table("launches")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("launch")

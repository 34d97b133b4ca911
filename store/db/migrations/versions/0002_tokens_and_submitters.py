"""API tokens with names and scopes, and who submitted each run.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

`api_tokens` holds the tokens an admin creates (their sha256, never the token itself);
`runs.submitted_by` names the token a run was submitted with. Runs from before have none.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("token_sha256", sa.String(64), nullable=False, unique=True),
        sa.Column("created_by", sa.String(128), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.add_column("runs", sa.Column("submitted_by", sa.String(128), nullable=True))
    op.create_index("ix_runs_submitted_by", "runs", ["submitted_by", "state"])


def downgrade() -> None:
    op.drop_index("ix_runs_submitted_by", "runs")
    op.drop_column("runs", "submitted_by")
    op.drop_table("api_tokens")

"""Webhooks: the registered URLs, their deliveries, the delivery log and the dispatcher's row.

Revision ID: 0004
Revises: 0003
Create Date: 2027-01-15

`webhooks` holds each URL with its events and signing secret (in clear: the service signs
with it); `webhook_deliveries` one notification of one state change to one webhook;
`webhook_attempts` every attempt to send one; `webhook_dispatcher` one row, the dispatcher's
cursor in the event log and its lease. Like 0001 it creates only the tables that are missing:
a database made by `metadata.create_all` holds them already. The types are spelled out here,
not imported from store/db/schema.py: a revision records the schema as it was.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# SQLite's INTEGER PRIMARY KEY is the rowid; PostgreSQL gets a 64-bit identity.
ID_INT = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _timestamp(name: str, nullable: bool) -> sa.Column[Any]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _create_webhooks() -> None:
    op.create_table(
        "webhooks",
        sa.Column("id", ID_INT, primary_key=True, autoincrement=True),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("events", sa.JSON(), nullable=False),
        sa.Column("secret", sa.String(100), nullable=False),
        sa.Column("after_event_id", sa.BigInteger(), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=True),
        _timestamp("created_at", nullable=False),
        sqlite_autoincrement=True,
    )


def _create_deliveries() -> None:
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("webhook_id", ID_INT, sa.ForeignKey("webhooks.id"), nullable=False),
        sa.Column("event_id", sa.BigInteger(), nullable=False),
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("event", sa.String(16), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        _timestamp("next_attempt_at", nullable=True),
        _timestamp("created_at", nullable=False),
        sa.UniqueConstraint("webhook_id", "event_id", name="uq_webhook_deliveries_event"),
    )
    op.create_index("ix_webhook_deliveries_due", "webhook_deliveries", ["state", "next_attempt_at"])
    op.create_index(
        "ix_webhook_deliveries_webhook", "webhook_deliveries", ["webhook_id", "created_at"]
    )


def _create_attempts() -> None:
    op.create_table(
        "webhook_attempts",
        sa.Column("id", ID_INT, primary_key=True, autoincrement=True),
        sa.Column(
            "delivery_id", sa.String(32), sa.ForeignKey("webhook_deliveries.id"), nullable=False
        ),
        sa.Column("attempt", sa.Integer(), nullable=False),
        _timestamp("started_at", nullable=False),
        sa.Column("duration_ms", sa.Float(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
    )
    op.create_index("ix_webhook_attempts_delivery", "webhook_attempts", ["delivery_id", "attempt"])


def _create_dispatcher() -> None:
    op.create_table(
        "webhook_dispatcher",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("cursor", sa.BigInteger(), nullable=False),
        sa.Column("holder", sa.String(100), nullable=True),
        _timestamp("lease_expires_at", nullable=True),
    )


# In the order of their foreign keys.
TABLES = {
    "webhooks": _create_webhooks,
    "webhook_deliveries": _create_deliveries,
    "webhook_attempts": _create_attempts,
    "webhook_dispatcher": _create_dispatcher,
}


def upgrade() -> None:
    existing = set(sa.inspect(op.get_bind()).get_table_names())
    for name, create in TABLES.items():
        if name not in existing:
            create()


def downgrade() -> None:
    for name in reversed(TABLES):
        op.drop_table(name)

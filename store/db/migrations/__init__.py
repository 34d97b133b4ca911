"""Schema migrations (Alembic) for the run database, SQLite and PostgreSQL alike.

`upgrade_to_head` brings any database to the schema of `store/db/schema.py`: a new one, one made
before migrations existed (see revision 0001), or one an older trainctl migrated. The service
and every worker call it at start-up, often at the same moment, so it runs under a
database-wide lock: on PostgreSQL a transaction-level advisory lock, on SQLite the write lock
that BEGIN IMMEDIATE takes (foreign keys checked once, at the end: `schema_transaction`).
Whoever gets the lock first migrates; the others then find the database at head and do
nothing. DDL is transactional on both, so a migration that fails leaves the database as it
was.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from trainctl.store.db.schema import check_foreign_keys, schema_transaction

MIGRATIONS_DIR = Path(__file__).resolve().parent
# Any 64-bit key works as long as nothing else on the server uses it: "trainctl" in ASCII.
MIGRATION_LOCK_KEY = int.from_bytes(b"trainctl", "big")


def alembic_config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


def upgrade_to_head(engine: Engine) -> None:
    """Migrate the database to the newest revision, safely while other processes do too."""
    with schema_transaction(engine) as conn:
        if conn.dialect.name == "postgresql":
            # Held until this transaction ends, so the migration commits before it is let go.
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        if current_revision(conn) != head_revision():
            command.upgrade(alembic_config(conn), "head")
            check_foreign_keys(conn)

"""Rows written straight into the run database, with what this trainctl never writes."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text

from trainctl.store.db.runs import RunStore
from trainctl.store.db.schema import write_transaction

SURROGATE_SPEC = '{"generation": {"stop": ["\\ud800"]}}'
"""A plan holding a lone surrogate, as JSON escapes it: what POST /runs/sample once stored."""


@dataclass(frozen=True)
class Poison:
    """What to write into one column of a run: JSON text (cast to the column's type), or raw
    bytes (SQLite only: PostgreSQL checks that text is UTF-8, so no such row can exist)."""

    column: str
    json_text: str | None = None
    raw: bytes | None = None

    def write(self, store: RunStore, table: str, key: str, where: str) -> None:
        dialect = store.engine.dialect.name
        if self.raw is not None:
            value, bind = f"CAST(X'{self.raw.hex()}' AS TEXT)", {}
        else:
            cast = "CAST(:v AS json)" if dialect == "postgresql" else ":v"
            value, bind = cast, {"v": self.json_text}
        sql = f"UPDATE {table} SET {self.column} = {value} WHERE {key} = :where"
        with write_transaction(store.engine) as conn:
            conn.execute(text(sql), {**bind, "where": where})

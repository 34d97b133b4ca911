"""Who may do what: API tokens with a name and a scope (docs/architecture.md, "Rooms").

Teams share a node, and one shared token says nothing of who queued a run nor keeps a reader
from deleting checkpoints. An admin creates named tokens with a scope:

| scope    | may                                                        |
|----------|------------------------------------------------------------|
| `read`   | every GET: runs, events, metrics, logs, checkpoints, files |
| `submit` | that, and submit and cancel runs                           |
| `admin`  | all: delete and prune checkpoints, manage tokens           |

A token is shown once, at creation; the database keeps its sha256 (tokens are 256 random
bits, so a fast hash is as safe as a slow one). `TRAINCTL_API_TOKEN` is the bootstrap token:
admin, named `bootstrap`, never stored. Plain bearer tokens, no user database.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Row, delete, insert, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from trainctl.store.db.rows import RowReader
from trainctl.store.db.schema import api_tokens, read_transaction, write_transaction
from trainctl.store.exceptions import Conflict, NotFound
from trainctl.store.vocabulary import SCOPES, Scope

BOOTSTRAP = "bootstrap"
TOKEN_PREFIX = "tc_"
# Recording every use would be a write per request; once a minute says when it was used.
LAST_USED_RESOLUTION = timedelta(minutes=1)
# A token seen lately is not looked up again for this long: one query per token and
# interval instead of one per request. A revocation is felt at once in the process that
# made it, within this time in others.
IDENTITY_SECONDS = 5.0


@dataclass(frozen=True)
class Principal:
    """Who a request is from: the token's name and its scope."""

    name: str
    scope: Scope

    def allows(self, needed: Scope) -> bool:
        return SCOPES.index(self.scope) >= SCOPES.index(needed)


@dataclass(frozen=True)
class ApiToken:
    """A token as stored: everything but the token itself."""

    name: str
    scope: Scope
    created_by: str | None
    created_at: datetime
    last_used_at: datetime | None


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenStore:
    """The `api_tokens` table of the run database."""

    def __init__(self, engine: Engine, bootstrap: str | None = None) -> None:
        self.engine, self.bootstrap = engine, bootstrap
        self._seen: dict[str, tuple[Principal, float]] = {}
        self._lock = threading.Lock()

    def create(self, name: str, scope: Scope, created_by: str | None) -> tuple[str, ApiToken]:
        """A new token (returned once, never stored) and its record."""
        if name == BOOTSTRAP:
            raise Conflict(f"{BOOTSTRAP!r} is the name of TRAINCTL_API_TOKEN; pick another")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        record = ApiToken(name, scope, created_by, datetime.now(UTC), None)
        values = {**vars(record), "token_sha256": digest(token)}
        try:
            with write_transaction(self.engine) as conn:
                conn.execute(insert(api_tokens).values(values))
        except IntegrityError:
            raise Conflict(
                f"a token named {name!r} exists already; revoke it first or pick another name"
            ) from None
        return token, record

    def list_tokens(self) -> list[ApiToken]:
        with read_transaction(self.engine) as conn:
            rows = conn.execute(select(api_tokens).order_by(api_tokens.c.name)).all()
        return [_token(row) for row in rows]

    def revoke(self, name: str) -> ApiToken:
        with write_transaction(self.engine) as conn:
            row = conn.execute(select(api_tokens).where(api_tokens.c.name == name)).one_or_none()
            if row is None:
                raise NotFound(f"no token named {name!r}")
            conn.execute(delete(api_tokens).where(api_tokens.c.name == name))
        with self._lock:
            self._seen.pop(row.token_sha256, None)
        return _token(row)

    def identify(self, token: str) -> Principal | None:
        """Who holds `token`, or None when it is no token of this service."""
        if self.bootstrap is not None and hmac.compare_digest(
            token.encode(), self.bootstrap.encode()
        ):
            return Principal(BOOTSTRAP, "admin")
        # The lookup is by the sha256, so its timing says nothing about the token.
        key = digest(token)
        with self._lock:
            seen = self._seen.get(key)
        if seen is not None and seen[1] > time.monotonic():
            return seen[0]
        query = select(api_tokens).where(api_tokens.c.token_sha256 == key)
        with read_transaction(self.engine) as conn:
            row = conn.execute(query).one_or_none()
        if row is None:
            return None
        now = datetime.now(UTC)
        if row.last_used_at is None or now - row.last_used_at > LAST_USED_RESOLUTION:
            with write_transaction(self.engine) as conn:
                conn.execute(
                    update(api_tokens).where(api_tokens.c.name == row.name).values(last_used_at=now)
                )
        return Principal(row.name, row.scope)


def _token(row: Row[Any]) -> ApiToken:
    """Read on the columns' own terms, so one bad row never breaks a listing (rows.py)."""
    reader = RowReader("a token")
    name = reader.text("name", row.name) or ""
    created_by = reader.text("created_by", row.created_by)
    return ApiToken(name, row.scope, created_by, row.created_at, row.last_used_at)

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

A name is an identity, and names that differ only by case are one name: `T-READ` cannot be
created beside `t-read` (a unique index on `lower(name)`, migration 0006), `bootstrap` is
taken in any case, revoking finds a token in any case, and a run's submitter is compared in
any case (`same_name`). A token keeps the case it was created with.
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

from sqlalchemy import ColumnElement, Row, delete, func, insert, select, update
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


def same_name(a: str, b: str) -> bool:
    """Whether two token names name the same token: names differ by more than case."""
    return a.lower() == b.lower()


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
        if same_name(name, BOOTSTRAP):
            raise Conflict(f"{BOOTSTRAP!r} is the name of TRAINCTL_API_TOKEN; pick another")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        record = ApiToken(name, scope, created_by, datetime.now(UTC), None)
        values = {**vars(record), "token_sha256": digest(token)}
        try:
            with write_transaction(self.engine) as conn:
                conn.execute(insert(api_tokens).values(values))
        except IntegrityError:
            taken = self._named(name)
            raise Conflict(
                f"a token named {taken.name if taken else name!r} exists already (names differ "
                "by more than case); revoke it first or pick another name"
            ) from None
        return token, record

    def _named(self, name: str) -> ApiToken | None:
        with read_transaction(self.engine) as conn:
            row = conn.execute(select(api_tokens).where(_name_is(name))).one_or_none()
        return None if row is None else _token(row)

    def list_tokens(self) -> list[ApiToken]:
        with read_transaction(self.engine) as conn:
            rows = conn.execute(select(api_tokens).order_by(api_tokens.c.name)).all()
        return [_token(row) for row in rows]

    def revoke(self, name: str) -> ApiToken:
        """Revoke the token of that name, in any case."""
        with write_transaction(self.engine) as conn:
            row = conn.execute(select(api_tokens).where(_name_is(name))).one_or_none()
            if row is None:
                raise NotFound(f"no token named {name!r}")
            conn.execute(delete(api_tokens).where(api_tokens.c.name == row.name))
        with self._lock:
            self._seen.pop(row.token_sha256, None)
        return _token(row)

    def recall(self, token: str) -> Principal | None:
        """Who holds `token` as far as this process knows without a query: the bootstrap
        token, or one identified within `IDENTITY_SECONDS`; None means `identify` must ask.
        No I/O, so an event loop may call it (service/deps.py)."""
        if self.bootstrap is not None and hmac.compare_digest(
            token.encode(), self.bootstrap.encode()
        ):
            return Principal(BOOTSTRAP, "admin")
        with self._lock:
            seen = self._seen.get(digest(token))
        return seen[0] if seen is not None and seen[1] > time.monotonic() else None

    def identify(self, token: str) -> Principal | None:
        """Who holds `token`, or None when it is no token of this service."""
        if (known := self.recall(token)) is not None:
            return known
        # The lookup is by the sha256, so its timing says nothing about the token.
        key = digest(token)
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
        principal = Principal(row.name, row.scope)
        with self._lock:
            self._seen[key] = (principal, time.monotonic() + IDENTITY_SECONDS)
        return principal


def _name_is(name: str) -> ColumnElement[bool]:
    """The token of that name, in any case (the index on lower(name) finds it)."""
    return func.lower(api_tokens.c.name) == name.lower()


def _token(row: Row[Any]) -> ApiToken:
    """Read on the columns' own terms, so one bad row never breaks a listing (rows.py)."""
    reader = RowReader("a token")
    name = reader.text("name", row.name) or ""
    created_by = reader.text("created_by", row.created_by)
    return ApiToken(name, row.scope, created_by, row.created_at, row.last_used_at)

"""The run database: schema, engine setup and transaction helpers (docs/design/runs.md,
"Runs").

SQLite is the embedded default and PostgreSQL the multi-node one; everything here is written
once for both. The SQLite-specific parts are confined to connection setup (WAL, a busy
timeout, `BEGIN IMMEDIATE`), so two writers serialise at BEGIN rather than both reading and
then colliding when they upgrade their locks.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    and_,
    create_engine,
    event,
    func,
)
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.pool import ConnectionPoolEntry
from sqlalchemy.types import TypeDecorator

from trainctl.store.db.rows import read_json, sqlite_text
from trainctl.store.vocabulary import ACTIVE_STATES

SQLITE_BUSY_TIMEOUT_MS = 30_000
CONNECT_TIMEOUT_SECONDS = 10
"""How long opening a PostgreSQL connection may take: a server that is stopped (SIGSTOP, a
frozen VM) accepts the TCP connection and never answers, and without a deadline the caller
would wait for it forever (store/db/outages.py)."""
"""How long a SQLite connection waits for another process's write lock before giving up."""

# Execution option read by the SQLite `begin` listener: which kind of BEGIN to emit.
_SQLITE_BEGIN_OPTION = "trainctl_sqlite_begin"

# SQLite's INTEGER PRIMARY KEY is the rowid (auto-assigned); BIGINT would not be. PostgreSQL
# gets a 64-bit identity column.
_ID_INT = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp that is always timezone-aware UTC in Python.

    PostgreSQL stores `timestamptz`; SQLite has no timezone support and would hand back naive
    values, so on SQLite we store naive UTC (which also sorts correctly as text) and re-attach
    UTC on the way out.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: trainctl stores timezone-aware UTC")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


metadata = MetaData()

runs = Table(
    "runs",
    metadata,
    # `seq` orders runs created in the same microsecond and is the cursor's tie-breaker;
    # `id` is the opaque public identifier.
    Column("seq", _ID_INT, primary_key=True, autoincrement=True),
    Column("id", String(32), nullable=False, unique=True),
    Column("kind", String(16), nullable=False),
    Column("experiment", String(200), nullable=False),
    Column("state", String(16), nullable=False),
    Column("spec", JSON, nullable=False),
    Column("step", Integer, nullable=False, default=0),
    Column("total_steps", Integer, nullable=True),
    Column("result", JSON, nullable=True),
    Column("error", Text, nullable=True),
    Column("worker_id", String(100), nullable=True),
    Column("attempt", Integer, nullable=False, default=1),
    Column("max_attempts", Integer, nullable=False),
    Column("cancel_requested", Boolean, nullable=False, default=False),
    Column("lease_expires_at", UTCDateTime, nullable=True),
    # Unique per submitter (`uq_runs_idempotency`, below).
    Column("idempotency_key", String(200), nullable=True),
    # sha256 of the request as the client sent it: a retry with the same key is recognised
    # before the spec is resolved again (which may resolve differently later, e.g. "latest").
    Column("request_digest", String(64), nullable=True),
    Column("depends_on", JSON, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("started_at", UTCDateTime, nullable=True),
    Column("finished_at", UTCDateTime, nullable=True),
    # The name of the API token the run was submitted with; None without token identities.
    Column("submitted_by", String(128), nullable=True),
    # What the run asked of its launch backend ({"slurm": {...}}, store/backends); None for
    # a run that asked nothing.
    Column("launch", JSON, nullable=True),
    # Scheduling (store/db/placement.py): claims take the highest priority first, then the
    # oldest; a worker takes only runs whose nodes it can serve (GPUs per node, or cores for
    # a CPU run's processes); `nnodes` > 1 is a gang that N workers claim together.
    Column("priority", Integer, nullable=False, default=0, server_default="0"),
    Column("nnodes", Integer, nullable=False, default=1, server_default="1"),
    Column("gpus_per_node", Integer, nullable=False, default=0, server_default="0"),
    Column("procs_per_node", Integer, nullable=False, default=1, server_default="1"),
    Column("spread", String(16), nullable=False, default="any", server_default="any"),
    # The plug-in model a worker must have installed to take the run; None: any worker.
    Column("model_plugin", String(100), nullable=True),
    # An elastic gang (docs/design/placement.md, "Elastic gangs"): the fewest nodes it runs
    # on (None: exactly nnodes) once it has waited `shrink_after_seconds` for all of them, and
    # the nodes its current (or last) attempt was placed on, which a resize is measured from.
    Column("min_nnodes", Integer, nullable=True),
    Column("shrink_after_seconds", Float, nullable=True),
    Column("gang_nnodes", Integer, nullable=True),
    # The nodes the run's next attempt keeps clear of where it can: its stragglers' last
    # reported, when it asked for that (docs/design/hangs.md, "Stragglers"); None: none.
    Column("avoid_nodes", JSON, nullable=True),
    # When the run last became queued: a gang waiting longer than the reservation time
    # keeps the workers that could join it from taking smaller runs.
    Column("queued_at", UTCDateTime, nullable=True),
    # A fork's parent (docs/design/forks.md, "Forks"): the run that saved the checkpoint it
    # started from (None where the checkpoint names none), the checkpoint and its step.
    Column("parent_run_id", String(32), nullable=True),
    Column("parent_experiment", String(200), nullable=True),
    Column("parent_tag", String(200), nullable=True),
    Column("parent_step", Integer, nullable=True),
    Index("ix_runs_state_created", "state", "created_at", "seq"),
    Index("ix_runs_parent", "parent_run_id"),
    Index("ix_runs_created", "created_at", "seq"),
    Index("ix_runs_experiment", "experiment"),
    Index("ix_runs_worker", "worker_id"),
    Index("ix_runs_submitted_by", "submitted_by", "state"),
)

# The database itself enforces "one active train run per experiment", so two services
# enqueueing at once (PostgreSQL, READ COMMITTED) cannot both pass the application check.
_ACTIVE_TRAIN = and_(runs.c.kind == "train", runs.c.state.in_(sorted(ACTIVE_STATES)))
Index(
    "uq_runs_one_active_train",
    runs.c.experiment,
    unique=True,
    sqlite_where=_ACTIVE_TRAIN,
    postgresql_where=_ACTIVE_TRAIN,
)

# An idempotency key is the submitter's own: another token's same key is another request. The
# scope is the submitter's name in any case (names differ by more than case, see
# store/db/tokens.py), '' for runs queued without token identities; NULL keys never collide.
IDEMPOTENCY_SCOPE = func.lower(func.coalesce(runs.c.submitted_by, ""))
Index("uq_runs_idempotency", IDEMPOTENCY_SCOPE, runs.c.idempotency_key, unique=True)

# Claims read queued runs in this order (store/db/queue.py): an index scan rather than a sort of
# the whole queue at every claim (measured in bench/claims.py: 3.2 ms against 0.06 ms with
# 10,000 runs queued).
Index("ix_runs_queue", runs.c.state, runs.c.priority.desc(), runs.c.created_at, runs.c.seq)

run_events = Table(
    "run_events",
    metadata,
    # Clients resume streams with Last-Event-ID, so ids must never be reused; on SQLite that
    # takes AUTOINCREMENT (a plain rowid may reuse the highest id after a delete).
    Column("id", _ID_INT, primary_key=True, autoincrement=True),
    Column("run_id", String(32), ForeignKey("runs.id"), nullable=False),
    Column("type", String(16), nullable=False),
    Column("data", JSON, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Index("ix_run_events_run", "run_id", "id"),
    sqlite_autoincrement=True,
)

workers = Table(
    "workers",
    metadata,
    Column("id", String(100), primary_key=True),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("device", String(100), nullable=False),
    Column("info", JSON, nullable=False),
    Column("started_at", UTCDateTime, nullable=False),
    Column("last_seen_at", UTCDateTime, nullable=False),
    # What the worker has (store/db/placement.py, Capacity); workers of one node share a name.
    Column("node_name", String(255), nullable=False, default="", server_default=""),
    Column("gpus", Integer, nullable=False, default=0, server_default="0"),
    Column("cpus", Integer, nullable=False, default=1, server_default="1"),
    # The plug-in models installed where it runs (a list of names; None: none).
    Column("model_plugins", JSON, nullable=True),
    # The transformers model types it accepts (a list; None: it reported none).
    Column("hf_model_types", JSON, nullable=True),
    # Where a gang it leads meets (the torchrun rendezvous host).
    Column("address", String(255), nullable=True),
    # The run this worker process is busy with, set when it claims one or a gang's leader
    # assigns it a place, cleared by the worker itself when it is done: an idle worker (None)
    # is one a gang may take.
    Column("run_id", String(32), nullable=True),
    # When an operator asked it to drain (POST /workers/{id}/drain); None: not asked. Its
    # heartbeat reads it and stops the worker as SIGTERM does; a draining worker claims nothing.
    Column("drain_requested_at", UTCDateTime, nullable=True),
)

# The members of a running gang (a run with nnodes > 1), one row per node rank, for the
# attempt they were assigned to. Each member's lease is its own, so a member that stops
# heartbeating gets the whole gang requeued; a worker holds at most one place.
run_slots = Table(
    "run_slots",
    metadata,
    Column("run_id", String(32), ForeignKey("runs.id"), primary_key=True),
    Column("node_rank", Integer, primary_key=True),
    Column("attempt", Integer, nullable=False),
    Column("worker_id", String(100), nullable=False, unique=True),
    Column("rendezvous", String(300), nullable=False),
    Column("lease_expires_at", UTCDateTime, nullable=False),
)


# The jobs a launch backend submitted for runs (docs/design/backends.md): one row per job,
# the scheduler's state and reason as last seen, and when a worker inside the job claimed the
# run (`claimed_at`): a queued run with an unclaimed job that has not ended waits for that
# job; otherwise it needs a new one.
launches = Table(
    "launches",
    metadata,
    Column("id", _ID_INT, primary_key=True, autoincrement=True),
    Column("run_id", String(32), ForeignKey("runs.id"), nullable=False, index=True),
    Column("attempt", Integer, nullable=False),
    Column("backend", String(16), nullable=False),
    Column("job_id", String(64), nullable=False),
    Column("state", String(32), nullable=False),
    Column("reason", Text, nullable=True),
    Column("nodes", Text, nullable=True),
    Column("submitted_at", UTCDateTime, nullable=False),
    Column("claimed_at", UTCDateTime, nullable=True),
    Column("ended_at", UTCDateTime, nullable=True),
    UniqueConstraint("backend", "job_id", name="uq_launches_job"),
)


# Tokens an admin created: a name, a scope, and the sha256 of the token, which is shown once.
api_tokens = Table(
    "api_tokens",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("scope", String(16), nullable=False),
    Column("token_sha256", String(64), nullable=False, unique=True),
    Column("created_by", String(128), nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("last_used_at", UTCDateTime, nullable=True),
)
# Names that differ only by case are one name.
Index("uq_api_tokens_name_lower", func.lower(api_tokens.c.name), unique=True)

# Metrics sinks (docs/design/sinks.md, "Metrics sinks"; store/db/sinks.py). A cursor is how far
# one sink has mirrored one train run's events; `memo` is what the sink keeps of the run
# (the MLflow run it made). A mirror row per sink says which service mirrors it (a lease) and
# up to which `runs.seq` it has looked for train runs that name it.
sink_cursors = Table(
    "sink_cursors",
    metadata,
    Column("run_id", String(32), ForeignKey("runs.id"), primary_key=True),
    Column("sink", String(32), primary_key=True),
    Column("last_event_id", BigInteger, nullable=False),
    Column("done", Boolean, nullable=False),
    Column("memo", JSON, nullable=False),
    Column("outage_since", UTCDateTime, nullable=True),
    Column("updated_at", UTCDateTime, nullable=False),
    Index("ix_sink_cursors_open", "sink", "done", "updated_at"),
)

sink_mirrors = Table(
    "sink_mirrors",
    metadata,
    Column("sink", String(32), primary_key=True),
    Column("runs_seen", BigInteger, nullable=False),
    Column("holder", String(100), nullable=True),
    Column("lease_expires_at", UTCDateTime, nullable=True),
)


# Webhooks (docs/design/webhooks.md, "Webhooks"): URLs told of run state changes. The secret is
# kept as it is, not as a digest: the service signs every delivery with it.
webhooks = Table(
    "webhooks",
    metadata,
    # AUTOINCREMENT: an id is never reused, so a removed webhook's id never names another.
    Column("id", _ID_INT, primary_key=True, autoincrement=True),
    Column("url", Text, nullable=False),
    Column("events", JSON, nullable=False),
    Column("secret", String(100), nullable=False),
    # The newest event when it was registered: a webhook hears of changes after that only.
    Column("after_event_id", BigInteger, nullable=False),
    Column("created_by", String(128), nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    sqlite_autoincrement=True,
)

# One notification of one state change to one webhook, sent until it is answered with a 2xx
# or its attempts are used up. Its id is the delivery id receivers deduplicate on.
webhook_deliveries = Table(
    "webhook_deliveries",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("webhook_id", _ID_INT, ForeignKey("webhooks.id"), nullable=False),
    Column("event_id", BigInteger, nullable=False),
    Column("run_id", String(32), nullable=False),
    Column("event", String(16), nullable=False),
    Column("body", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("next_attempt_at", UTCDateTime, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    # One delivery per webhook and event, whoever dispatches and however often it reads.
    UniqueConstraint("webhook_id", "event_id", name="uq_webhook_deliveries_event"),
    Index("ix_webhook_deliveries_due", "state", "next_attempt_at"),
    Index("ix_webhook_deliveries_webhook", "webhook_id", "created_at"),
)

# The delivery log: every attempt, with the receiver's status code or why there was none.
webhook_attempts = Table(
    "webhook_attempts",
    metadata,
    Column("id", _ID_INT, primary_key=True, autoincrement=True),
    Column("delivery_id", String(32), ForeignKey("webhook_deliveries.id"), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("started_at", UTCDateTime, nullable=False),
    Column("duration_ms", Float, nullable=False),
    Column("status_code", Integer, nullable=True),
    Column("error", Text, nullable=True),
    Index("ix_webhook_attempts_delivery", "delivery_id", "attempt"),
)

# One row: how far the dispatcher has read the event log, and which service dispatches (a
# lease, so that of several services sharing the database one sends).
webhook_dispatcher = Table(
    "webhook_dispatcher",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("cursor", BigInteger, nullable=False),
    Column("holder", String(100), nullable=True),
    Column("lease_expires_at", UTCDateTime, nullable=True),
)

# The guard of an experiment in an object store (store/checkpoints/s3.py), which has no lock:
# a lease per experiment, held while a delete, prune, retention or dependent submit runs.
checkpoint_guards = Table(
    "checkpoint_guards",
    metadata,
    Column("experiment", String(500), primary_key=True),
    Column("holder", String(100), nullable=False),
    Column("lease_expires_at", UTCDateTime, nullable=False),
)


def build_engine(url: str, **kwargs: Any) -> Engine:
    """Create an engine for `url`; SQLite engines get WAL, a busy timeout and BEGIN control.

    A stored JSON value that does not parse reads as `rows.Unreadable`, and SQLite text that
    is not UTF-8 as lone surrogates, rather than failing the query that holds it: one bad row
    never hides the others (store/db/rows.py)."""
    kwargs.setdefault("json_deserializer", read_json)
    parsed = make_url(url)
    if parsed.get_backend_name() == "postgresql" and "connect_timeout" not in parsed.query:
        # connect_args would override the URL's own ?connect_timeout=, which therefore wins.
        kwargs.setdefault("connect_args", {"connect_timeout": CONNECT_TIMEOUT_SECONDS})
    engine = create_engine(url, **kwargs)
    if engine.dialect.name == "sqlite":
        _configure_sqlite(engine)
    return engine


def _configure_sqlite(engine: Engine) -> None:
    """Apply SQLAlchemy's documented recipe for taking over BEGIN from the sqlite3 driver.

    Python's sqlite3 (before 3.12's `autocommit` attribute) begins transactions lazily, only
    before a DML statement, so a read-then-write is not atomic. We switch its transaction
    handling off (`isolation_level = None`) and emit BEGIN ourselves.
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: ConnectionPoolEntry) -> None:
        dbapi_connection.isolation_level = None
        dbapi_connection.text_factory = sqlite_text
        cursor = dbapi_connection.cursor()
        try:
            # Busy timeout first: switching to WAL needs a lock another process may hold.
            cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
            _switch_to_wal(cursor)
            cursor.execute("PRAGMA foreign_keys = ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get(_SQLITE_BEGIN_OPTION, "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")


def _switch_to_wal(cursor: Any) -> None:
    """`PRAGMA journal_mode = WAL`, retried while the database is locked.

    SQLite answers this pragma SQLITE_BUSY at once, without waiting out the busy timeout, when
    another process is creating the same new database file or holds a lock on it in rollback
    mode (several workers starting on a fresh data dir at the same moment): the switch is
    tried again until the busy timeout has passed.
    """
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


@contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """A short transaction that writes: committed on success, rolled back on error.

    On SQLite it starts with BEGIN IMMEDIATE, taking the write lock up front, so everything
    read inside it is still true when it commits (this is what makes check-then-insert and
    claim atomic across processes). Other databases ignore the option.
    """
    with engine.connect() as conn:
        conn.execution_options(**{_SQLITE_BEGIN_OPTION: "IMMEDIATE"})
        with conn.begin():
            yield conn


@contextmanager
def schema_transaction(engine: Engine) -> Iterator[Connection]:
    """A write transaction for migrations. On SQLite it does not enforce foreign keys
    statement by statement: changing a table's constraints there means building it anew and
    dropping the old one, which rows of other tables refer to; `check_foreign_keys` checks
    them all before it commits. The pragma takes effect only outside a transaction, so it is
    set on the bare connection first, and set back whatever happens."""
    if engine.dialect.name != "sqlite":
        with write_transaction(engine) as conn:
            yield conn
        return
    with engine.connect() as conn:
        driver = conn.connection.dbapi_connection
        assert driver is not None
        driver.execute("PRAGMA foreign_keys = OFF")
        try:
            conn.execution_options(**{_SQLITE_BEGIN_OPTION: "IMMEDIATE"})
            with conn.begin():
                yield conn
        finally:
            driver.execute("PRAGMA foreign_keys = ON")


def check_foreign_keys(conn: Connection) -> None:
    """On SQLite, fail (and so roll back) a migration that left a row referring to none."""
    if conn.dialect.name == "sqlite":
        broken = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
        if broken:
            raise RuntimeError(f"a migration broke foreign keys (table, row, parent): {broken[:5]}")


@contextmanager
def read_transaction(engine: Engine) -> Iterator[Connection]:
    """A read-only transaction: one consistent snapshot, never blocks or is blocked in WAL."""
    with engine.connect() as conn, conn.begin():
        yield conn

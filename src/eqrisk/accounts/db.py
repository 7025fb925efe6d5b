"""The accounts database: SQLite in WAL mode under the home by default (many reader processes,
one writer at a time, no server), PostgreSQL when `EQRISK_DATABASE_URL` is set. One schema,
SQLAlchemy Core, the same statements on both.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Connection,
    DateTime,
    Engine,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    event,
)
from sqlalchemy.exc import DBAPIError

metadata = MetaData()

accounts = Table(
    "accounts",
    metadata,
    Column("account_id", String(32), primary_key=True),
    Column("name", String(200), nullable=False),
    Column("email", String(320)),
    Column("state", String(16), nullable=False),
    Column("balance_tokens", BigInteger, nullable=False, default=0),
    Column("is_demo", Boolean, nullable=False, default=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("verified_at", DateTime(timezone=True)),
    Column("suspended_at", DateTime(timezone=True)),
    CheckConstraint("balance_tokens >= 0", name="balance_never_negative"),
    CheckConstraint("state IN ('created', 'verified', 'suspended')", name="known_state"),
)

api_keys = Table(
    "api_keys",
    metadata,
    Column("key_id", String(32), primary_key=True),
    Column("account_id", String(32), ForeignKey("accounts.account_id"), nullable=False),
    Column("key_hash", String(64), nullable=False, unique=True),
    Column("label", String(200)),
    Column("rate_limit", String(64), nullable=False),
    Column("is_demo", Boolean, nullable=False, default=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("revoked_at", DateTime(timezone=True)),
)

ledger = Table(
    "ledger",
    metadata,
    Column("entry_id", Integer, primary_key=True, autoincrement=True),
    Column("account_id", String(32), ForeignKey("accounts.account_id"), nullable=False),
    Column("key_id", String(32)),
    Column("kind", String(16), nullable=False),  # charge | grant | credit
    Column("route", String(64)),
    Column("params_digest", String(64)),
    Column("tokens", BigInteger, nullable=False),  # charges negative, grants positive
    Column("request_id", String(128)),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Index("ledger_account_time", "account_id", "created_at"),
)

card_verifications = Table(
    "card_verifications",
    metadata,
    # One row per account: the primary key is what makes the starting credit a one-time grant.
    Column("account_id", String(32), ForeignKey("accounts.account_id"), primary_key=True),
    Column("provider", String(64), nullable=False),
    Column("reference", String(200)),
    Column("verified_at", DateTime(timezone=True), nullable=False),
)

webhook_events = Table(
    "webhook_events",
    metadata,
    Column("event_id", String(200), primary_key=True),  # a replay collides here
    Column("event_type", String(64), nullable=False),
    Column("account_id", String(32)),
    Column("received_at", DateTime(timezone=True), nullable=False),
)


def make_engine(home: Path, database_url: str | None = None) -> Engine:
    """An engine for the configured database, schema created if missing."""
    if database_url:
        url = database_url
        if url.startswith("postgresql://"):
            url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
        engine = create_engine(url, pool_pre_ping=True)
    else:
        home.mkdir(parents=True, exist_ok=True)
        engine = create_engine(f"sqlite:///{home / 'accounts.db'}", connect_args={"timeout": 30})
        _sqlite_transactions(engine)
    try:
        metadata.create_all(engine)
    except DBAPIError:
        # Several server workers start at once: another one may have created the tables
        # between our check and our CREATE. Checking again settles it.
        metadata.create_all(engine)
    return engine


def _sqlite_transactions(engine: Engine) -> None:
    """WAL (readers never block the writer), foreign keys, and BEGIN IMMEDIATE for write
    transactions so that a read-then-write holds the write lock from its start."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # let SQLAlchemy's BEGIN below be the only BEGIN
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # Writers take the write lock up front; readers begin deferred and never block.
        immediate = conn.get_execution_options().get(_IMMEDIATE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


_IMMEDIATE = "eqrisk_write_transaction"


@contextmanager
def transaction(engine: Engine) -> Iterator[Connection]:
    """A write transaction (on SQLite it holds the write lock from its first statement)."""
    with engine.connect().execution_options(**{_IMMEDIATE: True}) as conn, conn.begin():
        yield conn

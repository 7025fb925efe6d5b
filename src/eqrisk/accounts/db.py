"""The accounts database: SQLite in WAL mode under the home by default (many reader processes,
one writer at a time, no server), PostgreSQL when `EQRISK_DATABASE_URL` is set. One schema,
SQLAlchemy Core, the same statements on both.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    delete,
    event,
    func,
    insert,
    select,
)
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.sql.elements import ColumnElement

if TYPE_CHECKING:
    from eqrisk.settings import Settings

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

# This month's charges per account and route, kept by the charge itself (same transaction as its
# ledger row), so that `/api/balance` reads a few rows whatever the ledger's size. `month` is
# the UTC month of the charge, "YYYY-MM". Always equal to the ledger's charges grouped the same
# way (a test checks it on both databases).
monthly_usage = Table(
    "monthly_usage",
    metadata,
    Column("account_id", String(32), ForeignKey("accounts.account_id"), primary_key=True),
    Column("month", String(7), primary_key=True),
    Column("route", String(64), primary_key=True),
    Column("requests", BigInteger, nullable=False),
    Column("tokens", BigInteger, nullable=False),
)

# One row per one-time data step done on this database (e.g. filling `monthly_usage` from the
# ledger of a database made before it existed); the primary key makes each step run once even
# when several workers start together.
schema_steps = Table(
    "schema_steps",
    metadata,
    Column("step", String(64), primary_key=True),
    Column("done_at", DateTime(timezone=True), nullable=False),
)

USAGE_FILLED = "monthly_usage filled from the ledger"

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

# Self-service sign-ups (accounts/selfservice.py): one row per account that signed up itself.
# `claim_hash`: SHA-256 of the one-time token the sign-up page polls for the first key (the key
# itself is made at the claim, never stored in clear); `note`: why no starting credit.
signups = Table(
    "signups",
    metadata,
    Column("account_id", String(32), ForeignKey("accounts.account_id"), primary_key=True),
    Column("address", String(64), nullable=False),
    Column("claim_hash", String(64), nullable=False, unique=True),
    Column("setup_intent", String(200), unique=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("claimed_at", DateTime(timezone=True)),
    Column("note", String(200)),
    Index("signups_address_time", "address", "created_at"),
)

# A key's optional expiry (a table of its own: databases made before it get it by create_all).
key_expiry = Table(
    "key_expiry",
    metadata,
    Column("key_id", String(32), ForeignKey("api_keys.key_id"), primary_key=True),
    Column("expires_at", DateTime(timezone=True), nullable=False),
)

# One starting credit per card: the provider's card fingerprint is the key.
card_fingerprints = Table(
    "card_fingerprints",
    metadata,
    Column("fingerprint", String(200), primary_key=True),
    Column("account_id", String(32), ForeignKey("accounts.account_id"), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

# Top-ups asked for (a PaymentIntent each) and credited (once: `credited_at` is set by the
# conditional update that credits).
topups = Table(
    "topups",
    metadata,
    Column("payment_intent", String(200), primary_key=True),
    Column("account_id", String(32), ForeignKey("accounts.account_id"), nullable=False),
    Column("amount_cents", BigInteger, nullable=False),
    Column("tokens", BigInteger, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("credited_at", DateTime(timezone=True)),
)


@dataclass(frozen=True)
class Timeouts:
    """The bounds of every wait on PostgreSQL (settings `database_connect_timeout_s` and
    `database_timeout_s`): opening a connection, one round trip (a statement, a commit), and
    the server's own statement, lock and idle-in-transaction timeouts, so that a transaction
    whose client went silent ends (rolled back) on the server too, releasing its row locks."""

    connect_s: int = 3
    io_s: float = 5.0

    @property
    def server_options(self) -> str:
        ms = max(1, round(self.io_s * 1000))
        return (
            f"-c statement_timeout={ms} -c lock_timeout={ms} "
            f"-c idle_in_transaction_session_timeout={ms}"
        )


@dataclass(frozen=True)
class Pool:
    """How one process connects to PostgreSQL (settings `database_pool_size`,
    `database_max_overflow`, `database_pooler`): SQLAlchemy keeps `size` connections open and
    opens up to `overflow` more under load (closed again when returned), so a host running W
    worker processes holds at most W x (size + overflow). Behind PgBouncer in transaction mode
    (`pgbouncer`), a transaction may run on any server connection: no prepared statements
    (psycopg's `prepare_threshold=None`) and no session state, so the server's statement, lock
    and idle-in-transaction timeouts are not sent as connection options: PgBouncer sets them on
    its server connections (`connect_query`, docs/decisions/connections.md); every client-side
    wait stays bounded (`BoundedConnection`)."""

    size: int = 5
    overflow: int = 10
    pgbouncer: bool = False

    @classmethod
    def of(cls, settings: Settings) -> Pool:
        return cls(
            settings.database_pool_size,
            settings.database_max_overflow,
            settings.database_pooler == "pgbouncer",
        )


def make_engine(
    home: Path,
    database_url: str | None = None,
    *,
    timeouts: Timeouts | None = None,
    pool: Pool | None = None,
) -> Engine:
    """An engine for the configured database, schema created if missing. `timeouts` bound
    every wait on PostgreSQL (None: libpq's and the server's defaults, as for the CLI); `pool`
    sizes its connection pool and says whether PgBouncer sits in between (None: the defaults,
    direct)."""
    if database_url:
        url = database_url
        if url.startswith("postgresql://"):
            url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
        pool = pool or Pool()
        connect_args: dict[str, Any] = {}
        if pool.pgbouncer:
            connect_args["prepare_threshold"] = None  # a prepared statement lives in one session
        options: dict[str, Any] = {}
        if timeouts is not None:
            options["pool_timeout"] = timeouts.io_s  # waiting for a free pooled connection
            connect_args["connect_timeout"] = timeouts.connect_s
            if not pool.pgbouncer:
                connect_args["options"] = timeouts.server_options
        engine = create_engine(
            url,
            pool_pre_ping=True,
            pool_size=pool.size,
            max_overflow=pool.overflow,
            connect_args=connect_args,
            **options,
        )
        if timeouts is not None:
            _bounded_round_trips(engine, timeouts.io_s)
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
    fill_monthly_usage(engine)
    return engine


def charge_month(dialect: str, created_at: ColumnElement[Any]) -> ColumnElement[str]:
    """SQL for the UTC month ("YYYY-MM") of a ledger time, as the charge writes it."""
    if dialect == "postgresql":
        return func.to_char(func.timezone("UTC", created_at), "YYYY-MM")
    # SQLite stores the UTC time as text ("YYYY-MM-DD HH:MM:SS.ffffff"): its first 7 characters.
    return func.substr(created_at, 1, 7)


def fill_monthly_usage(engine: Engine) -> bool:
    """Once per database: rebuild `monthly_usage` from the ledger's charges (a database made
    before the table existed has charges but no usage rows). Returns True where this call did
    it; a second worker starting at the same moment collides on the step's key and skips."""
    month = charge_month(engine.dialect.name, ledger.c.created_at)
    route = func.coalesce(ledger.c.route, "")
    totals = (
        select(
            ledger.c.account_id,
            month,
            route,
            func.count(),
            func.sum(-ledger.c.tokens),
        )
        .where(ledger.c.kind == "charge")
        .group_by(ledger.c.account_id, month, route)
    )
    try:
        with transaction(engine) as conn:
            conn.execute(insert(schema_steps).values(step=USAGE_FILLED, done_at=datetime.now(UTC)))
            conn.execute(delete(monthly_usage))
            conn.execute(
                insert(monthly_usage).from_select(
                    ["account_id", "month", "route", "requests", "tokens"], totals
                )
            )
    except IntegrityError:
        return False
    return True


def _bounded_round_trips(engine: Engine, io_s: float) -> None:
    """Every connection of `engine` is a `BoundedConnection` waiting at most `io_s` per round
    trip (the server's statement_timeout cannot help when the server never sees the bytes: a
    network partition, a stalled proxy)."""

    @event.listens_for(engine, "do_connect")
    def _connect(_dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
        from eqrisk.accounts.pg import BoundedConnection

        return BoundedConnection.connect_bounded(io_s, *cargs, **cparams)


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

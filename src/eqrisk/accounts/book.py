"""Accounts, API keys and the credit ledger: the only code that writes them.

- Keys look like `eqk_<key_id>_<secret>`; only SHA-256 of the whole key is stored (the secret
  has 256 bits of entropy, so a slow hash adds nothing), compared in constant time; the key is
  returned once, at creation, and never logged.
- Balances are integer tokens (1 token = $0.00002). Charges are decided in one transaction
  that holds the account's row (locked), debited by a conditional
  `UPDATE ... SET balance = balance - total WHERE balance >= total`, with their ledger rows and
  the month's usage row: the balance never goes below zero and two requests never spend the same
  credit. Several charges (the per-process writer's group, `accounts/writer.py`) share one
  transaction and one commit, each decided in order as if alone.
- Life cycle: created -> verified (the card check grants the starting credit, once: the
  verification row's primary key is the account) -> suspended (and back to verified by an
  operator, with no second grant).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, and_, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.pool import PoolProxiedConnection

from eqrisk.accounts import db
from eqrisk.accounts.pricing import usd_to_tokens

STARTING_CREDIT_TOKENS = usd_to_tokens("20")
DEFAULT_RATE_LIMIT = "120/minute"
DEMO_RATE_LIMIT = "5/minute"
DEMO_ACCOUNT = "demo"
STATES = ("created", "verified", "suspended")


class AccountError(ValueError):
    """An operation the account's state or the arguments do not allow (message says why)."""


@dataclass(frozen=True)
class KeyRecord:
    key_id: str
    account_id: str
    rate_limit: str
    is_demo: bool
    account_state: str
    balance_tokens: int


@dataclass(frozen=True)
class ChargeRequest:
    """One charge to make: `tokens` from `account_id` for a call of `route` by `key_id`."""

    account_id: str
    tokens: int
    key_id: str
    route: str
    params_digest: str
    request_id: str


@dataclass(frozen=True)
class Charge:
    """A charge's outcome: `balance_tokens` is the balance right after it (or, refused, the
    balance that did not cover it); `account_state` the state it was decided on ("" for an
    account that does not exist); `key_revoked` when the key was revoked since it was let in."""

    ok: bool
    balance_tokens: int
    account_state: str = "verified"
    key_revoked: bool = False


_access_lock = threading.Lock()
_access_generation = 0


def access_generation() -> int:
    """How many changes to who may call (a key revoked, an account verified, suspended or
    reinstated, the demo key rotated) this process has committed: a cache of key records
    drops what it read before a change made here (changes made by other processes reach it
    when its entries expire)."""
    return _access_generation


def _access_changed() -> None:
    global _access_generation
    with _access_lock:
        _access_generation += 1


def _now() -> datetime:
    return datetime.now(UTC)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class Accounts:
    """Operations on one accounts database (SQLite or PostgreSQL)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @property
    def reads_inline(self) -> bool:
        """Whether a read of a few rows by key (`account_month`) may run on the event loop: on
        SQLite in WAL mode a reader never waits for a writer and the read costs tens of
        microseconds, less than a hop to a worker thread; PostgreSQL is a network round trip."""
        return self.engine.dialect.name == "sqlite"

    # -- accounts -----------------------------------------------------------------------
    def create_account(self, name: str, email: str | None = None) -> dict[str, Any]:
        if not name.strip():
            raise AccountError("an account needs a name")
        account_id = "acc_" + secrets.token_hex(8)
        with db.transaction(self.engine) as conn:
            conn.execute(
                insert(db.accounts).values(
                    account_id=account_id,
                    name=name.strip(),
                    email=email,
                    state="created",
                    balance_tokens=0,
                    is_demo=False,
                    created_at=_now(),
                )
            )
        return self.get_account(account_id)

    def get_account(self, account_id: str) -> dict[str, Any]:
        with self.engine.connect() as conn:
            row = (
                conn.execute(select(db.accounts).where(db.accounts.c.account_id == account_id))
                .mappings()
                .first()
            )
        if row is None:
            raise AccountError(f"no account {account_id!r}")
        return dict(row)

    def list_accounts(self) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(db.accounts).order_by(db.accounts.c.created_at)).mappings()
            return [dict(r) for r in rows]

    def verify_card(self, account_id: str, *, provider: str, reference: str | None = None) -> bool:
        """Record a verified card; grant the starting credit if this is the account's first.
        Returns True when credit was granted (False: already verified, nothing granted)."""
        try:
            with db.transaction(self.engine) as conn:
                return _verify_card(conn, account_id, provider, reference)
        finally:
            _access_changed()

    def apply_card_event(
        self, event_id: str, account_id: str, *, provider: str, reference: str | None = None
    ) -> bool | None:
        """A provider's card confirmation, once per event id, in one transaction with the grant.
        Returns None for a replayed event (nothing done), else as `verify_card`."""
        try:
            with db.transaction(self.engine) as conn:
                conn.execute(
                    insert(db.webhook_events).values(
                        event_id=event_id,
                        event_type="card.verified",
                        account_id=account_id,
                        received_at=_now(),
                    )
                )
                return _verify_card(conn, account_id, provider, reference)
        except IntegrityError:
            return None
        finally:
            _access_changed()

    def set_state(self, account_id: str, state: str) -> None:
        """Suspend, or reinstate (to verified: only an account whose card was verified)."""
        if state not in ("suspended", "verified"):
            raise AccountError("state must be 'suspended' or 'verified'")
        try:
            self._set_state(account_id, state)
        finally:
            _access_changed()

    def _set_state(self, account_id: str, state: str) -> None:
        with db.transaction(self.engine) as conn:
            current = conn.execute(
                select(db.accounts.c.state).where(db.accounts.c.account_id == account_id)
            ).scalar()
            if current is None:
                raise AccountError(f"no account {account_id!r}")
            if state == "verified":
                verified = conn.execute(
                    select(db.card_verifications.c.account_id).where(
                        db.card_verifications.c.account_id == account_id
                    )
                ).first()
                if not verified:
                    raise AccountError(
                        f"account {account_id} has no verified card; verify it instead"
                    )
            conn.execute(
                update(db.accounts)
                .where(db.accounts.c.account_id == account_id)
                .values(state=state, suspended_at=_now() if state == "suspended" else None)
            )

    def credit(self, account_id: str, tokens: int, reason: str) -> int:
        """An operator's credit (positive) to an account; returns the new balance."""
        if tokens <= 0:
            raise AccountError("a credit must be a positive number of tokens")
        with db.transaction(self.engine) as conn:
            result = conn.execute(
                update(db.accounts)
                .where(db.accounts.c.account_id == account_id)
                .values(balance_tokens=db.accounts.c.balance_tokens + tokens)
            )
            if result.rowcount != 1:
                raise AccountError(f"no account {account_id!r}")
            conn.execute(
                insert(db.ledger).values(
                    account_id=account_id,
                    kind="credit",
                    route=reason,
                    tokens=tokens,
                    created_at=_now(),
                )
            )
            return _balance_of(conn, account_id)

    # -- keys ---------------------------------------------------------------------------
    def create_key(
        self,
        account_id: str,
        *,
        label: str | None = None,
        rate_limit: str = DEFAULT_RATE_LIMIT,
        key: str | None = None,
    ) -> dict[str, str]:
        """A new key for an account. The returned `key` is shown once and stored only hashed.

        `key` imports a key made elsewhere (at least 16 characters), e.g. when an operator
        moves keys from another system; by default eqrisk makes one with 256 random bits."""
        self.get_account(account_id)
        key_id = secrets.token_hex(6)
        if key is None:
            key = f"eqk_{key_id}_{secrets.token_urlsafe(32).replace('_', '-')}"
        elif len(key) < 16:
            raise AccountError("an imported key must have at least 16 characters")
        with db.transaction(self.engine) as conn:
            conn.execute(
                insert(db.api_keys).values(
                    key_id=key_id,
                    account_id=account_id,
                    key_hash=hash_key(key),
                    label=label,
                    rate_limit=rate_limit,
                    is_demo=False,
                    created_at=_now(),
                )
            )
        return {"key": key, "key_id": key_id, "account_id": account_id, "rate_limit": rate_limit}

    def list_keys(self, account_id: str | None = None) -> list[dict[str, Any]]:
        query = select(
            db.api_keys.c.key_id,
            db.api_keys.c.account_id,
            db.api_keys.c.label,
            db.api_keys.c.rate_limit,
            db.api_keys.c.is_demo,
            db.api_keys.c.created_at,
            db.api_keys.c.revoked_at,
        ).order_by(db.api_keys.c.created_at)
        if account_id:
            query = query.where(db.api_keys.c.account_id == account_id)
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(query).mappings()]

    def revoke_key(self, key_id: str) -> None:
        try:
            self._revoke_key(key_id)
        finally:
            _access_changed()

    def _revoke_key(self, key_id: str) -> None:
        with db.transaction(self.engine) as conn:
            result = conn.execute(
                update(db.api_keys)
                .where(and_(db.api_keys.c.key_id == key_id, db.api_keys.c.revoked_at.is_(None)))
                .values(revoked_at=_now())
            )
            if result.rowcount != 1:
                raise AccountError(f"no active key {key_id!r}")

    def ensure_demo_key(self, key: str) -> None:
        """The shared demo key (a documented value from the settings) exists, and is the only
        active demo key: rotating the setting revokes the old one. Safe when several server
        workers start at once (the loser of an insert race finds the winner's rows)."""
        try:
            self._ensure_demo_key(key)
        except IntegrityError:
            self._ensure_demo_key(key)
        finally:
            _access_changed()

    def _ensure_demo_key(self, key: str) -> None:
        digest = hash_key(key)
        now = _now()
        with db.transaction(self.engine) as conn:
            if (
                conn.execute(
                    select(db.accounts.c.account_id).where(db.accounts.c.account_id == DEMO_ACCOUNT)
                ).first()
                is None
            ):
                conn.execute(
                    insert(db.accounts).values(
                        account_id=DEMO_ACCOUNT,
                        name="Shared demo key",
                        state="verified",
                        balance_tokens=0,
                        is_demo=True,
                        created_at=now,
                    )
                )
            active = conn.execute(
                select(db.api_keys.c.key_id, db.api_keys.c.key_hash).where(
                    and_(db.api_keys.c.is_demo.is_(True), db.api_keys.c.revoked_at.is_(None))
                )
            ).all()
            if any(hmac.compare_digest(row.key_hash, digest) for row in active):
                return
            for row in active:
                conn.execute(
                    update(db.api_keys)
                    .where(db.api_keys.c.key_id == row.key_id)
                    .values(revoked_at=now)
                )
            conn.execute(
                insert(db.api_keys).values(
                    key_id="demo-" + secrets.token_hex(4),
                    account_id=DEMO_ACCOUNT,
                    key_hash=digest,
                    label="shared demo key",
                    rate_limit=DEMO_RATE_LIMIT,
                    is_demo=True,
                    created_at=now,
                )
            )

    def authenticate(self, key: str) -> KeyRecord | None:
        """The active key record for a presented key, or None (unknown or revoked).

        Looked up by the key's SHA-256 (a secret's hash reveals nothing usable about timing);
        the stored hash is then compared in constant time."""
        digest = hash_key(key)
        query = (
            select(
                db.api_keys.c.key_id,
                db.api_keys.c.account_id,
                db.api_keys.c.key_hash,
                db.api_keys.c.rate_limit,
                db.api_keys.c.is_demo,
                db.accounts.c.state,
                db.accounts.c.balance_tokens,
            )
            .join(db.accounts, db.accounts.c.account_id == db.api_keys.c.account_id)
            .where(and_(db.api_keys.c.key_hash == digest, db.api_keys.c.revoked_at.is_(None)))
        )
        with self.engine.connect() as conn:
            row = conn.execute(query).first()
        if row is None or not hmac.compare_digest(row.key_hash, digest):
            return None
        return KeyRecord(
            row.key_id,
            row.account_id,
            row.rate_limit,
            row.is_demo,
            row.state,
            int(row.balance_tokens),
        )

    # -- money ----------------------------------------------------------------------------
    def balance(self, account_id: str) -> int:
        with self.engine.connect() as conn:
            return _balance_of(conn, account_id)

    def charge(
        self,
        account_id: str,
        tokens: int,
        *,
        key_id: str,
        route: str,
        params_digest: str,
        request_id: str,
    ) -> Charge:
        """Debit `tokens` if the balance covers them, with its ledger row, atomically."""
        request = ChargeRequest(account_id, tokens, key_id, route, params_digest, request_id)
        (result,) = self.charge_many([request])
        if result.account_state == "":
            raise AccountError(f"no account {account_id!r}")
        return result

    def charge_many(
        self, requests: Sequence[ChargeRequest], *, conn: PoolProxiedConnection | None = None
    ) -> list[Charge]:
        """Several charges in one transaction (the per-process writer's group commit), each
        decided in order as if alone: debited if its account is verified and its balance covers
        it after the charges before it, else refused; each debit with its ledger row and its
        month's usage. One commit for all, so one fsync and one lock for the whole group.
        `conn`: a connection from `write_connection` that the caller keeps between calls."""
        if not requests:
            return []
        sql = _SQL[self.engine.dialect.name]
        if conn is not None:
            return _charge_in(conn, sql, requests, _now())
        own = self.engine.raw_connection()
        try:
            return _charge_in(own, sql, requests, _now())
        finally:
            own.close()

    def write_connection(self) -> PoolProxiedConnection:
        """A driver connection from the pool for a writer that keeps it between charges (and
        closes it, which returns it to the pool)."""
        return self.engine.raw_connection()

    def ledger(self, account_id: str) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(db.ledger)
                .where(db.ledger.c.account_id == account_id)
                .order_by(db.ledger.c.entry_id)
            ).mappings()
            return [dict(r) for r in rows]

    def usage(self, account_id: str, since: datetime) -> dict[str, Any]:
        """Charges since a time: count and tokens, in total and per route."""
        query = (
            select(db.ledger.c.route, func.count(), func.sum(-db.ledger.c.tokens))
            .where(
                and_(
                    db.ledger.c.account_id == account_id,
                    db.ledger.c.kind == "charge",
                    db.ledger.c.created_at >= since,
                )
            )
            .group_by(db.ledger.c.route)
        )
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        per_route = {r[0]: {"requests": int(r[1]), "tokens": int(r[2] or 0)} for r in rows}
        return _usage_totals(per_route)

    def account_month(self, account_id: str, month: str) -> dict[str, Any]:
        """The account's state and balance (its row) and its usage in `month` ("YYYY-MM", UTC)
        from `monthly_usage`: a few rows read, whatever the size of the ledger, in one
        statement (one snapshot: the balance and the usage agree), in plain SQL (the Core
        statement cost twenty times the query here, and `/api/balance` runs it every call)."""
        sql = _SQL[self.engine.dialect.name]
        raw = self.engine.raw_connection()
        try:
            cursor = raw.cursor()
            cursor.execute(sql.account_month, (month, account_id))
            rows = cursor.fetchall()
            cursor.close()
        finally:
            raw.close()
        if not rows:
            raise AccountError(f"no account {account_id!r}")
        per_route = {
            route: {"requests": int(requests), "tokens": int(tokens)}
            for _, _, route, requests, tokens in rows
            if route is not None
        }
        return {
            "state": rows[0][0],
            "balance_tokens": int(rows[0][1]),
            "usage": _usage_totals(per_route),
        }

    def month_usage_rows(self) -> dict[tuple[str, str, str], tuple[int, int]]:
        """Every `monthly_usage` row, (account, month, route) -> (requests, tokens): what the
        consistency checks compare with `ledger_month_totals`."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(db.monthly_usage)).all()
        return {(r.account_id, r.month, r.route): (int(r.requests), int(r.tokens)) for r in rows}

    def ledger_month_totals(self) -> dict[tuple[str, str, str], tuple[int, int]]:
        """The ledger's charges grouped as `monthly_usage` keeps them (the slow, exact way)."""
        month = db.charge_month(self.engine.dialect.name, db.ledger.c.created_at)
        route = func.coalesce(db.ledger.c.route, "")
        query = (
            select(
                db.ledger.c.account_id, month, route, func.count(), func.sum(-db.ledger.c.tokens)
            )
            .where(db.ledger.c.kind == "charge")
            .group_by(db.ledger.c.account_id, month, route)
        )
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        return {(r[0], r[1], r[2]): (int(r[3]), int(r[4])) for r in rows}


def month_of(when: datetime) -> str:
    """The usage month of a time: "YYYY-MM" in UTC."""
    return when.astimezone(UTC).strftime("%Y-%m")


def _usage_totals(per_route: dict[str, dict[str, int]]) -> dict[str, Any]:
    return {
        "requests": sum(v["requests"] for v in per_route.values()),
        "tokens": sum(v["tokens"] for v in per_route.values()),
        "by_route": per_route,
    }


def _charge_in(
    raw: PoolProxiedConnection, sql: _Sql, requests: Sequence[ChargeRequest], now: datetime
) -> list[Charge]:
    """`_charge_all` in its own write transaction on a driver connection: SQLite's connections
    run in autocommit mode (db.py), so the write lock is taken by BEGIN IMMEDIATE; psycopg
    opens the transaction itself at the first statement."""
    cursor = raw.cursor()
    try:
        if sql.begin:
            cursor.execute(sql.begin)
        results = _charge_all(cursor, sql, requests, now)
        raw.commit()
        return results
    except BaseException:
        raw.rollback()
        raise
    finally:
        cursor.close()


def _charge_all(
    cursor: Any, sql: _Sql, requests: Sequence[ChargeRequest], now: datetime
) -> list[Charge]:
    """The charges of one transaction. The accounts' rows are read locked (FOR UPDATE on
    PostgreSQL, in sorted order so that two processes never deadlock; SQLite's write
    transaction already holds the database's lock), each charge is decided in order against
    the running balance, then each account is debited its total by one conditional UPDATE (the
    CHECK constraint and the `balance >= total` condition stay the last word), the ledger rows
    are inserted by one executemany and the month's usage rows upserted the same way.

    Plain SQL on the driver's cursor (the same text on SQLite and PostgreSQL but for the
    placeholder): this runs for every paid request, and building SQLAlchemy statements cost
    several times the database's own work here."""
    ids = sorted({r.account_id for r in requests})
    cursor.execute(sql.locked(len(ids)), ids)
    state: dict[str, str] = {}
    balance: dict[str, int] = {}
    for account_id, account_state, tokens in cursor.fetchall():
        state[account_id] = account_state
        balance[account_id] = int(tokens)
    # A key revoked since its request was let in is not charged (nor answered: the gate
    # turns that into a 401), whatever a cache of keys still remembered.
    key_ids = sorted({r.key_id for r in requests})
    cursor.execute(sql.revoked(len(key_ids)), key_ids)
    revoked = {row[0] for row in cursor.fetchall()}
    debits: dict[str, int] = {}
    accepted: list[ChargeRequest] = []
    results: list[Charge] = []
    for r in requests:
        account_state = state.get(r.account_id, "")
        left = balance.get(r.account_id, 0)
        if r.key_id in revoked:
            results.append(Charge(False, left, account_state, key_revoked=True))
        elif account_state != "verified" or r.tokens < 0 or left < r.tokens:
            results.append(Charge(False, left, account_state))
        else:
            balance[r.account_id] = left - r.tokens
            debits[r.account_id] = debits.get(r.account_id, 0) + r.tokens
            accepted.append(r)
            results.append(Charge(True, left - r.tokens, "verified"))
    if not accepted:
        return results
    for account_id, total in debits.items():
        cursor.execute(sql.debit, (total, account_id, total))
        if cursor.rowcount != 1:  # the locked row changed under us: impossible, so stop
            raise RuntimeError(f"account {account_id} changed during its charge transaction")
    at = sql.stamp(now)
    cursor.executemany(
        sql.ledger,
        [
            (r.account_id, r.key_id, r.route, r.params_digest, -r.tokens, r.request_id, at)
            for r in accepted
        ],
    )
    month = month_of(now)
    usage: dict[tuple[str, str], list[int]] = {}
    for r in accepted:
        totals = usage.setdefault((r.account_id, r.route), [0, 0])
        totals[0] += 1
        totals[1] += r.tokens
    cursor.executemany(
        sql.usage,
        [(a, month, route, c, t) for (a, route), (c, t) in usage.items()],
    )
    return results


@dataclass(frozen=True)
class _Sql:
    """The hot path's statements (charges, `/api/balance`) in one dialect: the same text but for
    the placeholder (`?` for sqlite3, `%s` for psycopg) and PostgreSQL's row lock."""

    mark: str
    for_update: str
    begin: str  # what opens a write transaction ("" where the driver opens it)
    # SQLAlchemy keeps SQLite times as "YYYY-MM-DD HH:MM:SS.ffffff" text (UTC here);
    # PostgreSQL takes the aware datetime itself.
    text_times: bool

    def _list(self, n: int) -> str:
        return ", ".join([self.mark] * n)

    def locked(self, n: int) -> str:
        return (
            "SELECT account_id, state, balance_tokens FROM accounts "
            f"WHERE account_id IN ({self._list(n)}) ORDER BY account_id{self.for_update}"
        )

    def revoked(self, n: int) -> str:
        return (
            f"SELECT key_id FROM api_keys WHERE key_id IN ({self._list(n)}) "
            "AND revoked_at IS NOT NULL"
        )

    @property
    def debit(self) -> str:
        m = self.mark
        return (
            f"UPDATE accounts SET balance_tokens = balance_tokens - {m} "
            f"WHERE account_id = {m} AND state = 'verified' AND balance_tokens >= {m}"
        )

    @property
    def ledger(self) -> str:
        return (
            "INSERT INTO ledger (account_id, key_id, kind, route, params_digest, tokens, "
            f"request_id, created_at) VALUES ({self.mark}, {self.mark}, 'charge', "
            f"{self._list(5)})"
        )

    @property
    def usage(self) -> str:
        return (
            "INSERT INTO monthly_usage (account_id, month, route, requests, tokens) "
            f"VALUES ({self._list(5)}) ON CONFLICT (account_id, month, route) DO UPDATE SET "
            "requests = monthly_usage.requests + excluded.requests, "
            "tokens = monthly_usage.tokens + excluded.tokens"
        )

    @property
    def account_month(self) -> str:
        return (
            "SELECT a.state, a.balance_tokens, u.route, u.requests, u.tokens FROM accounts a "
            "LEFT JOIN monthly_usage u ON u.account_id = a.account_id "
            f"AND u.month = {self.mark} WHERE a.account_id = {self.mark}"
        )

    def stamp(self, now: datetime) -> datetime | str:
        return now.strftime("%Y-%m-%d %H:%M:%S.%f") if self.text_times else now


_SQL = {
    "sqlite": _Sql("?", "", "BEGIN IMMEDIATE", text_times=True),
    "postgresql": _Sql("%s", " FOR UPDATE", "", text_times=False),
}


def _balance_of(conn: Connection, account_id: str) -> int:
    value = conn.execute(
        select(db.accounts.c.balance_tokens).where(db.accounts.c.account_id == account_id)
    ).scalar()
    if value is None:
        raise AccountError(f"no account {account_id!r}")
    return int(value)


def _verify_card(conn: Connection, account_id: str, provider: str, reference: str | None) -> bool:
    now = _now()
    state = conn.execute(
        select(db.accounts.c.state).where(db.accounts.c.account_id == account_id)
    ).scalar()
    if state is None:
        raise AccountError(f"no account {account_id!r}")
    if state == "suspended":
        raise AccountError(f"account {account_id} is suspended; reinstate it first")
    exists = conn.execute(
        select(db.card_verifications.c.account_id).where(
            db.card_verifications.c.account_id == account_id
        )
    ).first()
    if exists:
        return False
    conn.execute(
        insert(db.card_verifications).values(
            account_id=account_id, provider=provider, reference=reference, verified_at=now
        )
    )
    conn.execute(
        update(db.accounts)
        .where(db.accounts.c.account_id == account_id)
        .values(
            state="verified",
            verified_at=now,
            balance_tokens=db.accounts.c.balance_tokens + STARTING_CREDIT_TOKENS,
        )
    )
    conn.execute(
        insert(db.ledger).values(
            account_id=account_id,
            kind="grant",
            route="starting_credit",
            tokens=STARTING_CREDIT_TOKENS,
            created_at=now,
        )
    )
    return True

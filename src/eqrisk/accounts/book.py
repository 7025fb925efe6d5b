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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, and_, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.pool import PoolProxiedConnection

from eqrisk.accounts import db
from eqrisk.accounts.backends import Backend, database_outage
from eqrisk.accounts.charges import SQL, charge_in
from eqrisk.accounts.charges import Charge as Charge
from eqrisk.accounts.charges import ChargeRequest as ChargeRequest
from eqrisk.accounts.charges import month_of as month_of
from eqrisk.accounts.pricing import usd_to_tokens

STARTING_CREDIT_TOKENS = usd_to_tokens("20")
DEFAULT_RATE_LIMIT = "120/minute"
DEMO_RATE_LIMIT = "5/minute"
DEMO_ACCOUNT = "demo"
STATES = ("created", "verified", "suspended")
T = TypeVar("T")


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

    def __init__(self, engine: Engine, *, retry_s: float = 1.0) -> None:
        self.engine = engine
        # The database's state as requests see it: every request-time call goes through
        # `backend.guard()` (key lookups, charges, the balance), so an outage is a 503 that
        # waits for a timeout at most once per `retry_s` (accounts/backends.py).
        self.backend = Backend("database", is_outage=database_outage, retry_s=retry_s)
        self.starting_credit = STARTING_CREDIT_TOKENS  # the server sets its setting's

    @property
    def reads_inline(self) -> bool:
        """Whether a read of a few rows by key (`account_month`) may run on the event loop: on
        SQLite in WAL mode a reader never waits for a writer and the read costs tens of
        microseconds, less than a hop to a worker thread; PostgreSQL is a network round trip."""
        return self.engine.dialect.name == "sqlite"

    # -- accounts -----------------------------------------------------------------------
    def create_account(self, name: str, email: str | None = None) -> dict[str, Any]:
        with db.transaction(self.engine) as conn:
            account_id = insert_account_in(conn, name, email, _now())
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
                return verify_card_in(conn, account_id, provider, reference, self.starting_credit)
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
                return verify_card_in(conn, account_id, provider, reference, self.starting_credit)
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
        if key is not None and len(key) < 16:
            raise AccountError("an imported key must have at least 16 characters")
        with db.transaction(self.engine) as conn:
            key, key_id = insert_key_in(conn, account_id, label, rate_limit, key)
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
            demo = select(db.accounts.c.account_id).where(db.accounts.c.account_id == DEMO_ACCOUNT)
            if conn.execute(demo).first() is None:
                insert_account_in(conn, "Shared demo key", None, now, demo=True)
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
            insert_key_in(conn, DEMO_ACCOUNT, "shared demo key", DEMO_RATE_LIMIT, key, demo=True)

    def authenticate(self, key: str) -> KeyRecord | None:
        """The active key record for a presented key, or None (unknown, revoked or expired).

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
            .outerjoin(db.key_expiry, db.key_expiry.c.key_id == db.api_keys.c.key_id)
            .where(and_(db.api_keys.c.key_hash == digest, db.api_keys.c.revoked_at.is_(None)))
            .where(or_(db.key_expiry.c.expires_at.is_(None), db.key_expiry.c.expires_at > _now()))
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
        sql = SQL[self.engine.dialect.name]
        if conn is not None:
            return charge_in(conn, sql, requests, _now(), self._pid(conn))
        own = self.engine.raw_connection()
        try:
            return charge_in(own, sql, requests, _now(), self._pid(own))
        finally:
            own.close()

    def _pid(self, raw: PoolProxiedConnection) -> int | None:
        if self.engine.dialect.name != "postgresql":
            return None
        from eqrisk.accounts.pg import backend_pid

        return backend_pid(raw)

    def settle(self, xid: str, pid: int | None) -> str:
        """On a fresh connection: whether charge transaction `xid` (of server process `pid`),
        whose COMMIT got no answer, committed ("committed") or not ("aborted"); PostgreSQL
        only, as `CommitUnknown` (accounts/pg.py)."""
        from eqrisk.accounts import pg

        return self._fresh(lambda raw: pg.settle(raw, xid, pid))

    def undo(self, xid: str, pid: int | None) -> int:
        """Take back the charges of transaction `xid` if it committed (its requests were
        answered with an error); the number taken back (accounts/pg.py)."""
        from eqrisk.accounts import pg

        return self._fresh(lambda raw: pg.undo(raw, xid, pid))

    def _fresh(self, work: Callable[[PoolProxiedConnection], T]) -> T:
        raw = self.engine.raw_connection()
        try:
            return work(raw)
        except BaseException:
            raw.invalidate()
            raise
        finally:
            raw.close()

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
        sql = SQL[self.engine.dialect.name]
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


def _usage_totals(per_route: dict[str, dict[str, int]]) -> dict[str, Any]:
    return {
        "requests": sum(v["requests"] for v in per_route.values()),
        "tokens": sum(v["tokens"] for v in per_route.values()),
        "by_route": per_route,
    }


def _balance_of(conn: Connection, account_id: str) -> int:
    value = conn.execute(
        select(db.accounts.c.balance_tokens).where(db.accounts.c.account_id == account_id)
    ).scalar()
    if value is None:
        raise AccountError(f"no account {account_id!r}")
    return int(value)


def insert_account_in(
    conn: Connection, name: str, email: str | None, now: datetime, *, demo: bool = False
) -> str:
    """In `conn`'s transaction: a new account with no balance, unverified (`demo`: the shared
    demo key's, verified); its id."""
    if not name.strip():
        raise AccountError("an account needs a name")
    account_id = DEMO_ACCOUNT if demo else "acc_" + secrets.token_hex(8)
    state = "verified" if demo else "created"
    conn.execute(
        insert(db.accounts).values(
            account_id=account_id,
            name=name.strip(),
            email=email,
            state=state,
            balance_tokens=0,
            is_demo=demo,
            created_at=now,
        )
    )
    return account_id


def insert_key_in(
    conn: Connection,
    account_id: str,
    label: str | None,
    rate_limit: str,
    key: str | None = None,
    *,
    demo: bool = False,
) -> tuple[str, str]:
    """In `conn`'s transaction: a new key of the account, stored only hashed: `key`, or one
    made with 256 random bits; (the key, its id)."""
    key_id = "demo-" + secrets.token_hex(4) if demo else secrets.token_hex(6)
    if key is None:
        key = f"eqk_{key_id}_{secrets.token_urlsafe(32).replace('_', '-')}"
    conn.execute(
        insert(db.api_keys).values(
            key_id=key_id,
            account_id=account_id,
            key_hash=hash_key(key),
            label=label,
            rate_limit=rate_limit,
            is_demo=demo,
            created_at=_now(),
        )
    )
    return key, key_id


def verify_card_in(
    conn: Connection, account_id: str, provider: str, reference: str | None, credit: int
) -> bool:
    """In `conn`'s transaction: record the account's verified card, granting `credit` tokens
    (none when 0) if it is the account's first; False when it was already verified."""
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
            balance_tokens=db.accounts.c.balance_tokens + credit,
        )
    )
    if credit <= 0:
        return False
    conn.execute(
        insert(db.ledger).values(
            account_id=account_id,
            kind="grant",
            route="starting_credit",
            tokens=credit,
            created_at=now,
        )
    )
    return True

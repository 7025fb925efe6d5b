"""Accounts, API keys and the credit ledger: the only code that writes them.

- Keys look like `eqk_<key_id>_<secret>`; only SHA-256 of the whole key is stored (the secret
  has 256 bits of entropy, so a slow hash adds nothing), compared in constant time; the key is
  returned once, at creation, and never logged.
- Balances are integer tokens (1 token = $0.00002). A charge is one statement,
  `UPDATE ... SET balance = balance - cost WHERE balance >= cost`, in the same transaction as its
  ledger row: the balance never goes below zero and two requests never spend the same credit.
- Life cycle: created -> verified (the card check grants the starting credit, once: the
  verification row's primary key is the account) -> suspended (and back to verified by an
  operator, with no second grant).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, and_, func, insert, select, update
from sqlalchemy.exc import IntegrityError

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
class Charge:
    ok: bool
    balance_tokens: int
    entry_id: int | None = None


def _now() -> datetime:
    return datetime.now(UTC)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class Accounts:
    """Operations on one accounts database (SQLite or PostgreSQL)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

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
        with db.transaction(self.engine) as conn:
            return _verify_card(conn, account_id, provider, reference)

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

    def set_state(self, account_id: str, state: str) -> None:
        """Suspend, or reinstate (to verified: only an account whose card was verified)."""
        if state not in ("suspended", "verified"):
            raise AccountError("state must be 'suspended' or 'verified'")
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
        now = _now()
        with db.transaction(self.engine) as conn:
            result = conn.execute(
                update(db.accounts)
                .where(
                    and_(
                        db.accounts.c.account_id == account_id,
                        db.accounts.c.state == "verified",
                        db.accounts.c.balance_tokens >= tokens,
                    )
                )
                .values(balance_tokens=db.accounts.c.balance_tokens - tokens)
            )
            balance = _balance_of(conn, account_id)
            if result.rowcount != 1:
                return Charge(ok=False, balance_tokens=balance)
            entry = conn.execute(
                insert(db.ledger)
                .values(
                    account_id=account_id,
                    key_id=key_id,
                    kind="charge",
                    route=route,
                    params_digest=params_digest,
                    tokens=-tokens,
                    request_id=request_id,
                    created_at=now,
                )
                .returning(db.ledger.c.entry_id)
            ).scalar_one()
        return Charge(ok=True, balance_tokens=balance, entry_id=int(entry))

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

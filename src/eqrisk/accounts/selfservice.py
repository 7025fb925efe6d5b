"""Self-service accounts on the database: a sign-up, its card verified by the provider's signed
event, the first key claimed once, top-ups credited once. No provider calls here (the HTTP
routes make them, accounts/stripe_gateway.py); every step is one transaction.

- A sign-up makes an unverified account and a one-time claim token (only its SHA-256 kept),
  refused past `per_hour` sign-ups from one client address in the last hour; unverified
  sign-ups older than `expiry_s` are deleted (with their accounts) at the next sign-up.
- The card is verified only by the provider's event (`card_verified`): one event id is acted on
  once (`webhook_events`), an event for another setup than the sign-up's is ignored, and the
  starting credit goes to the first account of a card fingerprint only.
- The first key is made when the claim token is presented after the verification, once: it is
  returned to that caller and stored hashed, like every key.
- A top-up's PaymentIntent is recorded when asked for (`open_topup`) and credited once, by its
  event (`topup_paid`), with a `credit` ledger row whose request id is the PaymentIntent's id.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from eqrisk.accounts import db
from eqrisk.accounts.book import (
    DEFAULT_RATE_LIMIT,
    AccountError,
    Accounts,
    insert_account_in,
    insert_key_in,
    verify_card_in,
)

TOKENS_PER_CENT = 500  # 1 token = 0.00002 USD, so 1 cent = 500 tokens


class SignupRefused(AccountError):
    """A sign-up refused for its client address (too many in the last hour)."""


@dataclass(frozen=True)
class Verified:
    """What a card event did: `credited` the starting credit, or the `note` saying why not."""

    account_id: str
    credited: bool
    note: str | None


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _now() -> datetime:
    return datetime.now(UTC)


def _aware(value: datetime) -> datetime:
    """SQLite gives back naive UTC times; PostgreSQL aware ones."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _seen(conn: Connection, event_id: str, event_type: str, account_id: str | None) -> bool:
    """Remember an event id in this transaction; True when it was already remembered (the
    savepoint keeps the transaction usable on PostgreSQL after the collision)."""
    try:
        with conn.begin_nested():
            conn.execute(
                insert(db.webhook_events).values(
                    event_id=event_id,
                    event_type=event_type,
                    account_id=account_id,
                    received_at=_now(),
                )
            )
    except IntegrityError:
        return True
    return False


class SelfService:
    """The self-service steps on one accounts database."""

    def __init__(self, accounts: Accounts, *, per_hour: int = 5, expiry_s: int = 86400) -> None:
        self.accounts = accounts
        self.engine = accounts.engine
        self.per_hour = per_hour
        self.expiry_s = expiry_s

    # -- sign-up ----------------------------------------------------------------------------
    def begin(self, name: str, email: str, address: str) -> tuple[str, str]:
        """A new unverified account for `name` and `email`; returns (account id, claim token).
        Raises SignupRefused past the address's hourly sign-ups."""
        now = _now()
        self.expire(now)
        token = "claim_" + secrets.token_urlsafe(32)
        with db.transaction(self.engine) as conn:
            recent = conn.execute(
                select(func.count()).where(
                    and_(
                        db.signups.c.address == address,
                        db.signups.c.created_at >= now - timedelta(hours=1),
                    )
                )
            ).scalar_one()
            if recent >= self.per_hour:
                raise SignupRefused(
                    f"{self.per_hour} sign-ups an hour are allowed from one address; "
                    "try again later"
                )
            account_id = insert_account_in(conn, name, email, now)
            conn.execute(
                insert(db.signups).values(
                    account_id=account_id,
                    address=address[:64],
                    claim_hash=_digest(token),
                    created_at=now,
                )
            )
        return account_id, token

    def attach_setup(self, account_id: str, setup_intent: str) -> None:
        """The provider's setup (SetupIntent id) that will verify this sign-up's card."""
        with db.transaction(self.engine) as conn:
            conn.execute(
                update(db.signups)
                .where(db.signups.c.account_id == account_id)
                .values(setup_intent=setup_intent)
            )

    def expire(self, now: datetime | None = None) -> int:
        """Delete unverified sign-ups (and their accounts) older than `expiry_s`; how many."""
        cutoff = (now or _now()) - timedelta(seconds=self.expiry_s)
        stale = (
            select(db.signups.c.account_id)
            .join(db.accounts, db.accounts.c.account_id == db.signups.c.account_id)
            .where(and_(db.signups.c.created_at < cutoff, db.accounts.c.state == "created"))
        )
        with db.transaction(self.engine) as conn:
            ids = [row[0] for row in conn.execute(stale)]
            if not ids:
                return 0
            conn.execute(delete(db.signups).where(db.signups.c.account_id.in_(ids)))
            conn.execute(delete(db.accounts).where(db.accounts.c.account_id.in_(ids)))
        return len(ids)

    def card_verified(
        self, event_id: str, account_id: str, setup_intent: str, fingerprint: str
    ) -> Verified | None:
        """The provider's signed `setup_intent.succeeded`: verify the sign-up's account, with
        the starting credit if the card's fingerprint has not had one. None: nothing done (the
        event was seen before, or it is not this sign-up's setup, or the sign-up expired)."""
        with db.transaction(self.engine) as conn:
            if _seen(conn, event_id, "setup_intent.succeeded", account_id):
                return None
            signup = conn.execute(
                select(db.signups.c.setup_intent, db.signups.c.created_at).where(
                    db.signups.c.account_id == account_id
                )
            ).first()
            if signup is None or signup.setup_intent != setup_intent:
                return None
            if expired(signup.created_at, self.expiry_s):
                return None
            owner = conn.execute(
                select(db.card_fingerprints.c.account_id).where(
                    db.card_fingerprints.c.fingerprint == fingerprint
                )
            ).scalar()
            note = None
            if owner is None:
                conn.execute(
                    insert(db.card_fingerprints).values(
                        fingerprint=fingerprint, account_id=account_id, created_at=_now()
                    )
                )
            elif owner != account_id:
                note = "this card already received the starting credit on another account"
            credit = self.accounts.starting_credit if note is None else 0
            credited = verify_card_in(conn, account_id, "stripe", setup_intent, credit)
            if note is not None:
                conn.execute(
                    update(db.signups)
                    .where(db.signups.c.account_id == account_id)
                    .values(note=note)
                )
            return Verified(account_id, credited, note)

    def claim(self, token: str) -> dict[str, Any]:
        """The sign-up's first key, once, after its card is verified: {"state": "pending"}
        before; {"state": "verified", "key", ...} the one time; AccountError after, or for an
        unknown or expired token."""
        with db.transaction(self.engine) as conn:
            row = conn.execute(
                select(
                    db.signups.c.account_id,
                    db.signups.c.claimed_at,
                    db.signups.c.note,
                    db.signups.c.created_at,
                    db.accounts.c.state,
                    db.accounts.c.balance_tokens,
                )
                .join(db.accounts, db.accounts.c.account_id == db.signups.c.account_id)
                .where(db.signups.c.claim_hash == _digest(token))
            ).first()
            if row is None or (row.state == "created" and expired(row.created_at, self.expiry_s)):
                raise AccountError("unknown or expired claim token; sign up again")
            if row.state == "created":
                return {"state": "pending", "account_id": row.account_id}
            if row.claimed_at is not None:
                raise AccountError("this sign-up's first key was already shown; it is shown once")
            done = conn.execute(
                update(db.signups)
                .where(
                    and_(
                        db.signups.c.account_id == row.account_id, db.signups.c.claimed_at.is_(None)
                    )
                )
                .values(claimed_at=_now())
            )
            if done.rowcount != 1:
                raise AccountError("this sign-up's first key was already shown; it is shown once")
            key, key_id = insert_key_in(conn, row.account_id, "first key", DEFAULT_RATE_LIMIT)
            return {
                "state": row.state,
                "account_id": row.account_id,
                "key": key,
                "key_id": key_id,
                "balance_tokens": int(row.balance_tokens),
                "note": row.note,
            }

    def how_verified(self) -> dict[str, dict[str, Any]]:
        """Per account: the provider and reference of its card verification and any note."""
        query = select(
            db.card_verifications.c.account_id,
            db.card_verifications.c.provider,
            db.card_verifications.c.reference,
            db.signups.c.note,
        ).outerjoin(db.signups, db.signups.c.account_id == db.card_verifications.c.account_id)
        with self.engine.connect() as conn:
            return {
                r.account_id: {"provider": r.provider, "reference": r.reference, "note": r.note}
                for r in conn.execute(query)
            }

    # -- key expiry -------------------------------------------------------------------------
    def set_expiry(self, key_id: str, expires_at: datetime) -> None:
        """The key stops authenticating at `expires_at` (within the key cache's second)."""
        with db.transaction(self.engine) as conn:
            conn.execute(insert(db.key_expiry).values(key_id=key_id, expires_at=expires_at))

    def expiries(self, account_id: str) -> dict[str, datetime]:
        query = (
            select(db.key_expiry.c.key_id, db.key_expiry.c.expires_at)
            .join(db.api_keys, db.api_keys.c.key_id == db.key_expiry.c.key_id)
            .where(db.api_keys.c.account_id == account_id)
        )
        with self.engine.connect() as conn:
            return {r.key_id: _aware(r.expires_at) for r in conn.execute(query)}

    # -- top-ups ----------------------------------------------------------------------------
    def open_topup(self, account_id: str, payment_intent: str, amount_cents: int) -> None:
        with db.transaction(self.engine) as conn:
            conn.execute(
                insert(db.topups).values(
                    payment_intent=payment_intent,
                    account_id=account_id,
                    amount_cents=amount_cents,
                    tokens=amount_cents * TOKENS_PER_CENT,
                    created_at=_now(),
                )
            )

    def topup_paid(self, event_id: str, payment_intent: str, amount_cents: int) -> int | None:
        """The provider's signed `payment_intent.succeeded`: credit the top-up once, with its
        receipt line in the ledger; the new balance, or None when nothing was done (the event
        or the PaymentIntent was seen before, or is no top-up of ours, or its amount differs)."""
        with db.transaction(self.engine) as conn:
            if _seen(conn, event_id, "payment_intent.succeeded", None):
                return None
            topup = conn.execute(
                select(db.topups).where(db.topups.c.payment_intent == payment_intent)
            ).first()
            if topup is None or topup.amount_cents != amount_cents:
                return None
            now = _now()
            done = conn.execute(
                update(db.topups)
                .where(
                    and_(
                        db.topups.c.payment_intent == payment_intent,
                        db.topups.c.credited_at.is_(None),
                    )
                )
                .values(credited_at=now)
            )
            if done.rowcount != 1:
                return None
            conn.execute(
                update(db.accounts)
                .where(db.accounts.c.account_id == topup.account_id)
                .values(balance_tokens=db.accounts.c.balance_tokens + topup.tokens)
            )
            conn.execute(
                insert(db.ledger).values(
                    account_id=topup.account_id,
                    kind="credit",
                    route="topup",
                    tokens=topup.tokens,
                    request_id=payment_intent,
                    created_at=now,
                )
            )
            return int(
                conn.execute(
                    select(db.accounts.c.balance_tokens).where(
                        db.accounts.c.account_id == topup.account_id
                    )
                ).scalar_one()
            )

    # -- the account's own view -------------------------------------------------------------
    def usage_by_day(self, account_id: str, since: datetime) -> list[dict[str, Any]]:
        """Charges since `since`, per UTC day and route: requests and tokens."""
        created = db.ledger.c.created_at
        if self.engine.dialect.name == "postgresql":
            day = func.to_char(func.timezone("UTC", created), "YYYY-MM-DD")
        else:
            day = func.substr(created, 1, 10)
        query = (
            select(day, db.ledger.c.route, func.count(), func.sum(-db.ledger.c.tokens))
            .where(
                and_(
                    db.ledger.c.account_id == account_id,
                    db.ledger.c.kind == "charge",
                    created >= since,
                )
            )
            .group_by(day, db.ledger.c.route)
            .order_by(day, db.ledger.c.route)
        )
        with self.engine.connect() as conn:
            return [
                {"day": r[0], "route": r[1], "requests": int(r[2]), "tokens": int(r[3] or 0)}
                for r in conn.execute(query)
            ]


def expired(created_at: datetime, expiry_s: int, now: datetime | None = None) -> bool:
    return _aware(created_at) < (now or _now()) - timedelta(seconds=expiry_s)

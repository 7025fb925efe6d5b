"""The operator's view of the money: the ledger and the balances as rows (`eqrisk accounts
export`), and the reconciliation of every account (`eqrisk accounts reconcile`).

Every change of a balance writes its ledger row in the same transaction (grants and credits
positive, charges negative), so for every account `balance = credits - charges`, the sums of
its ledger rows. Each check reads the balances and the ledger's sums in one statement (one
snapshot of the database, on SQLite and PostgreSQL), so charges committed meanwhile by a
running server never show as a difference.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy import Engine, case, func, select

from eqrisk.accounts import db
from eqrisk.accounts.pricing import TOKEN_USD

LEDGER_COLUMNS = (
    "entry_id",
    "account_id",
    "key_id",
    "kind",
    "route",
    "params_digest",
    "tokens",
    "usd",
    "request_id",
    "created_at",
)
STREAM_ROWS = 10_000


def usd(tokens: int) -> str:
    """Tokens as an exact USD amount (a string: no float rounding in an export)."""
    return format((Decimal(tokens) * TOKEN_USD).normalize(), "f")


@dataclass(frozen=True)
class AccountTotals:
    """One account's balance beside the sums of its ledger rows."""

    account_id: str
    name: str
    state: str
    balance_tokens: int
    credits_tokens: int  # grants and credits (ledger rows > 0)
    charges_tokens: int  # charges (ledger rows < 0), as a positive amount
    ledger_rows: int

    @property
    def expected_tokens(self) -> int:
        return self.credits_tokens - self.charges_tokens

    @property
    def difference_tokens(self) -> int:
        """Balance minus what the ledger says it should be (0 when they agree)."""
        return self.balance_tokens - self.expected_tokens

    def row(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "expected_tokens": self.expected_tokens,
            "difference_tokens": self.difference_tokens,
            "balance_usd": usd(self.balance_tokens),
            "credits_usd": usd(self.credits_tokens),
            "charges_usd": usd(self.charges_tokens),
            "difference_usd": usd(self.difference_tokens),
        }


BALANCE_COLUMNS = tuple(
    AccountTotals("", "", "", 0, 0, 0, 0).row()  # the order of `row()`
)


def account_totals(engine: Engine) -> list[AccountTotals]:
    """Every account with its balance and its ledger's sums, read in one statement."""
    tokens = db.ledger.c.tokens
    sums = (
        select(
            db.ledger.c.account_id,
            func.sum(case((tokens > 0, tokens), else_=0)).label("credits"),
            func.sum(case((tokens < 0, -tokens), else_=0)).label("charges"),
            func.count().label("rows"),
        )
        .group_by(db.ledger.c.account_id)
        .subquery()
    )
    a = db.accounts.c
    query = (
        select(
            a.account_id,
            a.name,
            a.state,
            a.balance_tokens,
            func.coalesce(sums.c.credits, 0),
            func.coalesce(sums.c.charges, 0),
            func.coalesce(sums.c.rows, 0),
        )
        .select_from(db.accounts.outerjoin(sums, sums.c.account_id == a.account_id))
        .order_by(a.account_id)
    )
    with engine.connect() as conn:
        return [
            AccountTotals(str(r[0]), str(r[1]), str(r[2]), *(int(v) for v in r[3:]))
            for r in conn.execute(query)
        ]


def differences(engine: Engine) -> list[AccountTotals]:
    """The accounts whose balance is not credits - charges of their ledger."""
    return [t for t in account_totals(engine) if t.difference_tokens != 0]


@dataclass(frozen=True)
class UsageDifference:
    """One (account, month, route) whose `monthly_usage` row is not the ledger's charges
    grouped the same way (requests and tokens; 0 where a side has no row)."""

    account_id: str
    month: str
    route: str
    usage_requests: int
    usage_tokens: int
    ledger_requests: int
    ledger_tokens: int

    def row(self) -> dict[str, Any]:
        return asdict(self)


def usage_differences(engine: Engine) -> list[UsageDifference]:
    """Where `monthly_usage` and the ledger's charges disagree. The charge writes both in one
    transaction, so they always agree: a ledger row and a balance edited together (which
    `differences` cannot see) still differ from the usage the charge recorded. Read in one
    transaction (one snapshot on PostgreSQL; SQLite's reads see one state too)."""
    month = db.charge_month(engine.dialect.name, db.ledger.c.created_at)
    route = func.coalesce(db.ledger.c.route, "")
    charges = (
        select(db.ledger.c.account_id, month, route, func.count(), func.sum(-db.ledger.c.tokens))
        .where(db.ledger.c.kind == "charge")
        .group_by(db.ledger.c.account_id, month, route)
    )
    u = db.monthly_usage.c
    usage = select(u.account_id, u.month, u.route, u.requests, u.tokens)
    with engine.connect() as conn, conn.begin():
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        found = {
            (str(r[0]), str(r[1]), str(r[2])): (int(r[3]), int(r[4])) for r in conn.execute(charges)
        }
        kept = {
            (str(r[0]), str(r[1]), str(r[2])): (int(r[3]), int(r[4])) for r in conn.execute(usage)
        }
    return [
        UsageDifference(*key, *kept.get(key, (0, 0)), *found.get(key, (0, 0)))
        for key in sorted(set(found) | set(kept))
        if kept.get(key, (0, 0)) != found.get(key, (0, 0))
    ]


def ledger_rows(engine: Engine, account_id: str | None = None) -> Iterator[dict[str, Any]]:
    """The ledger in entry order (one account's, or all), streamed: memory stays bounded
    whatever its length."""
    query = select(db.ledger).order_by(db.ledger.c.entry_id)
    if account_id is not None:
        query = query.where(db.ledger.c.account_id == account_id)
    with engine.connect() as conn:
        result = conn.execution_options(stream_results=True, yield_per=STREAM_ROWS).execute(query)
        for r in result.mappings():
            row = dict(r)
            row["usd"] = usd(int(row["tokens"]))
            row["created_at"] = row["created_at"].isoformat() if row["created_at"] else None
            yield {name: row[name] for name in LEDGER_COLUMNS}

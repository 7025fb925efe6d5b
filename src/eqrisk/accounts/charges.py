"""The charge transaction: several charges decided in one transaction, each as if alone, with
one commit (the per-process writer's group, `accounts/writer.py`), in plain SQL on the driver's
cursor, the same text on SQLite and PostgreSQL but for the placeholder and the row lock.

A COMMIT that fails on PostgreSQL may still have been applied (the answer was lost, not the
COMMIT): `charge_in` then raises `CommitUnknown` with the transaction's id, which the writer
settles before it answers anyone (`accounts/pg.py`). On SQLite the commit is a call into the
library in this process: it returns or raises with nothing lost in between, so a failed commit
is a transaction not applied (docs/decisions/outages.md says why).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.pool import PoolProxiedConnection


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


def month_of(when: datetime) -> str:
    """The usage month of a time: "YYYY-MM" in UTC."""
    return when.astimezone(UTC).strftime("%Y-%m")


class CommitUnknown(Exception):
    """The COMMIT of a charge transaction got no answer: transaction `xid` (of server process
    `pid`) may or may not have been applied; `results` are the outcomes it would have had."""

    def __init__(
        self, xid: str, pid: int | None, results: list[Charge], cause: BaseException
    ) -> None:
        super().__init__(f"the commit of transaction {xid} got no answer: {cause}")
        self.xid = xid
        self.pid = pid
        self.results = results


def charge_in(
    raw: PoolProxiedConnection,
    sql: Sql,
    requests: Sequence[ChargeRequest],
    now: datetime,
    pid: int | None = None,
) -> list[Charge]:
    """`_charge_all` in its own write transaction on a driver connection: SQLite's connections
    run in autocommit mode (db.py), so the write lock is taken by BEGIN IMMEDIATE; psycopg
    opens the transaction itself at the first statement. `pid`: the connection's server
    process (PostgreSQL), for `CommitUnknown`."""
    cursor = raw.cursor()
    try:
        if sql.begin:
            cursor.execute(sql.begin)
        results, xid = _charge_all(cursor, sql, requests, now)
    except BaseException:
        _rollback(raw)
        cursor.close()
        raise
    cursor.close()
    try:
        raw.commit()
    except BaseException as exc:
        _rollback(raw)
        # Nothing written (all refused), or SQLite: nothing in doubt. An error the server
        # sent (it has an SQLSTATE) is an answer: the transaction was rolled back.
        if xid is None or getattr(exc, "sqlstate", None) is not None:
            raise
        raise CommitUnknown(xid, pid, results, exc) from exc
    return results


def _rollback(raw: PoolProxiedConnection) -> None:
    """Roll back what can be; a connection that broke is invalidated by its owner anyway."""
    with contextlib.suppress(Exception):
        raw.rollback()


def _charge_all(
    cursor: Any, sql: Sql, requests: Sequence[ChargeRequest], now: datetime
) -> tuple[list[Charge], str | None]:
    """The charges of one transaction. The accounts' rows are read locked (FOR UPDATE on
    PostgreSQL, in sorted order so that two processes never deadlock; SQLite's write
    transaction already holds the database's lock), each charge is decided in order against
    the running balance, then each account is debited its total by one conditional UPDATE (the
    CHECK constraint and the `balance >= total` condition stay the last word), the ledger rows
    are inserted by one statement and the month's usage rows upserted by another.

    Plain SQL on the driver's cursor (the same text on SQLite and PostgreSQL but for the
    placeholder): this runs for every paid request, and building SQLAlchemy statements cost
    several times the database's own work here. Also returns the transaction's id where
    charges were written on PostgreSQL (None otherwise)."""
    ids = sorted({r.account_id for r in requests})
    cursor.execute(sql.locked(len(ids)), ids)
    state: dict[str, str] = {}
    balance: dict[str, int] = {}
    xid: str | None = None
    for account_id, account_state, tokens, txid in cursor.fetchall():
        state[account_id] = account_state
        balance[account_id] = int(tokens)
        xid = txid
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
        return results, None
    for account_id, total in debits.items():
        cursor.execute(sql.debit, (total, account_id, total))
        if cursor.rowcount != 1:  # the locked row changed under us: impossible, so stop
            raise RuntimeError(f"account {account_id} changed during its charge transaction")
    at = sql.stamp(now)
    cursor.execute(
        sql.ledger(len(accepted)),
        [
            value
            for r in accepted
            for value in (
                r.account_id,
                r.key_id,
                r.route,
                r.params_digest,
                -r.tokens,
                r.request_id,
                at,
            )
        ],
    )
    month = month_of(now)
    usage: dict[tuple[str, str], list[int]] = {}
    for r in accepted:
        totals = usage.setdefault((r.account_id, r.route), [0, 0])
        totals[0] += 1
        totals[1] += r.tokens
    cursor.execute(
        sql.usage(len(usage)),
        [value for (a, route), (c, t) in usage.items() for value in (a, month, route, c, t)],
    )
    return results, xid


@dataclass(frozen=True)
class Sql:
    """The hot path's statements (charges, `/api/balance`) in one dialect: the same text but for
    the placeholder (`?` for sqlite3, `%s` for psycopg) and PostgreSQL's row lock."""

    mark: str
    for_update: str
    xid: str  # the transaction's id as text (PostgreSQL), read with the locked rows
    begin: str  # what opens a write transaction ("" where the driver opens it)
    # SQLAlchemy keeps SQLite times as "YYYY-MM-DD HH:MM:SS.ffffff" text (UTC here);
    # PostgreSQL takes the aware datetime itself.
    text_times: bool

    def _list(self, n: int) -> str:
        return ", ".join([self.mark] * n)

    def locked(self, n: int) -> str:
        return (
            f"SELECT account_id, state, balance_tokens, {self.xid} FROM accounts "
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

    def ledger(self, n: int) -> str:
        """The ledger rows of `n` charges, one statement. (One multi-row statement, not an
        executemany: psycopg runs an executemany in pipeline mode, after which PostgreSQL did
        not end the transaction on `idle_in_transaction_session_timeout`, the bound on a
        COMMIT held up by a partition; see docs/decisions/outages.md.)"""
        row = f"({self.mark}, {self.mark}, 'charge', {self._list(5)})"
        return (
            "INSERT INTO ledger (account_id, key_id, kind, route, params_digest, tokens, "
            f"request_id, created_at) VALUES {', '.join([row] * n)}"
        )

    def usage(self, n: int) -> str:
        """The month's usage of `n` (account, route) pairs added, one statement."""
        row = f"({self._list(5)})"
        return (
            "INSERT INTO monthly_usage (account_id, month, route, requests, tokens) "
            f"VALUES {', '.join([row] * n)} ON CONFLICT (account_id, month, route) DO UPDATE SET "
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


SQL = {
    "sqlite": Sql("?", "", "NULL", "BEGIN IMMEDIATE", text_times=True),
    "postgresql": Sql("%s", " FOR UPDATE", "pg_current_xact_id()::text", "", text_times=False),
}

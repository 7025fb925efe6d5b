"""PostgreSQL specifics of the accounts: connections whose every round trip is bounded, and the
settlement of a charge transaction whose COMMIT got no answer (docs/decisions/outages.md).

A COMMIT without an answer (the connection died or timed out after the COMMIT was sent) may or
may not have been applied. `settle` finds out on a fresh connection: it first ends the old
session if it still holds the transaction (so the COMMIT can no longer arrive and apply later),
then asks the server for the transaction's status (`pg_xact_status`, exact, by its id). Where
no fresh connection can be made (a partition), `undo` is run later, once the database answers:
a transaction that did commit has its charges taken back (ledger rows deleted, balances and
usage restored) in one transaction; running it twice changes nothing.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any, Literal

import psycopg
from psycopg.errors import _WaitTimeout
from sqlalchemy.pool import PoolProxiedConnection

from eqrisk.accounts.charges import month_of

Outcome = Literal["committed", "aborted"]
TERMINATE_WAIT_MS = 2000  # how long pg_terminate_backend waits for the old session to end


class BoundedConnection(psycopg.Connection[Any]):
    """A psycopg connection whose every wait on the server (statement, fetch, commit) ends after
    `io_timeout_s`: then the connection is closed (its state is unknown) and the call raises
    psycopg's OperationalError. The server's statement_timeout bounds slow statements; this
    bounds the silence of a server that never got, or never answered, the bytes."""

    io_timeout_s: float | None = None

    @classmethod
    def connect_bounded(cls, io_s: float, *args: Any, **kwargs: Any) -> BoundedConnection:
        conn = cls.connect(*args, **kwargs)
        conn.io_timeout_s = io_s
        return conn

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        if timeout is not None or self.io_timeout_s is None:
            return super().wait(gen, interval=interval, timeout=timeout)
        try:
            return super().wait(gen, interval=interval, timeout=self.io_timeout_s)
        except _WaitTimeout:
            self.pgconn.finish()  # half a protocol exchange: the connection is unusable
            raise psycopg.OperationalError(
                f"no answer from the database in {self.io_timeout_s:g} s; connection closed"
            ) from None


def backend_pid(raw: PoolProxiedConnection) -> int | None:
    """The server process of a pooled PostgreSQL connection (None when it cannot be read)."""
    driver = raw.driver_connection
    try:
        return int(driver.info.backend_pid) if driver is not None else None
    except Exception:
        return None


def settle(raw: PoolProxiedConnection, xid: str, pid: int | None) -> Outcome:
    """Whether transaction `xid` (of server process `pid`) committed, asked on `raw`, a
    connection other than the one that lost the COMMIT's answer; commits `raw`'s own work."""
    cursor = raw.cursor()
    try:
        if pid is not None:
            # Ends the old session only while it still holds this very transaction (a pid alone
            # may by now belong to another session). After this the COMMIT cannot apply late.
            cursor.execute(
                "SELECT pg_terminate_backend(pid, %s) FROM pg_stat_activity "
                "WHERE pid = %s AND backend_xid = (%s::xid8)::xid",
                (TERMINATE_WAIT_MS, pid, xid),
            )
            cursor.fetchall()
        cursor.execute("SELECT pg_xact_status(%s::xid8)", (xid,))
        row = cursor.fetchone()
        raw.commit()
    finally:
        cursor.close()
    status = row[0] if row else None
    if status == "in progress":  # the session outlived the terminate wait: not settled yet
        raise psycopg.OperationalError(f"transaction {xid} is still in progress")
    return "committed" if status == "committed" else "aborted"  # NULL: never got that far


def undo(raw: PoolProxiedConnection, xid: str, pid: int | None) -> int:
    """Take back the charges of transaction `xid` if it committed (its requests were answered
    with an error): delete its ledger rows, give their tokens back, take them off the month's
    usage; all in one transaction. Returns the number of charges taken back (0 when it did not
    commit, or when they were already taken back)."""
    if settle(raw, xid, pid) != "committed":
        return 0
    cursor = raw.cursor()
    try:
        # Rows of one transaction carry its id in `xmin`: exactly that group's charges.
        cursor.execute(
            "DELETE FROM ledger WHERE xmin = (%s::xid8)::xid AND kind = 'charge' "
            "RETURNING account_id, route, tokens, created_at",
            (xid,),
        )
        rows: list[tuple[str, str | None, int, datetime]] = list(cursor.fetchall())
        refund: dict[str, int] = defaultdict(int)
        usage: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0])
        for account_id, route, tokens, created_at in rows:
            refund[account_id] -= tokens  # charges are negative
            totals = usage[(account_id, month_of(created_at), route or "")]
            totals[0] += 1
            totals[1] -= tokens
        for account_id in sorted(refund):  # the order every charge locks accounts in
            cursor.execute(
                "UPDATE accounts SET balance_tokens = balance_tokens + %s WHERE account_id = %s",
                (refund[account_id], account_id),
            )
        for (account_id, month, route), (n, tokens) in sorted(usage.items()):
            cursor.execute(
                "UPDATE monthly_usage SET requests = requests - %s, tokens = tokens - %s "
                "WHERE account_id = %s AND month = %s AND route = %s",
                (n, tokens, account_id, month, route),
            )
        raw.commit()
    except BaseException:
        raw.rollback()
        raise
    finally:
        cursor.close()
    return len(rows)

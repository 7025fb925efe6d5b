"""WAL checkpoints off the commit path (issue 9, accounts/checkpoint.py): the charge writer's
connection never checkpoints, a thread beside it does, and the WAL file starts over instead of
growing under sustained charges."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from eqrisk.accounts import db
from eqrisk.accounts.book import Accounts, ChargeRequest
from eqrisk.accounts.checkpoint import Checkpointer, wal_checkpoint
from eqrisk.accounts.writer import SQLITE_AUTOCHECKPOINT, ChargeWriter

PAGE = 4096


def _funded(accounts: Accounts, credit: int) -> tuple[str, str]:
    account_id = accounts.create_account("wal")["account_id"]
    accounts.verify_card(account_id, provider="tests")
    accounts.credit(account_id, credit, "tests")
    return account_id, accounts.create_key(account_id)["key_id"]


def _sustained(home: Path, n_charges: int, checkpoint_s: float) -> tuple[ChargeWriter, int]:
    """16 requests at a time charge `n_charges` times through a charge writer, the writer
    committing all along; returns the writer and the WAL file's size at the end."""
    accounts = Accounts(db.make_engine(home))
    account_id, key_id = _funded(accounts, 10**9)
    start = accounts.balance(account_id)
    writer = ChargeWriter(accounts, idle_s=0.3, checkpoint_s=checkpoint_s)

    async def worker(k: int) -> list[bool]:
        done = []
        for n in range(k, n_charges, 16):
            request = ChargeRequest(account_id, 3, key_id, "metrics", "d" * 64, f"r-{n}")
            done.append((await writer.charge(request)).ok)
            await asyncio.sleep(0.001)  # a busy server's pace, not a loop that only charges
        return done

    async def load() -> list[bool]:
        return [ok for part in await asyncio.gather(*(worker(k) for k in range(16))) for ok in part]

    assert asyncio.run(load()) == [True] * n_charges
    size = (home / "accounts.db-wal").stat().st_size
    assert accounts.balance(account_id) == start - 3 * n_charges
    assert len(accounts.ledger(account_id)) == n_charges + 2  # the grant and the credit
    return writer, size


def test_the_wal_starts_over_under_sustained_charges(tmp_path: Path) -> None:
    """The same sustained charges twice: with the checkpointer the WAL file ends a fraction of
    the size it reaches when nothing checkpoints (the writer's own automatic checkpoint is off
    in both: there every page of every group stays in the WAL), and it is reused from its
    start again and again rather than growing."""
    n_charges = 24_000
    writer, size = _sustained(tmp_path / "checkpointed", n_charges, checkpoint_s=0.02)
    _, unchecked = _sustained(tmp_path / "unchecked", n_charges, checkpoint_s=3600)
    checkpointer = writer.checkpointer
    assert checkpointer is not None
    assert checkpointer.converged + checkpointer.finishes >= 5  # started over, many times
    assert unchecked > writer.groups * 3 * PAGE  # >= 3 pages a group: account, ledger, usage
    assert size < unchecked / 4, (size, unchecked, checkpointer.max_frames)


def test_the_writer_connection_does_not_checkpoint_and_is_given_back_as_it_came(
    tmp_path: Path,
) -> None:
    accounts = Accounts(db.make_engine(tmp_path))
    account_id, key_id = _funded(accounts, 1000)
    start = accounts.balance(account_id)
    writer = ChargeWriter(accounts, idle_s=0.1, checkpoint_s=60)
    conn = writer._connect()
    assert conn is not None
    cursor = conn.cursor()
    cursor.execute("PRAGMA wal_autocheckpoint")
    assert cursor.fetchone()[0] == 0
    cursor.close()
    writer._release(conn)
    with accounts.engine.connect() as again:  # the pool's one connection, given back
        raw = again.connection.dbapi_connection
        assert raw is not None
        value = raw.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
    assert value == SQLITE_AUTOCHECKPOINT
    # A charge through the writer, then its thread stops on idle with a last checkpoint.
    asyncio.run(writer.charge(ChargeRequest(account_id, 5, key_id, "metrics", "", "r")))
    assert accounts.balance(account_id) == start - 5


def test_a_round_copies_the_wal_into_the_database(tmp_path: Path) -> None:
    """A round with nothing committing beside it: everything reaches the database file, and
    a reader that ignores the WAL (the file alone, copied) sees the charges."""
    accounts = Accounts(db.make_engine(tmp_path))
    account_id, key_id = _funded(accounts, 1000)
    start = accounts.balance(account_id)
    raw = accounts.write_connection()
    cursor = raw.cursor()
    cursor.execute("PRAGMA wal_autocheckpoint=0")
    requests = [ChargeRequest(account_id, 1, key_id, "metrics", "", f"r-{n}") for n in range(50)]
    assert all(c.ok for c in accounts.charge_many(requests, conn=raw))
    _busy, log, done = wal_checkpoint(cursor, "PASSIVE")  # nothing forced yet: just counts
    assert log > 0 and done == log  # this connection's own pass copied all of it
    more = [ChargeRequest(account_id, 1, key_id, "metrics", "", f"s-{n}") for n in range(50)]
    assert all(c.ok for c in accounts.charge_many(more, conn=raw))
    checkpointer = Checkpointer(accounts.engine, every_s=60)
    own = accounts.engine.raw_connection()
    checkpointer.checkpoint(own.cursor())
    own.close()
    assert checkpointer.converged == 1 and checkpointer.restarts == 0
    cursor.close()
    raw.close()
    copy = tmp_path / "copy.db"
    copy.write_bytes((tmp_path / "accounts.db").read_bytes())  # the main file, no WAL
    with sqlite3.connect(copy) as alone:
        (balance,) = alone.execute(
            "SELECT balance_tokens FROM accounts WHERE account_id = ?", (account_id,)
        ).fetchone()
    assert balance == start - 100

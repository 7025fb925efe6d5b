"""Charges in doubt left by a process that died (accounts/doubt.py): the next charge writer that
starts takes the journal over and takes back the charges of a recorded transaction that had
committed, on the real PostgreSQL; doing it twice changes nothing."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from pathlib import Path

from eqrisk.accounts.book import Accounts, ChargeRequest
from eqrisk.accounts.charges import SQL, _charge_all
from eqrisk.accounts.db import make_engine
from eqrisk.accounts.doubt import Doubt, InDoubt
from eqrisk.accounts.writer import ChargeWriter


def _committed_group(accounts: Accounts, account_id: str, key_id: str) -> str:
    """Three charges committed in one transaction, as a writer's group; its id."""
    requests = [
        ChargeRequest(account_id, 100, key_id, "metrics", "d", f"lost-{n}") for n in range(3)
    ]
    raw = accounts.engine.raw_connection()
    try:
        cursor = raw.cursor()
        results, xid = _charge_all(cursor, SQL["postgresql"], requests, datetime.now(UTC))
        raw.commit()
    finally:
        raw.close()
    assert all(r.ok for r in results) and xid is not None
    return xid


def test_a_journal_left_behind_is_settled_by_the_next_writer(
    pg_database_url: str, tmp_path: Path
) -> None:
    accounts = Accounts(make_engine(tmp_path, pg_database_url))
    account_id = accounts.create_account("doubt")["account_id"]
    accounts.verify_card(account_id, provider="tests")
    key_id = accounts.create_key(account_id)["key_id"]
    start = accounts.balance(account_id)
    xid = _committed_group(accounts, account_id, key_id)
    assert accounts.balance(account_id) == start - 300
    # The process that answered these three 503 died before it could take them back.
    journal = tmp_path / "charges-in-doubt"
    InDoubt(journal).add(Doubt(xid, None, ("lost-0", "lost-1", "lost-2")))
    assert json.loads((journal / f"{xid}.json").read_text())["xid"] == xid

    writer = ChargeWriter(accounts, idle_s=0.5, journal=journal)
    ok = asyncio.run(writer.charge(ChargeRequest(account_id, 7, key_id, "metrics", "d", "next")))
    assert ok.ok
    deadline = time.monotonic() + 10
    while list(journal.glob("*.json")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not list(journal.glob("*.json"))
    assert writer.taken_back == 3
    kept = [e["request_id"] for e in accounts.ledger(account_id) if e["kind"] == "charge"]
    assert kept == ["next"]
    assert accounts.balance(account_id) == start - 7
    assert accounts.month_usage_rows() == accounts.ledger_month_totals()
    # Settled again (another worker had adopted the same file): nothing more changes.
    assert accounts.undo(xid, None) == 0
    assert accounts.balance(account_id) == start - 7

"""`eqrisk accounts export` and `eqrisk accounts reconcile` on SQLite and PostgreSQL, over real
accounts (grants, credits, charges), with one account's balance deliberately broken. The exported
ledger is summed independently (pandas) and compared with the balances the book reports."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import uuid
from decimal import Decimal
from pathlib import Path

import pandas as pd
import pytest
from sqlalchemy import select, update

from eqrisk.accounts import db
from eqrisk.accounts.book import STARTING_CREDIT_TOKENS, Accounts
from eqrisk.accounts.db import make_engine

BROKEN_BY = 777  # tokens added to one balance without a ledger row


def _eqrisk(home: Path, url: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EQRISK_")}
    env["EQRISK_HOME"] = str(home)
    if url:
        env["EQRISK_DATABASE_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "eqrisk.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=home,
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def book(
    request: pytest.FixtureRequest, tmp_path: Path
) -> tuple[Path, str | None, Accounts, dict[str, int]]:
    """Three accounts with grants, credits and charges; returns (home, url, book, expected
    balance of each account in tokens, computed here by adding what was done)."""
    url = request.getfixturevalue("pg_database_url") if request.param == "postgresql" else None
    accounts = Accounts(make_engine(tmp_path, url))
    expected: dict[str, int] = {}
    for n, (credit, charges) in enumerate([(1000, [250, 250, 5]), (0, [17]), (50_000, [])]):
        account_id = accounts.create_account(f"holder {n} {uuid.uuid4().hex[:6]}")["account_id"]
        accounts.verify_card(account_id, provider="tests")
        key_id = accounts.create_key(account_id)["key_id"]
        if credit:
            accounts.credit(account_id, credit, "top-up")
        for k, tokens in enumerate(charges):
            charge = accounts.charge(
                account_id,
                tokens,
                key_id=key_id,
                route="betas",
                params_digest="d" * 64,
                request_id=f"req-{n}-{k}",
            )
            assert charge.ok
        expected[account_id] = STARTING_CREDIT_TOKENS + credit - sum(charges)
    return tmp_path, url, accounts, expected


def test_reconcile_passes_then_names_the_broken_account(book) -> None:  # type: ignore[no-untyped-def]
    home, url, accounts, expected = book
    ok = _eqrisk(home, url, "accounts", "reconcile", "--json")
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert doc["ok"] is True and doc["differences"] == []
    assert doc["accounts"] == len(accounts.list_accounts()) >= len(expected)

    broken = sorted(expected)[1]
    with accounts.engine.begin() as conn:
        conn.execute(
            update(db.accounts)
            .where(db.accounts.c.account_id == broken)
            .values(balance_tokens=db.accounts.c.balance_tokens + BROKEN_BY)
        )
    bad = _eqrisk(home, url, "accounts", "reconcile")
    assert bad.returncode == 1
    assert f"{broken} (+{BROKEN_BY} tokens)" in bad.stderr
    assert "1 of" in bad.stderr and all(a not in bad.stderr for a in expected if a != broken)
    assert broken in bad.stdout and "0.01554" in bad.stdout  # 777 tokens in USD
    as_json = json.loads(_eqrisk(home, url, "accounts", "reconcile", "--json").stdout)
    (diff,) = as_json["differences"]
    assert diff["account_id"] == broken and diff["difference_tokens"] == BROKEN_BY
    assert diff["balance_tokens"] == expected[broken] + BROKEN_BY
    assert diff["expected_tokens"] == expected[broken]


def test_export_ledger_and_balances_add_up(book) -> None:  # type: ignore[no-untyped-def]
    home, url, accounts, expected = book
    proc = _eqrisk(home, url, "accounts", "export", "ledger")
    assert proc.returncode == 0, proc.stderr
    ledger = pd.read_csv(io.StringIO(proc.stdout), dtype={"usd": str})
    mine = ledger[ledger["account_id"].isin(list(expected))]
    assert mine.groupby("account_id")["tokens"].sum().to_dict() == expected
    # USD is exact: tokens x 0.00002 in decimal.
    assert all(
        Decimal(u) == Decimal(int(t)) * Decimal("0.00002")
        for u, t in zip(mine["usd"], mine["tokens"], strict=True)
    )
    assert set(mine["kind"]) == {"grant", "credit", "charge"}
    assert list(ledger["entry_id"]) == sorted(ledger["entry_id"])
    assert len(mine) == sum(len(accounts.ledger(a)) for a in expected)

    as_json = json.loads(
        _eqrisk(home, url, "accounts", "export", "ledger", "--format", "json").stdout
    )
    assert pd.DataFrame(as_json)["tokens"].sum() == ledger["tokens"].sum()

    balances = json.loads(
        _eqrisk(home, url, "accounts", "export", "balances", "--format", "json").stdout
    )
    by_id = {b["account_id"]: b for b in balances}
    for account_id, tokens in expected.items():
        b = by_id[account_id]
        assert b["balance_tokens"] == tokens == b["credits_tokens"] - b["charges_tokens"]
        assert b["ledger_rows"] == len(accounts.ledger(account_id))
        assert Decimal(b["balance_usd"]) == tokens * Decimal("0.00002")
    one = sorted(expected)[0]
    only = _eqrisk(home, url, "accounts", "export", "balances", "--account", one)
    rows = pd.read_csv(io.StringIO(only.stdout))
    assert list(rows["account_id"]) == [one] and int(rows["balance_tokens"][0]) == expected[one]
    assert _eqrisk(home, url, "accounts", "export", "nothing").returncode == 2


def test_reconcile_finds_a_charge_and_its_balance_edited_together(book) -> None:  # type: ignore[no-untyped-def]
    """A charge row made smaller and the balance raised by as much: balance = credits -
    charges still holds, but the month's usage (written by the charge itself) no longer equals
    the ledger's charges: reconcile exits 1 naming the account and month."""

    home, url, accounts, expected = book
    edited = sorted(a for a in expected if expected[a] == STARTING_CREDIT_TOKENS + 1000 - 505)[0]
    entry = next(r for r in accounts.ledger(edited) if r["kind"] == "charge")
    month = entry["created_at"].strftime("%Y-%m")
    row = db.ledger.c.entry_id == entry["entry_id"]
    with accounts.engine.begin() as conn:
        tokens = conn.execute(select(db.ledger.c.tokens).where(row)).scalar_one()
        conn.execute(update(db.ledger).where(row).values(tokens=-100))
        conn.execute(
            update(db.accounts)
            .where(db.accounts.c.account_id == edited)
            .values(balance_tokens=db.accounts.c.balance_tokens + 150)
        )
    try:
        _reconcile_names_the_edit(home, url, accounts, expected, edited, month)
    finally:  # the session's database is shared: later tests compare usage and ledger whole
        with accounts.engine.begin() as conn:
            conn.execute(update(db.ledger).where(row).values(tokens=tokens))
            conn.execute(
                update(db.accounts)
                .where(db.accounts.c.account_id == edited)
                .values(balance_tokens=db.accounts.c.balance_tokens - 150)
            )


def _reconcile_names_the_edit(  # type: ignore[no-untyped-def]
    home, url, accounts, expected, edited: str, month: str
) -> None:
    from eqrisk.accounts.audit import differences, usage_differences

    assert [d for d in differences(accounts.engine) if d.account_id in expected] == []
    found = [u for u in usage_differences(accounts.engine) if u.account_id in expected]
    assert [u.row() for u in found] == [
        {
            "account_id": edited,
            "month": month,
            "route": "betas",
            "usage_requests": 3,
            "usage_tokens": 505,
            "ledger_requests": 3,
            "ledger_tokens": 355,
        }
    ]
    bad = _eqrisk(home, url, "accounts", "reconcile")
    assert bad.returncode == 1
    assert f"monthly usage differs from the ledger's charges for {edited} {month}" in bad.stderr
    doc = json.loads(_eqrisk(home, url, "accounts", "reconcile", "--json").stdout)
    assert doc["ok"] is False
    assert [d for d in doc["differences"] if d["account_id"] in expected] == []
    assert [u for u in doc["usage_differences"] if u["account_id"] == edited] == [found[0].row()]

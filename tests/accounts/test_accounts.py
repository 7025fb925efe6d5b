"""Accounts, keys, the ledger and card verification, on the embedded SQLite database and on the
real PostgreSQL server of the machine (127.0.0.1:5432, database created per test run)."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import text

from eqrisk.accounts import db
from eqrisk.accounts.book import STARTING_CREDIT_TOKENS, AccountError, Accounts, hash_key
from eqrisk.accounts.payments import OperatorProvider, WebhookError, sign, verify
from eqrisk.accounts.pricing import DEFAULT_PRICES, PriceTable, tokens_to_usd, usd_to_tokens


@pytest.fixture(params=["sqlite", "postgresql"])
def accounts(request, tmp_path: Path) -> Accounts:
    if request.param == "sqlite":
        return Accounts(db.make_engine(tmp_path))
    url = request.getfixturevalue("pg_database_url")
    engine = db.make_engine(tmp_path, url)
    with engine.begin() as conn:
        for table in reversed(db.metadata.sorted_tables):
            conn.execute(table.delete())
    return Accounts(engine)


def test_prices_are_exact_whole_tokens() -> None:
    assert usd_to_tokens("0.005") == 250
    assert usd_to_tokens("20") == STARTING_CREDIT_TOKENS == 1_000_000
    assert tokens_to_usd(250) == 0.005
    with pytest.raises(ValueError, match="whole number of tokens"):
        usd_to_tokens("0.000001")
    batch = DEFAULT_PRICES["batch/analyze"]
    assert batch.cost(3) == usd_to_tokens("0.01")  # the minimum
    assert batch.cost(10) == usd_to_tokens("0.02")
    assert batch.cost(0) == 0
    assert DEFAULT_PRICES["l3-decomposition"].cost() == 500
    assert DEFAULT_PRICES["tickers"].cost() == 0


def test_price_table_override(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"metrics": {"usd": 0.5}}))
    table = PriceTable.load(path)
    assert table["metrics"].tokens == 25_000 and table["heatmap"].tokens == 250
    path.write_text(json.dumps({"nope": {"usd": 1}}))
    with pytest.raises(ValueError, match="unknown route 'nope'"):
        PriceTable.load(path)


def test_life_cycle_grants_the_starting_credit_exactly_once(accounts: Accounts) -> None:
    acc = accounts.create_account("Ada", "ada@example.org")
    account_id = acc["account_id"]
    assert acc["state"] == "created" and acc["balance_tokens"] == 0
    assert OperatorProvider(accounts).confirm_card(account_id, "chk_1") is True
    assert OperatorProvider(accounts).confirm_card(account_id, "chk_2") is False
    assert accounts.balance(account_id) == STARTING_CREDIT_TOKENS
    grants = [e for e in accounts.ledger(account_id) if e["kind"] == "grant"]
    assert len(grants) == 1 and grants[0]["tokens"] == STARTING_CREDIT_TOKENS
    accounts.set_state(account_id, "suspended")
    assert accounts.get_account(account_id)["state"] == "suspended"
    with pytest.raises(AccountError, match="suspended"):
        accounts.verify_card(account_id, provider="operator")
    accounts.set_state(account_id, "verified")  # reinstated: no second grant
    assert accounts.balance(account_id) == STARTING_CREDIT_TOKENS
    other = accounts.create_account("Bob")["account_id"]
    with pytest.raises(AccountError, match="no verified card"):
        accounts.set_state(other, "verified")


def test_keys_are_shown_once_stored_hashed_and_revocable(accounts: Accounts) -> None:
    account_id = accounts.create_account("Cy")["account_id"]
    created = accounts.create_key(account_id, label="laptop", rate_limit="10/minute")
    key = created["key"]
    assert key.startswith(f"eqk_{created['key_id']}_") and len(key) > 50
    listed = accounts.list_keys(account_id)
    assert len(listed) == 1 and "key" not in listed[0] and "key_hash" not in listed[0]
    with accounts.engine.connect() as conn:
        stored = conn.execute(text("SELECT key_hash FROM api_keys")).scalar_one()
    assert stored == hash_key(key) and key not in stored
    record = accounts.authenticate(key)
    assert (
        record is not None and record.account_id == account_id and record.rate_limit == "10/minute"
    )
    assert accounts.authenticate(key[:-1] + ("x" if key[-1] != "x" else "y")) is None
    assert accounts.authenticate("eqk_nope_secret") is None
    accounts.revoke_key(created["key_id"])
    assert accounts.authenticate(key) is None
    with pytest.raises(AccountError, match="no active key"):
        accounts.revoke_key(created["key_id"])


def test_demo_key_is_well_known_and_rotates(accounts: Accounts) -> None:
    accounts.ensure_demo_key("demo-one")
    accounts.ensure_demo_key("demo-one")  # idempotent
    record = accounts.authenticate("demo-one")
    assert record is not None and record.is_demo and record.rate_limit == "5/minute"
    accounts.ensure_demo_key("demo-two")
    assert accounts.authenticate("demo-one") is None
    assert accounts.authenticate("demo-two").is_demo


def test_concurrent_charges_never_overspend(accounts: Accounts) -> None:
    account_id = accounts.create_account("Dee")["account_id"]
    accounts.verify_card(account_id, provider="operator")
    key_id = accounts.create_key(account_id)["key_id"]
    cost = STARTING_CREDIT_TOKENS // 40  # affordable exactly 40 times

    def attempt(n: int) -> bool:
        return accounts.charge(
            account_id, cost, key_id=key_id, route="metrics", params_digest="d", request_id=str(n)
        ).ok

    with ThreadPoolExecutor(max_workers=12) as pool:
        results = list(pool.map(attempt, range(100)))
    assert sum(results) == 40
    assert accounts.balance(account_id) == 0
    charges = [e for e in accounts.ledger(account_id) if e["kind"] == "charge"]
    assert len(charges) == 40
    assert -sum(e["tokens"] for e in charges) == STARTING_CREDIT_TOKENS
    usage = accounts.usage(account_id, since=accounts.ledger(account_id)[0]["created_at"])
    assert usage["requests"] == 40 and usage["tokens"] == STARTING_CREDIT_TOKENS


def test_unverified_accounts_cannot_be_charged(accounts: Accounts) -> None:
    account_id = accounts.create_account("Eve")["account_id"]
    accounts.credit(account_id, 1000, "goodwill")
    result = accounts.charge(
        account_id, 250, key_id="k", route="metrics", params_digest="", request_id=""
    )
    assert not result.ok and result.balance_tokens == 1000


def test_webhook_signature_timestamp_and_replay(accounts: Accounts) -> None:
    secret = "whsec_test"
    account_id = accounts.create_account("Fay")["account_id"]
    body = json.dumps(
        {"event_id": "evt_1", "type": "card.verified", "account_id": account_id}
    ).encode()
    now = int(time.time())
    event = verify(secret, sign(secret, body, now), body, now=now)
    with pytest.raises(WebhookError, match="does not match"):
        verify(secret, sign("other", body, now), body, now=now)
    with pytest.raises(WebhookError, match="does not match"):
        verify(secret, sign(secret, body, now), body + b" ", now=now)
    with pytest.raises(WebhookError, match="300s"):
        verify(secret, sign(secret, body, now - 301), body, now=now)
    with pytest.raises(WebhookError, match="missing"):
        verify(secret, None, body)
    assert accounts.apply_card_event(event["event_id"], account_id, provider="webhook") is True
    assert accounts.apply_card_event(event["event_id"], account_id, provider="webhook") is None
    assert accounts.balance(account_id) == STARTING_CREDIT_TOKENS


def test_workers_starting_together_make_one_demo_key(accounts: Accounts) -> None:
    """Every server worker runs ensure_demo_key at start-up, at the same moment."""
    url = accounts.engine.url
    home = Path(url.database).parent if url.drivername == "sqlite" else Path("/nonexistent")
    database_url = None if url.drivername == "sqlite" else url.render_as_string(False)

    def start_worker(_: int) -> None:
        Accounts(db.make_engine(home, database_url)).ensure_demo_key("demo-race")

    with ThreadPoolExecutor(max_workers=6) as pool:
        list(pool.map(start_worker, range(6)))
    active = [k for k in accounts.list_keys("demo") if k["revoked_at"] is None]
    assert len(active) == 1
    assert accounts.authenticate("demo-race").is_demo

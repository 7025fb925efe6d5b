"""Self-service accounts on Stripe, end to end: the official `stripe` SDK and `eqrisk serve` talk
to localstripe (a local server speaking Stripe's API and signing its webhooks, started here on a
free port; tests/api/stripe_stand_in.py). Sign-up to a first paid call, the card verified only by
the signed event, one starting credit per card, the key shown once, a top-up credited once."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from eqrisk.accounts.book import STARTING_CREDIT_TOKENS, AccountError
from eqrisk.accounts.db import key_expiry
from helpers import Server, assert_problem, bearer, client_for, free_port
from stripe_local import (
    PUBLISHABLE_KEY,
    WEBHOOK_SECRET,
    card,
    pay,
    stripe_env,
    stripe_settings,
    wait_for,
)

stripe = pytest.importorskip("stripe")


def signed(body: bytes, secret: str = WEBHOOK_SECRET, at: int | None = None) -> dict[str, str]:
    """Stripe's signature header, computed here from its documented scheme."""
    stamp = int(time.time()) if at is None else at
    mac = hmac.new(secret.encode(), f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
    return {"Stripe-Signature": f"t={stamp},v1={mac}", "Content-Type": "application/json"}


def sign_up(client: Any, name: str = "Ada", email: str = "ada@example.com") -> dict[str, Any]:
    resp = client.post("/api/signup", json={"name": name, "email": email})
    assert resp.status_code == 201, resp.text
    return dict(resp.json())


def test_sign_up_to_a_paid_call_and_a_top_up_through_stripes_signed_events(
    home: Path, stripe_base: str, sdk: Any
) -> None:
    with Server(home, **stripe_env(stripe_base)) as server:
        httpx.post(
            f"{stripe_base}/_config/webhooks/eqrisk",
            json={"url": f"{server.base}/api/webhooks/stripe", "secret": WEBHOOK_SECRET},
        ).raise_for_status()
        client = httpx.Client(base_url=server.base, timeout=30)
        options = client.get("/api/signup/options").json()
        assert options["self_service"] is True and options["publishable_key"] == PUBLISHABLE_KEY

        first = sign_up(client)
        token = first["claim_token"]
        # Before Stripe's event the account is unverified: the claim waits (202), no key.
        pending = client.post("/api/signup/claim", json={"claim_token": token})
        assert pending.status_code == 202 and pending.json()["state"] == "pending"
        setup = first["setup_client_secret"].split("_secret_")[0]
        payment_method = card(sdk)
        sdk.v1.setup_intents.confirm(setup, params={"payment_method": payment_method})

        def claimed() -> dict[str, Any] | None:
            resp = client.post("/api/signup/claim", json={"claim_token": token})
            return resp.json() if resp.status_code == 200 else None

        got = wait_for(claimed, message=server.log)
        key = got["key"]
        assert got["balance_tokens"] == STARTING_CREDIT_TOKENS and got["note"] is None
        assert key not in server.log()
        # Shown once.
        assert_problem(
            client.post("/api/signup/claim", json={"claim_token": token}), 404, "NOT_FOUND"
        )
        paid = client.get("/api/metrics/NVDA", headers=bearer(key))
        assert paid.status_code == 200, paid.text
        cost = int(paid.headers["X-Tokens-Consumed"])
        assert cost > 0
        balance = client.get("/api/balance", headers=bearer(key)).json()
        assert balance["balance_tokens"] == STARTING_CREDIT_TOKENS - cost

        # The same card on a second account: verified, no credit, and it says why.
        second = sign_up(client, "Ada again", "ada2@example.com")
        other = second["setup_client_secret"].split("_secret_")[0]
        sdk.v1.setup_intents.confirm(other, params={"payment_method": card(sdk)})
        token2 = second["claim_token"]
        again = wait_for(
            lambda: (
                r.json()
                if (r := client.post("/api/signup/claim", json={"claim_token": token2})).status_code
                == 200
                else None
            )
        )
        assert again["balance_tokens"] == 0 and "another account" in again["note"]

        # A top-up of 10 USD: a PaymentIntent, confirmed on Stripe's side, credited by its event.
        top = client.post("/api/account/topup", json={"amount_usd": 10}, headers=bearer(key))
        assert top.status_code == 201, top.text
        intent = top.json()["payment_intent"]
        pay(sdk, intent)
        want = STARTING_CREDIT_TOKENS - cost + 10 * 100 * 500
        wait_for(
            lambda: client.get("/api/balance", headers=bearer(key)).json()["balance_tokens"] == want
        )
        ledger = client.get("/api/account/ledger", headers=bearer(key))
        assert ledger.headers["content-type"].startswith("text/csv")
        lines = ledger.text.strip().splitlines()
        receipts = [line for line in lines if ",topup," in line]
        assert len(receipts) == 1 and intent in receipts[0] and ",500000," in receipts[0]
        client.close()


# ------------------------------------------------------------------------------ in process


def setup_event(
    event_id: str, account_id: str, setup: str, payment_method: str, kind: str = "succeeded"
) -> bytes:
    """A `setup_intent.*` event as Stripe sends it (the fields eqrisk reads)."""
    status = "succeeded" if kind == "succeeded" else "requires_payment_method"
    obj = {
        "id": setup,
        "object": "setup_intent",
        "status": status,
        "payment_method": payment_method,
        "metadata": {"account_id": account_id},
    }
    event = {
        "id": event_id,
        "object": "event",
        "type": f"setup_intent.{kind}",
        "created": int(time.time()),
        "data": {"object": obj},
    }
    return json.dumps(event).encode()


def payment_event(event_id: str, intent: str, cents: int) -> bytes:
    obj = {
        "id": intent,
        "object": "payment_intent",
        "status": "succeeded",
        "amount": cents,
        "amount_received": cents,
    }
    event = {
        "id": event_id,
        "object": "event",
        "type": "payment_intent.succeeded",
        "created": int(time.time()),
        "data": {"object": obj},
    }
    return json.dumps(event).encode()


def hook(client: Any, body: bytes, **sign: Any) -> Any:
    return client.post("/api/webhooks/stripe", content=body, headers=signed(body, **sign))


def verified_key(client: Any, sdk: Any, name: str = "Ada") -> tuple[str, str]:
    """(account id, first key) of a sign-up verified by a signed event for a new card."""
    up = sign_up(client, name, f"{name.lower()}@example.com")
    setup = up["setup_client_secret"].split("_secret_")[0]
    number = f"4000{secrets.randbelow(10**12):012d}"  # a card of its own
    resp = hook(client, setup_event(f"evt_{name}", up["account_id"], setup, card(sdk, number)))
    assert resp.status_code == 200, resp.text
    claimed = client.post("/api/signup/claim", json={"claim_token": up["claim_token"]})
    assert claimed.status_code == 200, claimed.text
    return up["account_id"], claimed.json()["key"]


def test_forged_stale_replayed_and_out_of_order_events_grant_nothing_more(
    home: Path, stripe_base: str, sdk: Any
) -> None:
    with client_for(home, **stripe_settings(stripe_base)) as client:
        accounts = client.app.state.accounts
        up = sign_up(client)
        account_id = up["account_id"]
        setup = up["setup_client_secret"].split("_secret_")[0]
        method = card(sdk)
        body = setup_event("evt_1", account_id, setup, method)
        # Forged: another secret, no header, the body altered after signing, a stale stamp.
        assert_problem(hook(client, body, secret="whsec_guess"), 400, "WEBHOOK_REJECTED")
        bare = client.post("/api/webhooks/stripe", content=body)
        assert_problem(bare, 400, "WEBHOOK_REJECTED")
        headers = signed(body)
        altered = body.replace(b"evt_1", b"evt_2")
        resp = client.post("/api/webhooks/stripe", content=altered, headers=headers)
        assert_problem(resp, 400, "WEBHOOK_REJECTED")
        stale = hook(client, body, at=int(time.time()) - 3600)
        assert_problem(stale, 400, "WEBHOOK_REJECTED")
        # The browser's word is worth nothing: still unverified, the claim waits.
        assert accounts.get_account(account_id)["state"] == "created"
        claim = {"claim_token": up["claim_token"]}
        assert client.post("/api/signup/claim", json=claim).status_code == 202
        # Out of order: another setup than the sign-up's does nothing.
        other = setup_event("evt_0", account_id, "seti_not_this_one", method)
        assert hook(client, other).json()["outcome"].startswith("ignored")
        assert accounts.get_account(account_id)["state"] == "created"
        # The genuine event verifies and credits; replayed, it does nothing more.
        first = hook(client, body)
        assert first.json()["outcome"] == "verified, starting credit granted"
        assert hook(client, body).json()["outcome"].startswith("ignored")
        late_failure = setup_event("evt_3", account_id, setup, method, kind="setup_failed")
        assert hook(client, late_failure).json()["outcome"].startswith("ignored")
        assert accounts.get_account(account_id)["state"] == "verified"
        assert accounts.balance(account_id) == STARTING_CREDIT_TOKENS
        grants = [e for e in accounts.ledger(account_id) if e["kind"] == "grant"]
        assert [g["tokens"] for g in grants] == [STARTING_CREDIT_TOKENS]
        key = client.post("/api/signup/claim", json=claim).json()["key"]
        assert client.get("/api/balance", headers=bearer(key)).json()["state"] == "verified"
        # How it was verified, for the operator.
        how = client.app.state.self_service.book.how_verified()[account_id]
        assert how == {"provider": "stripe", "reference": setup, "note": None}
    listed = subprocess.run(
        [sys.executable, "-m", "eqrisk.cli", "accounts", "list", "--json"],
        env={**os.environ, "EQRISK_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    rows = {r["account_id"]: r for r in json.loads(listed.stdout)}
    assert rows[account_id]["verified_by"] == how
    assert rows["demo"]["verified_by"] is None


def test_a_top_up_is_credited_once_whatever_the_events(
    home: Path, stripe_base: str, sdk: Any
) -> None:
    with client_for(home, **stripe_settings(stripe_base)) as client:
        accounts = client.app.state.accounts
        account_id, key = verified_key(client, sdk)
        refused = client.post("/api/account/topup", json={"amount_usd": 7}, headers=bearer(key))
        assert_problem(refused, 400, "INVALID_PARAMETER")
        top = client.post("/api/account/topup", json={"amount_usd": 25}, headers=bearer(key))
        intent = top.json()["payment_intent"]
        # Unknown intent, wrong amount: nothing.
        assert hook(client, payment_event("evt_p0", "pi_unknown", 2500)).json()["outcome"] == (
            "ignored: seen before, or no top-up"
        )
        assert (
            hook(client, payment_event("evt_p1", intent, 100))
            .json()["outcome"]
            .startswith("ignored")
        )
        # Duplicated (two event ids for one payment) and replayed: credited once.
        outcomes = [
            hook(client, payment_event(event_id, intent, 2500)).json()["outcome"]
            for event_id in ("evt_p2", "evt_p3", "evt_p2")
        ]
        assert outcomes.count("top-up credited") == 1
        assert accounts.balance(account_id) == STARTING_CREDIT_TOKENS + 2500 * 500
        credits = [e for e in accounts.ledger(account_id) if e["kind"] == "credit"]
        assert [(c["route"], c["tokens"], c["request_id"]) for c in credits] == [
            ("topup", 2500 * 500, intent)
        ]


def test_sign_ups_are_limited_per_address_and_expire(home: Path, stripe_base: str) -> None:
    settings = {**stripe_settings(stripe_base), "signups_per_hour": 2}
    with client_for(home, **settings) as client:
        first = sign_up(client, "One", "one@example.com")
        sign_up(client, "Two", "two@example.com")
        third = client.post("/api/signup", json={"name": "Three", "email": "three@example.com"})
        assert "2 sign-ups an hour" in assert_problem(third, 429, "RATE_LIMIT_EXCEEDED")["detail"]
        bad = client.post("/api/signup", json={"name": "X", "email": "not an email"})
        assert_problem(bad, 400, "INVALID_PARAMETER")
        book = client.app.state.self_service.book
        assert book.expire(datetime.now(UTC) + timedelta(days=2)) == 2
        gone = client.post("/api/signup/claim", json={"claim_token": first["claim_token"]})
        assert_problem(gone, 404, "NOT_FOUND")
        with pytest.raises(AccountError):
            client.app.state.accounts.get_account(first["account_id"])


def test_without_stripe_the_operator_creates_accounts(home: Path) -> None:
    with client_for(home) as client:
        options = client.get("/api/signup/options").json()
        assert options["self_service"] is False and "operator" in options["message"]
        resp = client.post("/api/signup", json={"name": "Ada", "email": "ada@example.com"})
        assert "eqrisk accounts create" in assert_problem(resp, 404, "NOT_FOUND")["detail"]
        assert_problem(client.post("/api/webhooks/stripe", content=b"{}"), 404, "NOT_FOUND")


def test_the_account_manages_its_keys_and_reads_its_usage(
    home: Path, stripe_base: str, sdk: Any
) -> None:
    with client_for(home, **stripe_settings(stripe_base)) as client:
        account_id, key = verified_key(client, sdk)
        for _ in range(2):
            assert client.get("/api/metrics/NVDA", headers=bearer(key)).status_code == 200
        usage = client.get("/api/account/usage?days=7", headers=bearer(key)).json()
        ledger = client.app.state.accounts.ledger(account_id)
        charged = [e for e in ledger if e["kind"] == "charge"]
        assert [(r["route"], r["requests"], r["tokens"]) for r in usage["by_day"]] == [
            ("metrics", 2, -sum(e["tokens"] for e in charged))
        ]
        made = client.post(
            "/api/account/keys", json={"action": "create", "label": "ci"}, headers=bearer(key)
        ).json()
        rotated = client.post(
            "/api/account/keys",
            json={"action": "rotate", "key_id": made["key_id"]},
            headers=bearer(key),
        ).json()
        assert client.get("/api/balance", headers=bearer(rotated["key"])).status_code == 200
        assert_problem(
            client.get("/api/balance", headers=bearer(made["key"])), 401, "INVALID_API_KEY"
        )
        keys = client.get("/api/account/keys", headers=bearer(key)).json()["keys"]
        labels = {k["key_id"]: (k["label"], k["revoked_at"] is None) for k in keys}
        assert labels[made["key_id"]] == ("ci", False)
        assert labels[rotated["key_id"]] == ("ci", True)
        # An optional expiry: in the future only; past it, the key is refused.
        past = client.post(
            "/api/account/keys",
            json={"action": "create", "expires_at": "2020-01-01T00:00:00Z"},
            headers=bearer(key),
        )
        assert_problem(past, 400, "INVALID_PARAMETER")
        soon = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
        dated = client.post(
            "/api/account/keys",
            json={"action": "create", "label": "dated", "expires_at": soon},
            headers=bearer(key),
        ).json()
        listed = client.get("/api/account/keys", headers=bearer(key)).json()["keys"]
        assert [k["expires_at"] for k in listed if k["key_id"] == dated["key_id"]] == [soon]
        with client.app.state.accounts.engine.begin() as conn:
            conn.execute(
                update(key_expiry)
                .where(key_expiry.c.key_id == dated["key_id"])
                .values(expires_at=datetime.now(UTC) - timedelta(seconds=1))
            )
        expired = client.get("/api/balance", headers=bearer(dated["key"]))
        assert_problem(expired, 401, "INVALID_API_KEY")
        # Another account's key is not this account's to revoke; the demo key manages nothing.
        _, stranger = verified_key(client, sdk, "Bob")
        stranger_id = client.get("/api/balance", headers=bearer(stranger)).json()["key_id"]
        resp = client.post(
            "/api/account/keys",
            json={"action": "revoke", "key_id": stranger_id},
            headers=bearer(key),
        )
        assert_problem(resp, 400, "INVALID_PARAMETER")
        demo = client.get("/api/account/keys", headers=bearer("eqrisk-demo"))
        assert_problem(demo, 403, "DEMO_RESTRICTED")


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The accounts database's setting: SQLite under the home, or the machine's PostgreSQL."""
    if request.param == "sqlite":
        return {}
    return {"database_url": request.getfixturevalue("pg_database_url")}


def test_calls_during_top_ups_keep_balance_equal_to_credits_minus_charges(
    home: Path, stripe_base: str, sdk: Any, database: dict[str, Any]
) -> None:
    """Paid calls and top-up events (each delivered twice) at once, as concurrent requests on
    one server: every top-up is credited once, every 200 is one charge, and the balance is
    exactly the ledger's sum."""
    with client_for(home, **stripe_settings(stripe_base), **database) as client:
        accounts = client.app.state.accounts
        account_id, key = verified_key(client, sdk, f"Concurrent{secrets.token_hex(3)}")
        intents = []
        for _ in range(3):
            top = client.post("/api/account/topup", json={"amount_usd": 10}, headers=bearer(key))
            intents.append(top.json()["payment_intent"])
        events = [
            payment_event(f"evt_{intent}_{copy}", intent, 1000)
            for intent in intents
            for copy in range(2)
        ]

        def call(n: int) -> int:
            if n % 7 == 0 and events:
                return -hook(client, events.pop()).status_code
            return int(client.get("/api/metrics/NVDA", headers=bearer(key)).status_code)

        with ThreadPoolExecutor(max_workers=8) as pool:
            statuses = list(pool.map(call, range(42)))
        assert statuses.count(-200) == 6 and statuses.count(200) == 36
        ledger = accounts.ledger(account_id)
        credits = [e for e in ledger if e["kind"] == "credit"]
        charges = [e for e in ledger if e["kind"] == "charge"]
        assert sorted(c["request_id"] for c in credits) == sorted(intents)
        assert len(charges) == 36
        balance = accounts.balance(account_id)
        assert balance == sum(e["tokens"] for e in ledger)
        assert balance == STARTING_CREDIT_TOKENS + 3 * 1000 * 500 + sum(
            e["tokens"] for e in charges
        )


def test_stripes_secrets_are_masked_in_the_config() -> None:
    from eqrisk.settings import Settings

    settings = Settings(
        _env_file=None,
        stripe_secret_key="sk_test_abc",
        stripe_publishable_key="pk_test_abc",
        stripe_webhook_secret="whsec_abc",
        topup_amounts_usd=(50, 10, 10),
    )
    shown = settings.masked()
    assert shown["stripe_secret_key"] == shown["stripe_webhook_secret"] == "**********"
    assert shown["stripe_publishable_key"] == "pk_test_abc"  # public by design
    assert settings.stripe_enabled and settings.topup_amounts_usd == (10, 50)
    assert not Settings(_env_file=None, stripe_secret_key="sk_test_abc").stripe_enabled
    with pytest.raises(ValueError, match="top-up amounts"):
        Settings(_env_file=None, topup_amounts_usd=(0,))


def test_stripe_unreachable_is_a_503_and_leaves_no_usable_sign_up(home: Path) -> None:
    nowhere = stripe_settings(f"http://127.0.0.1:{free_port()}")
    with client_for(home, **nowhere) as client:
        resp = client.post("/api/signup", json={"name": "Ada", "email": "ada@example.com"})
        assert "Stripe" in assert_problem(resp, 503, "SERVICE_UNAVAILABLE")["detail"]
        assert resp.headers["Retry-After"] == "30"

"""The client's self-service methods (`client/account_methods.py`) against a real `eqrisk serve`
that talks to localstripe (tests/stripe_local.py), as tests/api/test_self_service.py does: a
sign-up and its claim with no key of one's own, then the account's usage, ledger, keys and a
top-up with its first key, through `Client` and `AsyncClient`."""

from __future__ import annotations

import asyncio
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest

from eqrisk.accounts.book import STARTING_CREDIT_TOKENS
from eqrisk.client import AsyncClient, Client, DemoRestricted, InvalidParameter, NotFound
from helpers import Server
from stripe_local import PUBLISHABLE_KEY, WEBHOOK_SECRET, card, pay, stripe_env, wait_for

pytest.importorskip("stripe")


def test_sign_up_claim_usage_keys_and_a_top_up_through_the_client(
    demo_home: Path, tmp_path: Path, stripe_base: str, sdk: Any
) -> None:
    home = tmp_path / "home"
    shutil.copytree(demo_home / "snapshots", home / "snapshots")
    with Server(home, **stripe_env(stripe_base)) as server:
        httpx.post(
            f"{stripe_base}/_config/webhooks/eqrisk",
            json={"url": f"{server.base}/api/webhooks/stripe", "secret": WEBHOOK_SECRET},
        ).raise_for_status()
        # No key of one's own yet: the open routes answer whatever key the client sends.
        with Client(server.base) as anyone:
            options = anyone.signup_options()
            assert options["self_service"] is True
            assert options["publishable_key"] == PUBLISHABLE_KEY
            up = anyone.signup("Ada", "ada@example.com")
            assert up["state"] == "created" and up["account_id"].startswith("acc_")
            token = up["claim_token"]
            assert anyone.signup_claim(token) == {
                "state": "pending",
                "account_id": up["account_id"],
            }
            # The card, confirmed on Stripe's side; its signed event verifies the account.
            setup = up["setup_client_secret"].split("_secret_")[0]
            sdk.v1.setup_intents.confirm(setup, params={"payment_method": card(sdk)})
            got = wait_for(
                lambda: (answer := anyone.signup_claim(token))["state"] != "pending" and answer,
                message=server.log,
            )
            assert got["state"] == "verified" and got["account_id"] == up["account_id"]
            assert got["balance_tokens"] == STARTING_CREDIT_TOKENS
            with pytest.raises(NotFound):  # the key is shown once
                anyone.signup_claim(token)
            # The demo key has no account of its own to manage.
            with pytest.raises(DemoRestricted):
                anyone.account_keys()

        key = got["key"]
        with Client(server.base, key) as mine:
            mine.metrics("NVDA")
            assert mine.last_call is not None and mine.last_call.tokens
            cost = mine.last_call.tokens
            usage = mine.account_usage(days=7)
            assert usage["account_id"] == up["account_id"]
            assert [(r["route"], r["requests"], r["tokens"]) for r in usage["by_day"]] == [
                ("metrics", 1, cost)
            ]
            ledger = mine.account_ledger()
            assert list(ledger["kind"]) == ["grant", "charge"]
            assert list(ledger["tokens"]) == [STARTING_CREDIT_TOKENS, -cost]
            assert pd.api.types.is_datetime64_any_dtype(ledger["created_at"])

            # Keys: create (with an expiry), list, rotate, revoke.
            soon = datetime.now(UTC) + timedelta(hours=1)
            made = mine.account_keys("create", label="ci", expires_at=soon)
            assert made["action"] == "create" and made["key"].startswith("eqk_")
            with Client(server.base, made["key"]) as ci:
                assert ci.balance()["key_id"] == made["key_id"]
            rotated = mine.account_keys("rotate", key_id=made["key_id"])
            assert rotated["revoked_key_id"] == made["key_id"]
            listed = {k["key_id"]: k for k in mine.account_keys()["keys"]}
            assert listed[made["key_id"]]["revoked_at"] is not None
            assert listed[rotated["key_id"]]["label"] == "ci"
            assert mine.account_keys("revoke", key_id=rotated["key_id"]) == {
                "action": "revoke",
                "key_id": rotated["key_id"],
            }
            with pytest.raises(InvalidParameter):  # no longer active
                mine.account_keys("revoke", key_id=rotated["key_id"])

            # A top-up: one of the server's amounts, paid on Stripe's side, credited by its event.
            with pytest.raises(InvalidParameter):
                mine.account_topup(7)
            top = mine.account_topup(10)
            assert top["amount_usd"] == 10 and top["payment_intent"].startswith("pi_")
            pay(sdk, top["payment_intent"])
            want = STARTING_CREDIT_TOKENS - cost + 10 * 100 * 500
            wait_for(lambda: mine.balance()["balance_tokens"] == want, message=server.log)

            # The async client: the same methods, the same answers.
            async def read() -> tuple[dict[str, Any], dict[str, Any], pd.DataFrame]:
                async with AsyncClient(server.base, key) as aio:
                    return (
                        await aio.account_usage(days=7),
                        await aio.account_keys(),
                        await aio.account_ledger(),
                    )

            aio_usage, aio_keys, aio_ledger = asyncio.run(read())
            assert aio_usage == mine.account_usage(days=7)
            assert aio_keys == mine.account_keys()
            pd.testing.assert_frame_equal(aio_ledger, mine.account_ledger())
            assert list(aio_ledger["kind"]) == ["grant", "charge", "credit"]

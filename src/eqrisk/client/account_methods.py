"""The methods of `Client` and `AsyncClient` for self-service accounts
(docs/decisions/accounts-self-service.md): the sign-up's options, a sign-up and its claim (open
routes: no key needed), and the account's own routes with one of its keys: usage, the ledger,
its keys and a top-up. Each method builds its call, defined once for both clients
(`bind.method`). A card is verified, and a top-up paid, on Stripe's side
(Stripe.js on the page `/signup` or `/account`): the client only starts them."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import httpx
import pandas as pd

from eqrisk.client.bind import method
from eqrisk.client.calls import Call
from eqrisk.client.frames import frame_of

KeyAction = Literal["create", "revoke", "rotate"]


def _dict(response: httpx.Response) -> dict[str, Any]:
    return dict(response.json())


def _ledger(response: httpx.Response) -> pd.DataFrame:
    return frame_of(response, "created_at")


class AccountMethods:
    """Mixed into `Client` and `AsyncClient` (module doc)."""

    @method
    def signup_options() -> Call[dict[str, Any]]:
        """GET /api/signup/options: whether this server signs accounts up itself (`self_service`),
        Stripe's publishable key, the starting credit and the top-up amounts (no key needed)."""
        return Call("GET", "/api/signup/options", _dict)

    @method
    def signup(name: str, email: str) -> Call[dict[str, Any]]:
        """POST /api/signup: an unverified account, the SetupIntent's `setup_client_secret` to
        confirm the card with Stripe.js, and the one-time `claim_token` (no key needed; NotFound
        where the operator creates accounts)."""
        return Call("POST", "/api/signup", _dict, body={"name": name, "email": email})

    @method
    def signup_claim(claim_token: str) -> Call[dict[str, Any]]:
        """POST /api/signup/claim: `{state: "pending"}` until Stripe's signed event verified the
        card, then the first `key`, once (NotFound after that or for an unknown token)."""
        return Call("POST", "/api/signup/claim", _dict, body={"claim_token": claim_token})

    @method
    def account_usage(days: int | None = None) -> Call[dict[str, Any]]:
        """GET /api/account/usage: the account's charges by UTC day and route over the last `days`
        (default 30; free)."""
        return Call("GET", "/api/account/usage", _dict, {"days": days})

    @method
    def account_ledger() -> Call[pd.DataFrame]:
        """GET /api/account/ledger: the account's ledger, one row per entry (free)."""
        return Call("GET", "/api/account/ledger", _ledger)

    @method
    def account_keys(
        action: KeyAction | None = None,
        *,
        key_id: str | None = None,
        label: str | None = None,
        expires_at: datetime | str | None = None,
    ) -> Call[dict[str, Any]]:
        """The account's keys: without `action`, GET /api/account/keys lists them; with one,
        POST /api/account/keys creates a key (`label`, `expires_at`: aware, in the future), or
        revokes or rotates `key_id` (free; a new key is in the answer's `key`, once)."""
        if action is None:
            return Call("GET", "/api/account/keys", _dict)
        when = expires_at.isoformat() if isinstance(expires_at, datetime) else expires_at
        given = {"key_id": key_id, "label": label, "expires_at": when}
        body = {"action": action, **{k: v for k, v in given.items() if v is not None}}
        return Call("POST", "/api/account/keys", _dict, body=body)

    @method
    def account_topup(amount_usd: int) -> Call[dict[str, Any]]:
        """POST /api/account/topup: a Stripe PaymentIntent for one of the server's amounts (its
        `client_secret` to pay with Stripe.js); the balance is credited by Stripe's signed event."""
        return Call("POST", "/api/account/topup", _dict, body={"amount_usd": amount_usd})

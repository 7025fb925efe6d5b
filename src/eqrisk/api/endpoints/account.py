"""Service B routes about money: the caller's balance and usage (`GET /api/balance`, free), and
the payment provider's signed webhook that confirms a card, granting the starting credit once
(`POST /api/webhooks/payment`, no key)."""

# No `from __future__ import annotations`: FastAPI reads these annotations at runtime.

from datetime import UTC, datetime
from typing import Any

import anyio
from fastapi import Request
from pydantic import BaseModel, Field
from starlette.responses import Response

from eqrisk.accounts.book import AccountError, Accounts, month_of
from eqrisk.accounts.payments import SIGNATURE_HEADER, WebhookError, verify
from eqrisk.accounts.pricing import TOKEN_USD, tokens_to_usd
from eqrisk.api.body import decode_json
from eqrisk.api.deps import RiskCaller
from eqrisk.api.endpoint import Doc, Endpoint, open_route
from eqrisk.api.errors import ApiError, problem_responses
from eqrisk.api.formats import json_response

TAG = "Service B: account"


class Usage(BaseModel):
    requests: int
    tokens: int
    usd: float
    by_route: dict[str, dict[str, int]]


class BalanceResponse(BaseModel):
    account_id: str
    key_id: str
    is_demo: bool
    state: str = Field(description="created, verified or suspended.")
    balance_usd: float
    balance_tokens: int
    token_usd: float = Field(description="USD value of one token.")
    usage_this_month: Usage
    period_start: datetime


class WebhookResponse(BaseModel):
    event_id: str
    account_id: str
    starting_credit_granted: bool


async def balance(request: Request, caller: RiskCaller) -> Response:
    accounts: Accounts = request.app.state.accounts
    now = datetime.now(UTC)
    since = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)

    # The account's row and this month's few usage rows, one read: the same cost whatever the
    # size of the ledger.
    # Through the database's guard: unavailable, it is a 503 (api/outages.py).
    def read() -> dict[str, Any]:
        with accounts.backend.guard():
            return accounts.account_month(caller.account_id, month_of(since))

    account = read() if accounts.reads_inline else await anyio.to_thread.run_sync(read)
    usage = account["usage"]
    return json_response(
        {
            "account_id": caller.account_id,
            "key_id": caller.key_id,
            "is_demo": caller.is_demo,
            "state": account["state"],
            "balance_usd": tokens_to_usd(account["balance_tokens"]),
            "balance_tokens": account["balance_tokens"],
            "token_usd": float(TOKEN_USD),
            "usage_this_month": {**usage, "usd": tokens_to_usd(usage["tokens"])},
            "period_start": since.isoformat(),
        }
    )


def _decode(body: bytes) -> Any:
    """The webhook's body by the one body parser (its refusal is the webhook's)."""
    try:
        return decode_json(body)
    except ApiError as exc:
        raise ValueError(exc.detail) from None


async def payment_webhook(request: Request) -> Response:
    settings = request.app.state.settings
    if settings.webhook_secret is None:
        raise ApiError("NOT_FOUND", "the payment webhook is not configured on this server")
    body = await request.body()
    try:
        event = verify(
            settings.webhook_secret.get_secret_value(),
            request.headers.get(SIGNATURE_HEADER),
            body,
            tolerance_s=settings.webhook_tolerance_s,
            decode=_decode,
        )
    except WebhookError as exc:
        raise ApiError("WEBHOOK_REJECTED", str(exc)) from exc
    accounts: Accounts = request.app.state.accounts
    try:

        def apply() -> bool | None:
            with accounts.backend.guard():
                return accounts.apply_card_event(
                    event["event_id"],
                    event["account_id"],
                    provider="webhook",
                    reference=event.get("reference"),
                )

        granted = await anyio.to_thread.run_sync(apply)
    except AccountError as exc:
        raise ApiError("WEBHOOK_REJECTED", str(exc)) from exc
    if granted is None:
        raise ApiError(
            "WEBHOOK_REPLAY", f"event {event['event_id']} was already processed; nothing done"
        )
    return json_response(
        {
            "event_id": event["event_id"],
            "account_id": event["account_id"],
            "starting_credit_granted": granted,
        }
    )


BALANCE: Endpoint[Any, Any] = Endpoint(
    path="/api/balance",
    service="risk",
    price_key="balance",
    handler=balance,
    doc=Doc(
        tag=TAG,
        summary="The caller's balance and this month's usage (free)",
        response_model=BalanceResponse,
        responses=problem_responses(401, 403, 429, 500),
    ),
)

PAYMENT_WEBHOOK = open_route(
    "/api/webhooks/payment",
    payment_webhook,
    Doc(
        tag=TAG,
        summary="Payment provider: a card was verified (signed; no API key)",
        description=(
            'Body: JSON `{event_id, type: "card.verified", account_id, reference?}`. Header '
            f'`{SIGNATURE_HEADER}: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + raw '
            "body)>`. A bad signature, a timestamp outside the tolerance or a replayed event is "
            "refused and grants nothing."
        ),
        response_model=WebhookResponse,
        responses=problem_responses(400, 404, 409, 500),
    ),
)

"""The account holder's own routes, with one of its keys (free, never for the demo key): usage by
day and route (`GET /api/account/usage`), the ledger as CSV (`GET /api/account/ledger`), its
keys (`GET /api/account/keys`; `POST /api/account/keys`: create, revoke, rotate), and a top-up
through a Stripe PaymentIntent (`POST /api/account/topup`), credited only by Stripe's signed
`payment_intent.succeeded` (api/endpoints/signup.py)."""

# No `from __future__ import annotations`: FastAPI and pydantic read these annotations.

import csv
import io
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

import anyio
from fastapi import Request
from pydantic import AwareDatetime, Field
from starlette.responses import Response

from eqrisk.accounts.book import DEFAULT_RATE_LIMIT, AccountError, Accounts
from eqrisk.accounts.pricing import tokens_to_usd
from eqrisk.accounts.selfservice import SelfService
from eqrisk.accounts.stripe_gateway import ProviderError
from eqrisk.api.body import json_body, validate_body
from eqrisk.api.deps import RiskCaller
from eqrisk.api.endpoint import Doc, Endpoint
from eqrisk.api.endpoints.signup import provider_down, state_of, stripe_of
from eqrisk.api.errors import ApiError, problem_responses
from eqrisk.api.formats import json_response
from eqrisk.api.gate import Caller
from eqrisk.api.params import BodyParams, Params, query_of

TAG = "Service B: account"
PRICE_KEY = "account"
LEDGER_COLUMNS = (
    "entry_id",
    "created_at",
    "kind",
    "route",
    "tokens",
    "usd",
    "key_id",
    "request_id",
)


class UsageParams(Params):
    days: int = Field(default=30, ge=1, le=366, description="Days back from today (UTC).")


class KeysBody(BodyParams):
    action: Literal["create", "revoke", "rotate"] = Field(description="What to do.")
    key_id: str | None = Field(
        default=None, max_length=32, description="The key to revoke or rotate."
    )
    label: str | None = Field(default=None, max_length=200, description="A new key's name.")
    expires_at: AwareDatetime | None = Field(
        default=None, description="When a new key stops working (ISO 8601 with a time zone)."
    )


class TopupBody(BodyParams):
    amount_usd: int = Field(description="One of the server's top-up amounts (whole USD).")


def _own(caller: Caller) -> str:
    """The caller's account (the demo key manages nothing)."""
    if caller.is_demo:
        raise ApiError("DEMO_RESTRICTED", "the demo key has no account of its own to manage")
    return caller.account_id


def _accounts(request: Request) -> Accounts:
    result: Accounts = request.app.state.accounts
    return result


async def usage(
    request: Request,
    caller: RiskCaller,
    params: Annotated[UsageParams, query_of(UsageParams)],
) -> Response:
    account_id = _own(caller)
    book = state_of(request).book
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    since = today - timedelta(days=params.days - 1)

    def read() -> list[dict[str, Any]]:
        with book.accounts.backend.guard():
            return book.usage_by_day(account_id, since)

    rows = await anyio.to_thread.run_sync(read)
    return json_response(
        {
            "account_id": account_id,
            "since": since.date().isoformat(),
            "by_day": [{**r, "usd": tokens_to_usd(r["tokens"])} for r in rows],
        }
    )


async def ledger(request: Request, caller: RiskCaller) -> Response:
    account_id = _own(caller)
    accounts = _accounts(request)

    def read() -> list[dict[str, Any]]:
        with accounts.backend.guard():
            return accounts.ledger(account_id)

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(LEDGER_COLUMNS)
    for row in await anyio.to_thread.run_sync(read):
        created = row["created_at"]
        writer.writerow(
            [
                row["entry_id"],
                created.isoformat() if isinstance(created, datetime) else created,
                row["kind"],
                row["route"] or "",
                row["tokens"],
                f"{tokens_to_usd(int(row['tokens'])):.5f}",
                row["key_id"] or "",
                row["request_id"] or "",
            ]
        )
    return Response(
        out.getvalue(),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="ledger-{account_id}.csv"'},
    )


def _key_rows(book: SelfService, account_id: str) -> list[dict[str, Any]]:
    expiries = book.expiries(account_id)
    return [
        {
            "key_id": k["key_id"],
            "label": k["label"],
            "rate_limit": k["rate_limit"],
            "created_at": k["created_at"].isoformat(),
            "revoked_at": k["revoked_at"].isoformat() if k["revoked_at"] else None,
            "expires_at": expiries[k["key_id"]].isoformat() if k["key_id"] in expiries else None,
        }
        for k in book.accounts.list_keys(account_id)
    ]


async def list_keys(request: Request, caller: RiskCaller) -> Response:
    account_id = _own(caller)
    book = state_of(request).book

    def read() -> list[dict[str, Any]]:
        with book.accounts.backend.guard():
            return _key_rows(book, account_id)

    rows = await anyio.to_thread.run_sync(read)
    return json_response({"account_id": account_id, "keys": rows})


async def manage_keys(request: Request, caller: RiskCaller) -> Response:
    account_id = _own(caller)
    accounts = _accounts(request)
    body = validate_body(KeysBody, await json_body(request))
    book = state_of(request).book
    if body.expires_at is not None and body.expires_at <= datetime.now(UTC):
        raise ApiError(
            "INVALID_PARAMETER", "expires_at must be in the future", parameters=["expires_at"]
        )

    def made_key(label: str | None, rate_limit: str = DEFAULT_RATE_LIMIT) -> dict[str, str]:
        made = accounts.create_key(account_id, label=label, rate_limit=rate_limit)
        if body.expires_at is not None:
            book.set_expiry(made["key_id"], body.expires_at)
        return made

    def act() -> dict[str, Any]:
        with accounts.backend.guard():
            if body.action == "create":
                made = made_key(body.label)
                return {"action": "create", "key": made["key"], "key_id": made["key_id"]}
            mine = {k["key_id"]: k for k in accounts.list_keys(account_id)}
            old = mine.get(body.key_id or "")
            if old is None or old["revoked_at"] is not None:
                raise ApiError(
                    "INVALID_PARAMETER",
                    f"no active key {body.key_id!r} on this account",
                    parameters=["key_id"],
                )
            if body.action == "revoke":
                accounts.revoke_key(old["key_id"])
                return {"action": "revoke", "key_id": old["key_id"]}
            made = made_key(body.label or old["label"], old["rate_limit"])
            accounts.revoke_key(old["key_id"])
            return {
                "action": "rotate",
                "revoked_key_id": old["key_id"],
                "key": made["key"],
                "key_id": made["key_id"],
            }

    try:
        done = await anyio.to_thread.run_sync(act)
    except AccountError as exc:
        raise ApiError("INVALID_PARAMETER", str(exc), parameters=["body"]) from None
    return json_response(done, headers={"Cache-Control": "no-store"})


async def topup(request: Request, caller: RiskCaller) -> Response:
    account_id = _own(caller)
    state = state_of(request)
    stripe = stripe_of(state)
    body = validate_body(TopupBody, await json_body(request))
    if body.amount_usd not in state.amounts_usd:
        raise ApiError(
            "INVALID_PARAMETER",
            f"amount_usd must be one of {', '.join(map(str, state.amounts_usd))}",
            parameters=["amount_usd"],
            accepted=list(state.amounts_usd),
        )
    cents = body.amount_usd * 100

    def begin() -> tuple[str, str]:
        intent = stripe.payment(account_id, cents)
        with state.book.accounts.backend.guard():
            state.book.open_topup(account_id, intent.id, cents)
        return intent.id, intent.client_secret

    try:
        payment_intent, client_secret = await anyio.to_thread.run_sync(begin)
    except ProviderError as exc:
        raise provider_down(exc) from None
    return json_response(
        {
            "payment_intent": payment_intent,
            "client_secret": client_secret,
            "amount_usd": body.amount_usd,
            "publishable_key": state.publishable_key,
            "next": "confirm the payment with Stripe.js; the credit follows Stripe's event",
        },
        status_code=201,
        headers={"Cache-Control": "no-store"},
    )


def _keyed(path: str, handler: Any, summary: str, method: Any = "GET") -> Endpoint[Any, Any]:
    return Endpoint(
        path=path,
        method=method,
        service="risk",
        price_key=PRICE_KEY,
        handler=handler,
        doc=Doc(
            tag=TAG, summary=summary, responses=problem_responses(400, 401, 403, 429, 500, 503)
        ),
    )


USAGE = _keyed("/api/account/usage", usage, "The account's charges by day and route (free)")
LEDGER = _keyed("/api/account/ledger", ledger, "The account's ledger as CSV (free)")
KEYS = _keyed("/api/account/keys", list_keys, "The account's keys (free)")
MANAGE_KEYS = _keyed(
    "/api/account/keys", manage_keys, "Create, revoke or rotate one of the account's keys", "POST"
)
TOPUP = _keyed(
    "/api/account/topup", topup, "Top up: a Stripe PaymentIntent for one of the amounts", "POST"
)

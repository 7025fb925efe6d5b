"""Self-service sign-up through Stripe (open routes, no key): the page's options
(`GET /api/signup/options`), a sign-up (`POST /api/signup`: an unverified account and a
SetupIntent whose client secret the page confirms with Stripe.js), the first key's one-time
claim (`POST /api/signup/claim`), and Stripe's signed webhook (`POST /api/webhooks/stripe`),
the only thing that verifies a card or credits a top-up (docs/decisions/accounts-self-service.md).
With no Stripe configured the options say so and a sign-up is a 404 that says the operator
creates accounts."""

# No `from __future__ import annotations`: FastAPI and pydantic read these annotations.

import logging
from dataclasses import dataclass
from typing import Any

import anyio
from fastapi import Request
from pydantic import Field
from starlette.responses import Response

from eqrisk.accounts.book import AccountError, Accounts
from eqrisk.accounts.selfservice import SelfService, SignupRefused
from eqrisk.accounts.stripe_gateway import (
    SIGNATURE_HEADER,
    EventRejected,
    ProviderError,
    StripeGateway,
)
from eqrisk.api.body import json_body, validate_body
from eqrisk.api.endpoint import Doc, open_route
from eqrisk.api.errors import ApiError, problem_responses
from eqrisk.api.formats import json_response
from eqrisk.api.params import BodyParams
from eqrisk.settings import Settings

log = logging.getLogger("eqrisk.api")
TAG = "Service B: sign-up"
OPERATOR_ONLY = (
    "self-service sign-up is off on this server: the operator creates accounts "
    "(eqrisk accounts create, eqrisk accounts verify, eqrisk keys create)"
)


@dataclass(frozen=True)
class SelfServiceState:
    """What the self-service routes use: the database steps and, if configured, Stripe."""

    book: SelfService
    stripe: StripeGateway | None
    publishable_key: str | None
    stripe_js: str
    amounts_usd: tuple[int, ...]
    starting_credit_usd: int


def self_service(accounts: Accounts, settings: Settings) -> SelfServiceState:
    """The server's self-service state from its settings (Stripe off unless all three of its
    settings are set)."""
    stripe = None
    if settings.stripe_enabled:
        assert settings.stripe_secret_key and settings.stripe_webhook_secret
        stripe = StripeGateway(
            settings.stripe_secret_key.get_secret_value(),
            settings.stripe_webhook_secret.get_secret_value(),
            api_base=settings.stripe_api_base,
            tolerance_s=settings.webhook_tolerance_s,
        )
    book = SelfService(
        accounts, per_hour=settings.signups_per_hour, expiry_s=settings.signup_expiry_s
    )
    return SelfServiceState(
        book,
        stripe,
        settings.stripe_publishable_key,
        settings.stripe_js_url,
        settings.topup_amounts_usd,
        settings.starting_credit_usd,
    )


def state_of(request: Request) -> SelfServiceState:
    result: SelfServiceState = request.app.state.self_service
    return result


def stripe_of(state: SelfServiceState) -> StripeGateway:
    if state.stripe is None:
        raise ApiError("NOT_FOUND", OPERATOR_ONLY)
    return state.stripe


def provider_down(exc: ProviderError) -> ApiError:
    log.warning("stripe: %s", exc)
    return ApiError("SERVICE_UNAVAILABLE", f"{exc}; try again", headers={"Retry-After": "30"})


class SignupBody(BodyParams):
    name: str = Field(min_length=1, max_length=200, description="Your name or your company's.")
    email: str = Field(
        min_length=3, max_length=320, pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$", description="Email."
    )


class ClaimBody(BodyParams):
    claim_token: str = Field(
        min_length=10, max_length=100, description="The token `POST /api/signup` returned."
    )


async def options(request: Request) -> Response:
    state = state_of(request)
    return json_response(
        {
            "self_service": state.stripe is not None,
            "message": None if state.stripe is not None else OPERATOR_ONLY,
            "publishable_key": state.publishable_key if state.stripe is not None else None,
            "stripe_js": state.stripe_js if state.stripe is not None else None,
            "starting_credit_usd": state.starting_credit_usd,
            "topup_amounts_usd": list(state.amounts_usd),
        }
    )


async def signup(request: Request) -> Response:
    state = state_of(request)
    stripe = stripe_of(state)
    body = validate_body(SignupBody, await json_body(request))
    address = request.client.host if request.client else "-"

    def begin() -> tuple[str, str, str]:
        with state.book.accounts.backend.guard():
            account_id, token = state.book.begin(body.name, body.email, address)
        intent = stripe.setup_card(account_id)
        state.book.attach_setup(account_id, intent.id)
        return account_id, token, intent.client_secret

    try:
        account_id, token, client_secret = await anyio.to_thread.run_sync(begin)
    except SignupRefused as exc:
        raise ApiError("RATE_LIMIT_EXCEEDED", str(exc), headers={"Retry-After": "3600"}) from None
    except ProviderError as exc:
        raise provider_down(exc) from None
    except AccountError as exc:
        raise ApiError("INVALID_PARAMETER", str(exc), parameters=["body"]) from None
    return json_response(
        {
            "account_id": account_id,
            "state": "created",
            "claim_token": token,
            "setup_client_secret": client_secret,
            "publishable_key": state.publishable_key,
            "next": "confirm the card with Stripe.js, then poll POST /api/signup/claim",
        },
        status_code=201,
        headers={"Cache-Control": "no-store"},
    )


async def claim(request: Request) -> Response:
    state = state_of(request)
    body = validate_body(ClaimBody, await json_body(request))

    def take() -> dict[str, Any]:
        with state.book.accounts.backend.guard():
            return state.book.claim(body.claim_token)

    try:
        found = await anyio.to_thread.run_sync(take)
    except AccountError as exc:
        raise ApiError("NOT_FOUND", str(exc)) from None
    status = 202 if found["state"] == "pending" else 200
    return json_response(found, status_code=status, headers={"Cache-Control": "no-store"})


def _apply(state: SelfServiceState, stripe: StripeGateway, event: dict[str, Any]) -> str:
    """Act on one verified event; what was done, in words (the answer and the log)."""
    kind, event_id = str(event.get("type")), str(event.get("id"))
    obj = (event.get("data") or {}).get("object") or {}
    account_id = str((obj.get("metadata") or {}).get("account_id") or "")
    if kind == "setup_intent.succeeded" and obj.get("status") == "succeeded" and account_id:
        fingerprint = stripe.fingerprint(str(obj.get("payment_method")))
        done = state.book.card_verified(event_id, account_id, str(obj.get("id")), fingerprint)
        if done is None:
            return "ignored: seen before, or not a current sign-up's setup"
        return "verified, starting credit granted" if done.credited else f"verified; {done.note}"
    if kind == "payment_intent.succeeded" and obj.get("status") == "succeeded":
        received = int(obj.get("amount_received") or obj.get("amount") or 0)
        balance = state.book.topup_paid(event_id, str(obj.get("id")), received)
        return "ignored: seen before, or no top-up" if balance is None else "top-up credited"
    return f"ignored: {kind} needs nothing"


async def stripe_webhook(request: Request) -> Response:
    state = state_of(request)
    stripe = stripe_of(state)
    body = await request.body()

    def handle() -> tuple[str, str]:
        event = stripe.event(body, request.headers.get(SIGNATURE_HEADER))
        with state.book.accounts.backend.guard():
            return str(event.get("id")), _apply(state, stripe, event)

    try:
        event_id, outcome = await anyio.to_thread.run_sync(handle)
    except EventRejected as exc:
        raise ApiError("WEBHOOK_REJECTED", str(exc)) from None
    except ProviderError as exc:  # Stripe retries the event later
        raise provider_down(exc) from None
    except AccountError as exc:
        raise ApiError("WEBHOOK_REJECTED", str(exc)) from None
    log.info("stripe event %s: %s", event_id, outcome)
    return json_response({"event_id": event_id, "outcome": outcome})


SIGNUP_OPTIONS = open_route(
    "/api/signup/options",
    options,
    Doc(tag=TAG, summary="Whether this server signs accounts up itself, and its offers"),
    method="GET",
)

SIGNUP = open_route(
    "/api/signup",
    signup,
    Doc(
        tag=TAG,
        summary="Sign up: an unverified account and a Stripe SetupIntent for its card",
        description=(
            "Body `{name, email}`. Answers the SetupIntent's client secret (the page confirms "
            "the card with Stripe.js) and a one-time claim token. The card is verified only by "
            "Stripe's signed event; then `POST /api/signup/claim` shows the first key, once. "
            "Limited per client address; 404 when the operator creates accounts."
        ),
        responses=problem_responses(400, 404, 429, 500, 503),
    ),
)

SIGNUP_CLAIM = open_route(
    "/api/signup/claim",
    claim,
    Doc(
        tag=TAG,
        summary="The sign-up's first key, shown once after the card is verified",
        description=(
            "Body `{claim_token}`. 202 `{state: pending}` until Stripe's event verified the "
            "card; then 200 with the key, once; 404 after that or for an unknown token."
        ),
        responses=problem_responses(400, 404, 500),
    ),
)

STRIPE_WEBHOOK = open_route(
    "/api/webhooks/stripe",
    stripe_webhook,
    Doc(
        tag=TAG,
        summary="Stripe's signed events (setup_intent.succeeded, payment_intent.succeeded)",
        description=(
            "`Stripe-Signature` is checked by Stripe's SDK against the webhook secret; each "
            "event id is acted on once (a duplicate answers 200 and does nothing)."
        ),
        responses=problem_responses(400, 404, 500, 503),
    ),
)

"""The gate in front of every keyed route of both services: key -> rate limit -> account state
and demo rules -> price -> route -> charge (2xx only) -> headers.

One ASGI middleware, so that the rules are the same for every route and no route can forget
them. The price of a call is `estimates.estimate(...)`, the very function `/api/estimate`
answers with, so an estimate always equals the charge. The charge is made when the route's
answer is known and before its first byte leaves: a 2xx is charged (atomically, never below
zero) or, if a concurrent request spent the credit first, replaced by a 402; anything else
(errors, 304) is free.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import anyio
import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from eqrisk.accounts.limits import RateLimiter
from eqrisk.accounts.pricing import PriceTable, tokens_to_usd
from eqrisk.accounts.service import Accounts, KeyRecord
from eqrisk.api.errors import ApiError, problem_body
from eqrisk.data.master import MAG7

DAILY_ROUTES = ("daily", "betas", "facts", "gross", "resids", "symbol_list")
OPEN_PATHS = ("/api/health", "/api/webhooks/payment")
DEMO_MAX_TOKENS = 250
DEMO_REFUSED_ROUTES = {"heatmap": "the heatmap covers the whole market"}


@dataclass(frozen=True)
class Caller:
    """Who is calling: the key's id (never the key), its account, and whether it is the demo key."""

    key_id: str
    account_id: str
    is_demo: bool
    account_state: str
    balance_tokens: int


def route_of(path: str) -> tuple[str, str] | None:
    """(service, price key) of a keyed route, or None for an open or unknown path."""
    if path in OPEN_PATHS:
        return None
    if path.startswith("/api/"):
        rest = path[len("/api/") :].strip("/")
        if rest.startswith("metrics/"):
            return "risk", "metrics"
        return ("risk", rest) if rest else None
    name = path.strip("/")
    return ("daily", name) if name in DAILY_ROUTES else None


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1").strip() or None
    return None


def presented_key(scope: Scope, service: str) -> str | None:
    """Service B: `Authorization: Bearer <key>` or `X-API-Key`; Service A: `apikey`."""
    if service == "daily":
        return _header(scope, b"apikey")
    auth = _header(scope, b"authorization")
    if auth:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return _header(scope, b"x-api-key")


def _tickers_in(params: dict[str, Any]) -> list[str]:
    found: list[str] = []
    for name in ("ticker", "etf"):
        value = params.get(name)
        if isinstance(value, str) and value.strip():
            found.append(value)
    if isinstance(params.get("symbols"), str):
        found.extend(params["symbols"].split(","))
    if isinstance(params.get("tickers"), list):
        found.extend(t for t in params["tickers"] if isinstance(t, str))
    return [t.strip().upper() for t in found if t.strip()]


class Gate:
    def __init__(
        self,
        app: ASGIApp,
        *,
        accounts: Accounts,
        limiter: RateLimiter,
        prices: PriceTable,
        estimate: Callable[[str, dict[str, Any]], dict[str, Any]],
        services: tuple[str, ...] = ("daily", "risk"),
    ) -> None:
        self.app = app
        self.services = services
        self.accounts = accounts
        self.limiter = limiter
        self.prices = prices
        self.estimate = estimate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = route_of(scope["path"])
        if route is None or route[0] not in self.services or route[1] not in self.prices.prices:
            await self.app(scope, receive, send)
            return
        service, price_key = route
        request_id = scope.get("state", {}).get("request_id")
        extra: dict[str, str] = {}
        try:
            key = presented_key(scope, service)
            if key is None:
                how = (
                    "in the 'apikey' header"
                    if service == "daily"
                    else "as 'Authorization: Bearer <key>' or 'X-API-Key: <key>'"
                )
                raise ApiError("AUTHENTICATION_REQUIRED", f"send your API key {how}")
            record: KeyRecord | None = await anyio.to_thread.run_sync(
                self.accounts.authenticate, key
            )
            if record is None:
                raise ApiError("INVALID_API_KEY", "the API key is unknown or revoked")
            if self.limiter.blocking:
                decision = await anyio.to_thread.run_sync(
                    self.limiter.hit, record.key_id, record.rate_limit
                )
            else:  # in-process counters: no I/O, no thread hop
                decision = self.limiter.hit(record.key_id, record.rate_limit)
            extra.update(decision.headers())
            if not decision.allowed:
                raise ApiError(
                    "RATE_LIMIT_EXCEEDED",
                    f"this key allows {record.rate_limit}; retry in {decision.retry_after}s",
                    headers={"Retry-After": str(decision.retry_after)},
                    limit=record.rate_limit,
                )
            if record.account_state == "suspended":
                raise ApiError("ACCOUNT_INACTIVE", "the account is suspended")
            body, receive = await _buffered(receive, scope)
            params = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
            if price_key == "metrics":
                params["ticker"] = scope["path"].rstrip("/").rsplit("/", 1)[-1]
            if scope["method"] == "POST" and body:
                try:
                    doc = orjson.loads(body)
                    if isinstance(doc, dict):
                        params.update(doc)
                except orjson.JSONDecodeError:
                    pass  # the route answers the malformed body with a 400
            tokens = self._tokens(service, price_key, params)
            if record.is_demo:
                _demo_rules(price_key, params, tokens)
                tokens = 0  # the demo key is not charged
            elif tokens > 0 and record.account_state != "verified":
                raise ApiError(
                    "ACCOUNT_INACTIVE",
                    "verify a payment card on this account to make metered requests "
                    "(it grants the 20 USD starting credit)",
                )
            elif tokens > record.balance_tokens:
                raise _short(tokens, record.balance_tokens)
        except ApiError as exc:
            await _send_problem(send, exc, request_id, extra)
            return
        caller = Caller(
            record.key_id,
            record.account_id,
            record.is_demo,
            record.account_state,
            record.balance_tokens,
        )
        scope.setdefault("state", {})["caller"] = caller
        digest = hashlib.sha256(
            scope["path"].encode() + scope.get("query_string", b"") + body
        ).hexdigest()
        await self._forward(
            scope, receive, send, caller, price_key, tokens, digest, request_id, extra
        )

    def _tokens(self, service: str, price_key: str, params: dict[str, Any]) -> int:
        price = self.prices[price_key]
        if service == "daily" or (price.tokens == 0 and price.minimum_tokens == 0):
            return price.cost(1)
        try:
            return int(self.estimate(price_key, params)["estimated_tokens"])
        except ApiError:
            return 0  # the route itself will refuse the call (and an error is free)

    async def _forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        caller: Caller,
        price_key: str,
        tokens: int,
        digest: str,
        request_id: str | None,
        extra: dict[str, str],
    ) -> None:
        swallow = False

        async def metered_send(message: Message) -> None:
            nonlocal swallow
            if swallow:
                return
            if message["type"] == "http.response.start":
                status = message["status"]
                charged = 0
                balance = caller.balance_tokens
                if 200 <= status < 300 and tokens > 0:
                    result = await anyio.to_thread.run_sync(
                        lambda: self.accounts.charge(
                            caller.account_id,
                            tokens,
                            key_id=caller.key_id,
                            route=price_key,
                            params_digest=digest,
                            request_id=request_id or "",
                        )
                    )
                    if not result.ok:
                        swallow = True
                        await _send_problem(
                            send, _short(tokens, result.balance_tokens), request_id, extra
                        )
                        return
                    charged, balance = tokens, result.balance_tokens
                headers = list(message.get("headers", []))
                for name, value in {
                    **extra,
                    "X-API-Cost-USD": _usd(charged),
                    "X-Tokens-Consumed": str(charged),
                    "X-Balance-Remaining-USD": _usd(0 if caller.is_demo else balance),
                }.items():
                    headers.append((name.lower().encode(), value.encode()))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, metered_send)


def _usd(tokens: int) -> str:
    return f"{tokens_to_usd(tokens):.5f}"


def _short(tokens: int, balance: int) -> ApiError:
    return ApiError(
        "INSUFFICIENT_BALANCE",
        f"this request costs {_usd(tokens)} USD and the balance is {_usd(balance)} USD",
        required_usd=tokens_to_usd(tokens),
        balance_usd=tokens_to_usd(balance),
    )


def _demo_rules(price_key: str, params: dict[str, Any], tokens: int) -> None:
    allowed = ", ".join(MAG7)
    if price_key in DEMO_REFUSED_ROUTES:
        raise ApiError(
            "DEMO_RESTRICTED",
            f"{DEMO_REFUSED_ROUTES[price_key]}; the demo key covers only {allowed}",
            allowed_tickers=list(MAG7),
        )
    outside = [t for t in _tickers_in(params) if t not in MAG7]
    if outside:
        raise ApiError(
            "DEMO_RESTRICTED",
            f"the demo key covers only {allowed}; not {', '.join(outside)}",
            allowed_tickers=list(MAG7),
        )
    if tokens > DEMO_MAX_TOKENS:
        raise ApiError(
            "DEMO_RESTRICTED",
            f"this request costs {tokens} tokens; the demo key allows at most "
            f"{DEMO_MAX_TOKENS} per request",
            tokens=tokens,
            max_tokens=DEMO_MAX_TOKENS,
        )


async def _buffered(receive: Receive, scope: Scope) -> tuple[bytes, Receive]:
    """Read the whole request body once and hand the route a receive that replays it."""
    if scope["method"] not in ("POST", "PUT", "PATCH"):
        return b"", receive
    chunks = []
    more = True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    body = b"".join(chunks)
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return body, replay


async def _send_problem(
    send: Send, exc: ApiError, request_id: str | None, extra: dict[str, str]
) -> None:
    body = problem_body(exc.code, exc.detail, request_id, **exc.context)
    headers = {**extra, **exc.headers, "content-type": "application/problem+json"}
    await send(
        {
            "type": "http.response.start",
            "status": exc.status,
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]
            + [(b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})

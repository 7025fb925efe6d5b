"""The gate in front of every keyed route of both services: key -> rate limit -> account state
and demo rules -> price -> route -> charge (2xx only) -> headers.

One ASGI middleware, so that the rules are the same for every route and no route can forget
them. The price of a call is `estimate.estimate(...)`, the very function `/api/estimate`
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

from eqrisk.accounts.backends import BackendUnavailable
from eqrisk.accounts.book import Accounts, Charge, ChargeRequest, KeyRecord
from eqrisk.accounts.key_cache import KeyCache
from eqrisk.accounts.limits import FailedKeys, RateLimiter
from eqrisk.accounts.pricing import PriceTable, tokens_to_usd
from eqrisk.accounts.writer import ChargeWriter
from eqrisk.api.bounds import read_body
from eqrisk.api.bounds import send_problem as _send_problem
from eqrisk.api.endpoints import Endpoint, find
from eqrisk.api.errors import ApiError
from eqrisk.api.outages import unavailable
from eqrisk.api.plans import CLASS_TWINS
from eqrisk.data.master import MAG7

DEMO_MAX_TOKENS = 250
MAX_REMEMBERED_PRICES = 4096  # distinct (call, snapshot) prices kept before the memo starts over
# Routes whose 200 answer to a GET is a function of the snapshot version, the path and the query
# string alone (not of the caller, nor of any other header): the gate keeps their answers per
# version and replays them instead of running the route again (`Replays`).
REPLAYED_ROUTES = frozenset({"metrics"})
MAX_REPLAYED = 8192  # answers kept for one version (a few kB each) before the memo starts over
# Routes the demo key may not call at all (route -> why). Empty today: the heatmap answers the demo
# key with its seven tickers only (api/routes/risk_metrics.py), so a first visit to the dashboard shows data.
DEMO_REFUSED_ROUTES: dict[str, str] = {}


@dataclass(frozen=True)
class Caller:
    """Who is calling: the key's id (never the key), its account, and whether it is the demo key."""

    key_id: str
    account_id: str
    is_demo: bool
    account_state: str
    balance_tokens: int


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


@dataclass(frozen=True)
class Replayed:
    """A route's 200 answer as it left the route: its headers (before the gate's) and body."""

    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes


class Replays:
    """The answers of `REPLAYED_ROUTES` per snapshot version, by (path, query string).

    A snapshot version never changes, so neither does such an answer: the route's dependency
    resolution, parameter models, document and rendering run once per version and call, not
    per request. Only the version being served is kept: the first request that sees a new
    version drops the old one's answers. An answer is filed under the version it says it is
    from (its `X-Model-Version`), so one rendered as the version changed cannot be replayed as
    the other's. Keys, limits, prices and the charge are the gate's as for any call; only the
    route's work is skipped."""

    def __init__(self, max_items: int = MAX_REPLAYED) -> None:
        self.max_items = max_items
        self._version = ""
        self._items: dict[tuple[str, bytes], Replayed] = {}
        self.hits = 0

    def get(self, version: str, path: str, query: bytes) -> Replayed | None:
        if version != self._version:
            return None
        hit = self._items.get((path, query))
        if hit is not None:
            self.hits += 1
        return hit

    def put(self, version: str, path: str, query: bytes, answer: Replayed) -> None:
        if version != self._version:
            self._version, self._items = version, {}
        if len(self._items) >= self.max_items:
            self._items.clear()
        self._items[(path, query)] = answer


class _Recorder:
    """What a route sends, kept when it is a whole 200 (a start and its body messages)."""

    __slots__ = ("body", "headers", "ok")

    def __init__(self) -> None:
        self.ok = False
        self.headers: tuple[tuple[bytes, bytes], ...] = ()
        self.body: list[bytes] = []

    def see(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.ok = message["status"] == 200
            self.headers = tuple(message.get("headers", ()))
        elif message["type"] == "http.response.body" and self.ok:
            self.body.append(message.get("body", b""))

    def answer(self) -> tuple[str, Replayed] | None:
        """(version, answer) of a whole 200 that says its version, else None."""
        if not self.ok:
            return None
        version = next((v for k, v in self.headers if k == b"x-model-version"), None)
        if version is None:
            return None
        return version.decode("latin-1"), Replayed(self.headers, b"".join(self.body))


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
        writer: ChargeWriter | None = None,
        keys: KeyCache | None = None,
        version: Callable[[], str] | None = None,
        failed_keys: FailedKeys | None = None,
    ) -> None:
        self.app = app
        self.services = services
        self.accounts = accounts
        self.limiter = limiter
        self.prices = prices
        self.estimate = estimate
        # One writer per process commits the charges of concurrent requests together; keys
        # are remembered for at most a second (both in `accounts/`).
        self.writer = writer or ChargeWriter(accounts)
        self.keys = keys or KeyCache(accounts)
        # Unknown keys per client address (None: not limited).
        self.failed_keys = failed_keys
        # The served snapshot's version: a call's price is remembered per version (the
        # estimate reads the snapshot, e.g. which tickers of a batch exist).
        self.version = version
        self._prices_seen: dict[tuple[str, bytes, bytes, str], int] = {}
        self.replays = Replays()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hit = find(scope["path"]) if scope["type"] == "http" else None
        if hit is None or not self._gated(hit[0]):
            await self.app(scope, receive, send)
            return
        endpoint = hit[0]
        service, price_key = endpoint.service, str(endpoint.price_key)
        request_id = scope.get("state", {}).get("request_id")
        extra: dict[str, str] = {}
        key = presented_key(scope, service)
        version = self._served_version()
        try:
            record = await self._authenticate(key, service, extra, scope)
            body, receive = await read_body(scope, receive)  # after the key: never before
            params = _params_of(scope, body, hit[1])
            tokens = self._tokens(service, price_key, params, scope, body, version)
            if tokens > 0 and not record.is_demo and self.accounts.backend.down:
                raise self.accounts.backend.unavailable()  # its charge would fail: not run
            try:
                self._admit(record, price_key, params, tokens)
            except ApiError as exc:
                if exc.code != "INSUFFICIENT_BALANCE" or key is None:
                    raise
                # The remembered balance is short: read the account again before refusing
                # (a credit made since counts at once).
                record = self._usable(await anyio.to_thread.run_sync(self.keys.load, key))
                self._admit(record, price_key, params, tokens)
            if record.is_demo:
                tokens = 0  # the demo key is not charged
        except ApiError as exc:
            await _send_problem(send, exc, request_id, extra)
            return
        except BackendUnavailable as exc:
            await _send_problem(send, unavailable(exc, request_id), request_id, extra)
            return
        assert key is not None  # an authenticated call presented a key
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
        replay = price_key in REPLAYED_ROUTES and scope["method"] == "GET" and version is not None
        await self._forward(
            scope,
            receive,
            send,
            caller,
            key,
            price_key,
            tokens,
            digest,
            request_id,
            extra,
            version if replay else None,
        )

    def _served_version(self) -> str | None:
        """The served snapshot's version (None: none is served; the route will say why)."""
        if self.version is None:
            return None
        try:
            return self.version()
        except ApiError:
            return None

    def _gated(self, endpoint: Endpoint) -> bool:
        """A keyed, priced route of a service this app serves (open routes pass untouched)."""
        return (
            not endpoint.open
            and endpoint.service in self.services
            and endpoint.price_key in self.prices.prices
        )

    async def _authenticate(
        self, key: str | None, service: str, extra: dict[str, str], scope: Scope
    ) -> KeyRecord:
        """The key's record (remembered up to a second, else read), within its rate limit
        (the limit's headers go into `extra`) and on an account that is not suspended; else
        the ApiError that says why. A client address past its limit of unknown keys gets a
        429 instead of a look-up (`FailedKeys`)."""
        if key is None:
            how = (
                "in the 'apikey' header"
                if service == "daily"
                else "as 'Authorization: Bearer <key>' or 'X-API-Key: <key>'"
            )
            raise ApiError("AUTHENTICATION_REQUIRED", f"send your API key {how}")
        record = self.keys.cached(key)
        if record is None:
            address = (scope.get("client") or ("-",))[0]
            self._guessing(address)
            record = await anyio.to_thread.run_sync(self.keys.load, key)
            if record is None and self.failed_keys is not None:
                await anyio.to_thread.run_sync(self.failed_keys.failed, address)
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
        return self._usable(record)

    def _guessing(self, address: str) -> None:
        """Refuse an address that presented too many unknown keys of late (429)."""
        wait = self.failed_keys.retry_after(address) if self.failed_keys else None
        if wait is not None:
            raise ApiError(
                "RATE_LIMIT_EXCEEDED",
                f"too many unknown API keys from this address; retry in {wait}s",
                headers={"Retry-After": str(wait)},
                limit=self.failed_keys.spec if self.failed_keys else "",
            )

    @staticmethod
    def _usable(record: KeyRecord | None) -> KeyRecord:
        """The record of a key that is still active, on an account that is not suspended."""
        if record is None:
            raise ApiError("INVALID_API_KEY", "the API key is unknown or revoked")
        if record.account_state == "suspended":
            raise ApiError("ACCOUNT_INACTIVE", "the account is suspended")
        return record

    def _admit(
        self, record: KeyRecord, price_key: str, params: dict[str, Any], tokens: int
    ) -> None:
        """Refuse the call unless the demo rules, or the account's state and balance, allow
        one that costs `tokens` (the demo key is never charged)."""
        if record.is_demo:
            _demo_rules(price_key, params, self._demo_tokens(price_key, tokens))
            return
        if tokens > 0 and record.account_state != "verified":
            raise ApiError(
                "ACCOUNT_INACTIVE",
                "verify a payment card on this account to make metered requests "
                "(it grants the 20 USD starting credit)",
            )
        if tokens > record.balance_tokens:
            raise _short(tokens, record.balance_tokens)

    def _tokens(
        self,
        service: str,
        price_key: str,
        params: dict[str, Any],
        scope: Scope,
        body: bytes,
        version: str | None,
    ) -> int:
        """The price of this call, remembered per call and snapshot version: the same path,
        query and body on the same snapshot cost the same (the estimate is pure)."""
        price = self.prices[price_key]
        if service == "daily" or (price.tokens == 0 and price.minimum_tokens == 0):
            return price.cost(1)
        try:
            seen = (scope["path"], scope.get("query_string", b""), body, version or "")
            if version is not None and (tokens := self._prices_seen.get(seen)) is not None:
                return tokens
            tokens = int(self.estimate(price_key, params)["estimated_tokens"])
        except ApiError:
            return 0  # the route itself will refuse the call (and an error is free)
        if version is not None:
            if len(self._prices_seen) >= MAX_REMEMBERED_PRICES:
                self._prices_seen.clear()
            self._prices_seen[seen] = tokens
        return tokens

    def _demo_tokens(self, price_key: str, tokens: int) -> int:
        """What the demo key's per-request cap is compared with: the price of the call, or for a
        route priced per ticker (batch) the price of one ticker. The per-call minimum is a floor
        on what a charged call pays; the demo key is never charged, and its tickers are seven."""
        price = self.prices[price_key]
        return price.tokens if price.per == "ticker" else tokens

    async def _forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        caller: Caller,
        key: str,
        price_key: str,
        tokens: int,
        digest: str,
        request_id: str | None,
        extra: dict[str, str],
        replay_version: str | None = None,
    ) -> None:
        """Run the route (or replay its answer, `Replays`) and charge a 2xx before its first
        byte leaves; `replay_version`: the served version, for a call whose answer may be
        replayed."""
        swallow = False
        recorder: _Recorder | None = None
        path, query = scope["path"], scope.get("query_string", b"")

        async def metered_send(message: Message) -> None:
            nonlocal swallow
            if recorder is not None:
                recorder.see(message)
            if swallow:
                return
            if message["type"] == "http.response.start":
                status = message["status"]
                charged = 0
                balance = caller.balance_tokens
                if 200 <= status < 300 and tokens > 0:
                    try:
                        result = await self.writer.charge(
                            ChargeRequest(
                                caller.account_id,
                                tokens,
                                caller.key_id,
                                price_key,
                                digest,
                                request_id or "",
                            )
                        )
                    except BackendUnavailable as exc:  # not charged: the answer is a 503
                        swallow = True
                        await _send_problem(send, unavailable(exc, request_id), request_id, extra)
                        return
                    if not result.ok:
                        swallow = True
                        refusal = _refusal(result, tokens)
                        await _send_problem(send, refusal, request_id, extra)
                        return
                    self.keys.note_balance(key, result.balance_tokens)
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

        if replay_version is not None:
            hit = self.replays.get(replay_version, path, query)
            if hit is not None:
                start = {"type": "http.response.start", "status": 200, "headers": [*hit.headers]}
                await metered_send(start)
                await metered_send({"type": "http.response.body", "body": hit.body})
                return
            recorder = _Recorder()
        await self.app(scope, receive, metered_send)
        if recorder is not None and (answer := recorder.answer()) is not None:
            self.replays.put(answer[0], path, query, answer[1])


def _params_of(scope: Scope, body: bytes, path_params: dict[str, str]) -> dict[str, Any]:
    """The call's parameters as the estimate reads them: the query string, the path's
    parameters, and for a POST the JSON body's fields."""
    params: dict[str, Any] = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
    params.update(path_params)
    if scope["method"] == "POST" and body:
        try:
            doc = orjson.loads(body)
            if isinstance(doc, dict):
                params.update(doc)
        except orjson.JSONDecodeError:
            pass  # the route answers the malformed body with a 400
    return params


def _usd(tokens: int) -> str:
    return f"{tokens_to_usd(tokens):.5f}"


def _refusal(result: Charge, tokens: int) -> ApiError:
    """Why a 2xx was not charged (and so not sent): most often a concurrent request spent the
    credit (402); else the key was revoked or the account left the verified state since the
    request was let in."""
    if result.key_revoked:
        return ApiError("INVALID_API_KEY", "the API key is unknown or revoked")
    if result.account_state != "verified":
        return ApiError("ACCOUNT_INACTIVE", "the account is not active")
    return _short(tokens, result.balance_tokens)


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
    outside = [t for t in _tickers_in(params) if CLASS_TWINS.get(t, t) not in MAG7]
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

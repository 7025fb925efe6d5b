"""The gate in front of every keyed route of both services: key -> rate limit -> account state
-> (the route reads, plans and prices the call; the gate admits that price) -> charge of a
2xx -> headers.

One ASGI middleware, so that the rules are the same for every route and no route can forget
them. It never reads a body, a query or a plan: the route's `Metered` dependency (api/endpoint.py)
reads the request once, plans it once and hands the gate the price of that plan (`Meter.admit`),
the same price `/api/estimate` answers with. The charge is made when the route's answer is known
and before its first byte leaves: a 2xx is charged (atomically, never below zero) or, if a
concurrent request spent the credit first, replaced by a 402; anything else (errors, 304) is
free. A keyed 2xx whose route set no price is never sent (500): nothing is answered unpriced.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from eqrisk.accounts.backends import BackendUnavailable
from eqrisk.accounts.book import Accounts, Charge, ChargeRequest, KeyRecord
from eqrisk.accounts.key_cache import KeyCache
from eqrisk.accounts.limits import FailedKeys, RateLimiter
from eqrisk.accounts.pricing import tokens_to_usd
from eqrisk.accounts.writer import ChargeWriter
from eqrisk.api.bounds import send_problem as _send_problem
from eqrisk.api.errors import ApiError
from eqrisk.api.outages import unavailable
from eqrisk.api.plans import CLASS_TWINS
from eqrisk.data.master import MAG7

log = logging.getLogger("eqrisk.api")

DEMO_MAX_TOKENS = 250
MAX_REPLAYED = 8192  # answers kept for one version (a few kB each) before the memo starts over
METER_KEY = "meter"  # scope["state"][METER_KEY]: the request's `Meter`


@dataclass(frozen=True)
class Caller:
    """Who is calling: the key's id (never the key), its account, and whether it is the demo key."""

    key_id: str
    account_id: str
    is_demo: bool
    account_state: str
    balance_tokens: int


@dataclass(frozen=True)
class Priced:
    """The price of one call, from the plan its route answers from (`Endpoint.priced`)."""

    price_key: str
    tokens: int  # what a 2xx costs (the demo key is never charged)
    demo_tokens: int  # what the demo key's per-request cap is compared with
    tickers: tuple[str, ...]  # the symbols the answer covers, as served (the demo key's rule)
    digest: str  # SHA-256 of the call as sent (path, query, body): the ledger's params digest
    replayed: bool = False  # its 200 is a function of (version, path, query): see `Replays`
    demo_also: tuple[str, ...] = ()  # symbols the demo key may also be served on this route


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


class Meter:
    """One keyed request's account: who calls (the gate's), and the price its route set
    through `admit` (None until then). The gate charges a 2xx that price."""

    __slots__ = ("_gate", "caller", "key", "priced", "record")

    def __init__(self, gate: Gate, key: str, record: KeyRecord) -> None:
        self._gate = gate
        self.key = key
        self.record = record
        self.caller = Caller(
            record.key_id,
            record.account_id,
            record.is_demo,
            record.account_state,
            record.balance_tokens,
        )
        self.priced: Priced | None = None

    def screen(self, asked: Iterable[str], also: Iterable[str] = ()) -> None:
        """Refuse, before any work, a call naming tickers this key may not ask for (the demo
        key: its seven tickers and their share-class twins, and on some routes the ETFs its
        seven imply: `also`), known or not."""
        if self.record.is_demo:
            demo_names(asked, also)

    async def admit(self, priced: Priced) -> None:
        """Refuse the call (ApiError) unless the demo rules, or the account's state and
        balance, allow it at this price; else remember the price for the charge."""
        await self._gate.admit(self, priced)


@dataclass(frozen=True)
class Replayed:
    """A route's 200 answer as it left the route (its headers, before the gate's, and body),
    with the price its route set."""

    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    priced: Priced


class Replays:
    """The 200 answers of replayed endpoints (`Endpoint.replayed`) per snapshot version, by
    (path, query string).

    A snapshot version never changes, so neither does such an answer nor its price: the route's
    dependency resolution, parameter models, plan, document and rendering run once per version
    and call, not per request. Only the version being served is kept: the first request that
    sees a new version drops the old one's answers. An answer is filed under the version it
    says it is from (its `X-Model-Version`), so one rendered as the version changed cannot be
    replayed as the other's. Keys, limits, the admission of the price and the charge are the
    gate's as for any call; only the route's work is skipped."""

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

    def answer(self, priced: Priced) -> tuple[str, Replayed] | None:
        """(version, answer) of a whole 200 that says its version, else None."""
        if not self.ok:
            return None
        version = next((v for k, v in self.headers if k == b"x-model-version"), None)
        if version is None:
            return None
        return version.decode("latin-1"), Replayed(self.headers, b"".join(self.body), priced)


class Gate:
    def __init__(
        self,
        app: ASGIApp,
        *,
        accounts: Accounts,
        limiter: RateLimiter,
        keyed: Callable[[str], str | None],
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
        # Which service's key a path needs (None: an open or unknown path, passed untouched):
        # `endpoints.keyed_service`, read from the one endpoint table.
        self.keyed = keyed
        # One writer per process commits the charges of concurrent requests together; keys
        # are remembered for at most a second (both in `accounts/`).
        self.writer = writer or ChargeWriter(accounts)
        self.keys = keys or KeyCache(accounts)
        # Unknown keys per client address (None: not limited).
        self.failed_keys = failed_keys
        # The served snapshot's version: replayed answers are kept per version.
        self.version = version
        self.replays = Replays()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        service = self.keyed(scope["path"]) if scope["type"] == "http" else None
        if service is None or service not in self.services:
            await self.app(scope, receive, send)
            return
        request_id = scope.get("state", {}).get("request_id")
        extra: dict[str, str] = {}
        key = presented_key(scope, service)
        try:
            record = await self._authenticate(key, service, extra, scope)
        except ApiError as exc:
            await _send_problem(send, exc, request_id, extra)
            return
        except BackendUnavailable as exc:
            await _send_problem(send, unavailable(exc, request_id), request_id, extra)
            return
        assert key is not None  # an authenticated call presented a key
        meter = Meter(self, key, record)
        state = scope.setdefault("state", {})
        state["caller"] = meter.caller
        state[METER_KEY] = meter
        await self._forward(scope, receive, send, meter, request_id, extra)

    def _served_version(self) -> str | None:
        """The served snapshot's version (None: none is served; the route will say why)."""
        if self.version is None:
            return None
        try:
            return self.version()
        except ApiError:
            return None

    async def _authenticate(
        self, key: str | None, service: str, extra: dict[str, str], scope: Scope
    ) -> KeyRecord:
        """The key's record (remembered up to a second, else read), within its rate limit
        (the limit's headers go into `extra`) and on an account that is not suspended; else
        the ApiError that says why. A client address past its limit of unknown keys gets a
        429 instead of a look-up (`FailedKeys`), whatever key it sends, remembered or not: a
        right guess is refused as a wrong one is (the lock tells a guesser nothing, not even
        which keys were used in the last second), and the refusal does not depend on this
        process's cache (docs/decisions/outages.md)."""
        if key is None:
            how = (
                "in the 'apikey' header"
                if service == "daily"
                else "as 'Authorization: Bearer <key>' or 'X-API-Key: <key>'"
            )
            raise ApiError("AUTHENTICATION_REQUIRED", f"send your API key {how}")
        address = (scope.get("client") or ("-",))[0]
        self._guessing(address)  # an in-process read: no I/O on the cached path either
        record = self.keys.cached(key)
        if record is None:
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

    async def admit(self, meter: Meter, priced: Priced) -> None:
        """`Meter.admit`: the demo rules, or the account's state and balance, at this price.
        A balance remembered short is read again before the call is refused (a credit made
        since counts at once). A priced call is refused (503) while the accounts database is
        known to be down: its charge could not be made."""
        if priced.tokens > 0 and not meter.record.is_demo and self.accounts.backend.down:
            raise self.accounts.backend.unavailable()
        try:
            _admissible(meter.record, priced)
        except ApiError as exc:
            if exc.code != "INSUFFICIENT_BALANCE":
                raise
            meter.record = self._usable(await anyio.to_thread.run_sync(self.keys.load, meter.key))
            _admissible(meter.record, priced)
        meter.priced = priced

    async def _charge(self, meter: Meter, priced: Priced, request_id: str | None) -> int:
        """Charge a 2xx its price (the demo key: nothing); returns the tokens charged. Raises
        the ApiError that replaces the answer when the charge is refused, or when the database
        could not take it (a 503: not charged)."""
        tokens = 0 if meter.record.is_demo else priced.tokens
        if tokens <= 0:
            return 0
        try:
            result = await self.writer.charge(
                ChargeRequest(
                    meter.record.account_id,
                    tokens,
                    meter.record.key_id,
                    priced.price_key,
                    priced.digest,
                    request_id or "",
                )
            )
        except BackendUnavailable as exc:
            raise unavailable(exc, request_id) from None
        if not result.ok:
            raise _refusal(result, tokens)
        self.keys.note_balance(meter.key, result.balance_tokens)
        meter.record = replace(meter.record, balance_tokens=result.balance_tokens)
        return tokens

    async def _forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        meter: Meter,
        request_id: str | None,
        extra: dict[str, str],
    ) -> None:
        """Run the route (or replay its answer, `Replays`) and charge a 2xx before its first
        byte leaves."""
        swallow = replaying = False
        recorder: _Recorder | None = None
        path, query = scope["path"], scope.get("query_string", b"")
        version = self._served_version() if scope["method"] == "GET" else None

        async def metered_send(message: Message) -> None:
            nonlocal swallow, recorder
            if message["type"] == "http.response.start":
                priced = meter.priced
                if version is not None and priced is not None and priced.replayed and not replaying:
                    recorder = _Recorder()
                status = message["status"]
                charged = 0
                if 200 <= status < 300:
                    try:
                        if priced is None:
                            log.error("a keyed route answered %d unpriced: %s", status, path)
                            raise ApiError(
                                "INTERNAL_ERROR", "the call was not priced; nothing sent"
                            )
                        charged = await self._charge(meter, priced, request_id)
                    except ApiError as refusal:
                        swallow = True
                        await _send_problem(send, refusal, request_id, extra)
                        return
                headers = list(message.get("headers", []))
                balance = 0 if meter.record.is_demo else meter.record.balance_tokens
                for name, value in {
                    **extra,
                    "X-API-Cost-USD": _usd(charged),
                    "X-Tokens-Consumed": str(charged),
                    "X-Balance-Remaining-USD": _usd(balance),
                }.items():
                    headers.append((name.lower().encode(), value.encode()))
                if recorder is not None:
                    recorder.see(message)
                message["headers"] = headers
            elif recorder is not None:
                recorder.see(message)
            if not swallow:
                await send(message)

        if version is not None and (hit := self.replays.get(version, path, query)) is not None:
            try:
                await meter.admit(hit.priced)
            except ApiError as exc:
                await _send_problem(send, exc, request_id, extra)
                return
            except BackendUnavailable as exc:
                await _send_problem(send, unavailable(exc, request_id), request_id, extra)
                return
            replaying = True
            start = {"type": "http.response.start", "status": 200, "headers": [*hit.headers]}
            await metered_send(start)
            await metered_send({"type": "http.response.body", "body": hit.body})
            return
        await self.app(scope, receive, metered_send)
        if recorder is not None and meter.priced is not None:
            answer = recorder.answer(meter.priced)
            if answer is not None:
                self.replays.put(answer[0], path, query, answer[1])


def _admissible(record: KeyRecord, priced: Priced) -> None:
    """Refuse the call unless the demo rules, or the account's state and balance, allow it
    (the demo key is never charged)."""
    if record.is_demo:
        demo_rules(priced)
        return
    if priced.tokens > 0 and record.account_state != "verified":
        raise ApiError(
            "ACCOUNT_INACTIVE",
            "verify a payment card on this account to make metered requests "
            "(it grants the 20 USD starting credit)",
        )
    if priced.tokens > record.balance_tokens:
        raise _short(priced.tokens, record.balance_tokens)


def _outside(tickers: Iterable[str], also: set[str] | None = None) -> None:
    outside = list(dict.fromkeys(tickers))
    if outside:
        etfs = f" (and here their ETFs {', '.join(sorted(also))})" if also else ""
        raise ApiError(
            "DEMO_RESTRICTED",
            f"the demo key covers only {', '.join(MAG7)}{etfs}; not {', '.join(outside)}",
            allowed_tickers=[*MAG7, *sorted(also or ())],
        )


def demo_names(asked: Iterable[str], also: Iterable[str] = ()) -> None:
    """The demo key asks for the seven tickers of `MAG7` only, or the share-class twin the real
    client sends for one of them (GOOG for GOOGL), or a symbol of `also` (the ETFs the seven
    imply, where the route allows them): what it is served is checked by `demo_rules`."""
    extra = set(also)
    _outside(
        (t for t in asked if t not in MAG7 and CLASS_TWINS.get(t) not in MAG7 and t not in extra),
        extra,
    )


def demo_rules(priced: Priced) -> None:
    """The demo key is served the seven tickers of `MAG7` only (a twin the data set holds, GOOG,
    is not one of them, whatever the request named) and the route's `demo_also`, and at most
    `DEMO_MAX_TOKENS` a request."""
    extra = set(priced.demo_also)
    _outside((t for t in priced.tickers if t not in MAG7 and t not in extra), extra)
    if priced.demo_tokens > DEMO_MAX_TOKENS:
        raise ApiError(
            "DEMO_RESTRICTED",
            f"this request costs {priced.demo_tokens} tokens; the demo key allows at most "
            f"{DEMO_MAX_TOKENS} per request",
            tokens=priced.demo_tokens,
            max_tokens=DEMO_MAX_TOKENS,
        )


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

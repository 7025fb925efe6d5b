"""One object per endpoint, from which its FastAPI route is registered (docs/CONTRIBUTING.md).

An `Endpoint` is what a route is: its path and method, the service and price key that meter it,
its parameters model and the one reader of them (query string, path or JSON body), its plan
(what the request asks for, decided once), its size (the units its price multiplies), its
renderer and its documentation. `register` makes the FastAPI route. The route's `Metered`
dependency (`metered`) reads the parameters, negotiates the format, plans the call, prices that
very plan (`Endpoint.quote`) and has the gate admit the price (`gate.Meter.admit`: demo rules,
account state, balance); the renderer then answers from the same plan, and the gate charges
the price if the answer is a 2xx. `/api/estimate` prices through `Endpoint.quote` as well, so an
estimate is the charge.
"""

# No `from __future__ import annotations`: FastAPI reads the signatures built here at runtime.

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Annotated, Any, Generic, Literal, TypeVar

from fastapi import Depends, FastAPI, Request
from starlette.responses import Response

from eqrisk.accounts.pricing import PriceTable
from eqrisk.api.body import DIGEST_KEY, JSON_MEDIA_TYPE, Received, body_of, params_digest
from eqrisk.api.deps import daily_caller, risk_caller, served_snapshot, snapshot_at
from eqrisk.api.errors import ApiError
from eqrisk.api.formats import negotiate
from eqrisk.api.gate import METER_KEY, Caller, Meter, Priced
from eqrisk.api.params import Params, named_tickers, query_of
from eqrisk.api.sizes import ONE_CALL, Size
from eqrisk.api.work import offload
from eqrisk.snapshot.versions import Snapshot

Service = Literal["daily", "risk"]
P = TypeVar("P", bound=Params)
T = TypeVar("T")

TAGS: dict[str, str] = {"risk": "Service B: risk metrics", "daily": "Service A: daily stock data"}
_CALLERS: dict[str, Callable[..., Any]] = {"risk": risk_caller, "daily": daily_caller}


@dataclass(frozen=True)
class Call(Generic[P, T]):
    """A request as its renderer answers it: read, validated, planned and admitted once."""

    request: Request
    snap: Snapshot
    caller: Caller
    params: P
    plan: T
    fmt: str  # the negotiated answer format; "" where the endpoint negotiates none


@dataclass(frozen=True)
class Doc:
    """What the OpenAPI document says of a route."""

    summary: str
    description: str | None = None  # default: the renderer's docstring (as FastAPI does)
    response_model: Any = None
    responses: Mapping[int | str, Any] | None = None
    name: str | None = None  # the route's name: the base of FastAPI's default operationId
    operation_id: str | None = None
    tag: str | None = None  # default: the service's (`TAGS`)


@dataclass(frozen=True)
class Quote:
    """The price of one plan: its size, the tokens a 2xx costs, and what the demo key's
    per-request cap is compared with (a per-ticker price: one ticker's)."""

    size: Size
    tokens: int
    demo_tokens: int


def no_tickers(plan_or_params: Any) -> tuple[str, ...]:
    """A request, an answer about no symbol in particular (lists, the market, estimates)."""
    return ()


@dataclass(frozen=True)
class Endpoint(Generic[P, T]):
    """One route. `plan(snap, params)` decides what the request asks for, raising the API's
    errors (on the event loop, or with `threaded` in the app's work threads: `api/work`);
    `size(plan, params)` counts what the answer holds (None: one unit a call, and not offered
    by /api/estimate); `render(call)` answers from the plan (`threaded`: in the work threads
    too, for calls that compute, read or write much; their CPU is held to the call's budget). `reader` reads `params` (default: the query string for
    GET, the JSON body for POST); `formats` are negotiated (`format` parameter, else Accept)
    before planning. The demo key's rules read `asked(params)`, the tickers the request names
    (default: its `ticker`, `etf`, `tickers` and `symbols` fields), before planning, and
    `tickers(plan)`, those the answer covers as served, with the price. `replayed`: the 200
    answer is a function of the snapshot version, path and query alone (the gate replays it,
    `gate.Replays`). An endpoint that does not fit (open routes, the account's) gives a plain
    FastAPI `handler` instead; a keyed one is still priced at one unit before it runs."""

    path: str
    service: Service
    price_key: str | None  # None: never metered
    doc: Doc
    params: type[P] | None = None
    plan: Callable[[Snapshot, P], T] | None = None
    render: Callable[[Call[P, T]], Response] | None = None
    size: Callable[[T, P], Size] | None = None
    method: Literal["GET", "POST"] = "GET"
    reader: Any = None
    formats: tuple[str, ...] = ()
    asked: Callable[[P], Iterable[str]] = named_tickers
    tickers: Callable[[T], Iterable[str]] = no_tickers
    threaded: bool = False
    replayed: bool = False
    # Symbols the demo key may also name and be served here, beyond its seven (portfolio
    # risk: the ETFs the seven imply, the benchmark and hedge legs), of the served snapshot.
    demo_also: Callable[[Snapshot], Iterable[str]] | None = None
    # Caps on what one call may ask where the price does not scale with the work (documented,
    # enforced by the parameters model, told by /api/estimate as `limits`).
    limits: Mapping[str, float] | None = None
    handler: Callable[..., Any] | None = None
    open: bool = False  # no key, never metered

    def __post_init__(self) -> None:
        planned = self.params is not None and self.plan is not None and self.render is not None
        if planned == (self.handler is not None):
            raise ValueError(f"{self.path}: give params, plan and render, or a handler")
        if not self.open and self.price_key is None:
            raise ValueError(f"{self.path}: a keyed endpoint needs a price key")

    def variant(self, **changes: Any) -> "Endpoint[Any, Any]":
        """Another route answered the same way: this endpoint with `changes` (its path, method,
        price key, parameters and their reader, plan, documentation...), the rest shared (the
        service, size, tickers, renderer, threads), so sibling routes state only how they
        differ."""
        return replace(self, **changes)

    @property
    def name(self) -> str:
        """The estimate's name for it: the path after `/api/`, without path parameters
        (`/api/metrics/{ticker}/correlation`: `metrics/correlation`)."""
        parts = [part for part in self.path.split("/") if part and not part.startswith("{")]
        return "/".join(parts).removeprefix("api/")

    @property
    def path_params(self) -> tuple[str, ...]:
        return tuple(part[1:-1] for part in self.path.split("/") if part.startswith("{"))

    def match(self, path: str) -> dict[str, str] | None:
        """The path parameters when `path` is this endpoint's (a trailing slash is the same
        path), else None."""
        want = self.path.strip("/").split("/")
        got = path.strip("/").split("/")
        if len(want) != len(got):
            return None
        found: dict[str, str] = {}
        for w, g in zip(want, got, strict=True):
            if w.startswith("{"):
                if not g:
                    return None
                found[w[1:-1]] = g
            elif w != g:
                return None
        return found

    def quote(self, plan: T | None, params: P | None, prices: PriceTable) -> Quote:
        """The price of answering `params` from `plan`: what the route charges and what
        /api/estimate says, computed here for both."""
        assert self.price_key is not None
        size = ONE_CALL if self.size is None else self.size(plan, params)  # type: ignore[arg-type]
        price = prices[self.price_key]
        tokens = price.cost(size.units)
        return Quote(size, tokens, price.tokens if price.per in ("ticker", "position") else tokens)


def open_route(
    path: str, handler: Callable[..., Any], doc: Doc, method: Literal["GET", "POST"] = "POST"
) -> Endpoint[Any, Any]:
    """A Service B route answered by a plain handler with no key, never metered: sign-up, its
    claim, the payment providers' webhooks, readiness."""
    return Endpoint(
        path=path,
        method=method,
        service="risk",
        price_key=None,
        open=True,
        handler=handler,
        doc=doc,
    )


def _meter(request: Request) -> Meter:
    """The gate's account of this request (a keyed route reached without the gate: 401)."""
    meter: Meter | None = request.scope.get("state", {}).get(METER_KEY)
    if meter is None:
        raise ApiError("AUTHENTICATION_REQUIRED", "send your API key")
    return meter


async def _digest(request: Request) -> str:
    """SHA-256 of the call as sent (path, query string, body): the ledger's params digest
    (computed with the body's parsing where that ran in the work threads)."""
    scope = request.scope
    done: str | None = scope.get(DIGEST_KEY)
    if done is not None:
        return done
    body = await request.body() if request.method == "POST" else b""
    return params_digest(scope["path"], scope.get("query_string", b""), body)


def _format_of(params: Any) -> str | None:
    """The `format` parameter, given and not blank (blank is absent)."""
    value = getattr(params, "format", None)
    return value if isinstance(value, str) and value.strip() else None


def _sign(function: Callable[..., Any], **parameters: Any) -> None:
    """Give `function` the signature FastAPI reads: keyword parameters with these annotations
    (how one dependency serves every endpoint with its own caller and parameters)."""
    function.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation)
            for name, annotation in parameters.items()
        ]
    )


def metered(spec: Endpoint[P, T]) -> Callable[..., Any]:
    """The route's `Metered` dependency: its parameters read once, the format negotiated, the
    call planned once and priced from that plan, the price admitted by the gate."""
    assert spec.params is not None and spec.plan is not None
    plan_of = spec.plan
    reader = spec.reader or (
        query_of(spec.params)
        if spec.method == "GET"
        else body_of(spec.params, threaded=spec.threaded)
    )

    def fmt_of(request: Request, params: P) -> str:
        return negotiate(request, _format_of(params), spec.formats) if spec.formats else ""

    def read_and_plan(
        request: Request, meter: Meter, body: Received, also: tuple[str, ...], current: Snapshot
    ) -> tuple[P, tuple[str, T] | None]:
        """A threaded route's body parsed, screened, its format negotiated and its call planned
        in one hop of the work threads, in the order of `dependency`; a body naming a kept
        version other than the current one comes back parsed and screened only."""
        params: P = body.parse()
        meter.screen(spec.asked(params), also)
        version = getattr(params, "version", None)
        if version is not None and version.strip() and version.strip() != current.version:
            return params, None
        fmt = fmt_of(request, params)
        return params, (fmt, plan_of(current, params))

    async def dependency(request: Request, caller: Caller, sent: P | Received) -> Call[P, T]:
        meter = _meter(request)
        also: tuple[str, ...] = ()
        current = served_snapshot(request.app.state.snapshots)
        if spec.demo_also is not None and meter.caller.is_demo:
            also = tuple(spec.demo_also(current))
        done: tuple[str, T] | None = None  # the format and the plan, when made in one hop
        if isinstance(sent, Received):  # one hop: body, screen, format, plan
            params, done = await offload(
                request, read_and_plan, request, meter, sent, also, current
            )
        else:
            params = sent
            meter.screen(spec.asked(params), also)
        if done is not None:
            snap, (fmt, plan) = current, done
        else:
            snap = snapshot_at(request.app.state, getattr(params, "version", None))
            fmt = fmt_of(request, params)
            if spec.threaded:  # a plan that computes: in the work threads, within the budget
                plan = await offload(request, plan_of, snap, params)
            else:  # a plan that only decides: on the loop
                plan = plan_of(snap, params)
        quote = spec.quote(plan, params, request.app.state.prices)
        assert spec.price_key is not None
        tickers = tuple(spec.tickers(plan))
        digest = await _digest(request)
        priced = Priced(
            spec.price_key, quote.tokens, quote.demo_tokens, tickers, digest, spec.replayed, also
        )
        await meter.admit(priced)
        return Call(request, snap, caller, params, plan, fmt)

    _sign(
        dependency,
        request=Request,
        caller=Annotated[Caller, Depends(_CALLERS[spec.service])],
        sent=Annotated[spec.params, reader],
    )
    return dependency


def _priced_handler(spec: Endpoint[Any, Any]) -> Callable[..., Any]:
    """A keyed handler endpoint's price: one unit of its price key, admitted before it runs."""

    async def dependency(request: Request) -> None:
        assert spec.price_key is not None
        quote = spec.quote(None, None, request.app.state.prices)
        digest = await _digest(request)
        priced = Priced(spec.price_key, quote.tokens, quote.demo_tokens, (), digest)
        await _meter(request).admit(priced)

    return dependency


def body_openapi(model: type[Params]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The OpenAPI requestBody of a JSON body read by `body.body_of` (FastAPI does not parse
    it, so does not document it), and the component schemas it refers to."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    components = {model.__name__: schema, **schema.pop("$defs", {})}
    content = {JSON_MEDIA_TYPE: {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}
    return {"requestBody": {"required": True, "content": content}}, components


def register(app: FastAPI, spec: Endpoint[Any, Any], schemas: dict[str, Any]) -> None:
    """Add `spec`'s route to `app` (body schemas for the OpenAPI document go into `schemas`)."""
    doc = spec.doc
    described = spec.render.__doc__ if spec.render is not None else None
    route: dict[str, Any] = {
        "methods": [spec.method],
        "summary": doc.summary,
        "description": doc.description or (inspect.cleandoc(described) if described else None),
        "responses": dict(doc.responses or {}),
        "name": doc.name,
        "operation_id": doc.operation_id,
        "tags": [doc.tag or TAGS[spec.service]],
    }
    if doc.response_model is not None:
        route["response_model"] = doc.response_model
    if spec.handler is not None:
        keyed = not spec.open and spec.price_key is not None
        dependencies = [Depends(_priced_handler(spec))] if keyed else None
        app.add_api_route(spec.path, spec.handler, dependencies=dependencies, **route)
        return
    assert spec.params is not None and spec.render is not None
    render = spec.render
    if spec.method == "POST" and spec.reader is None:
        route["openapi_extra"], components = body_openapi(spec.params)
        schemas.update(components)

    threaded = spec.threaded

    async def handler(call: Call[Any, Any]) -> Response:
        if threaded:  # in the work threads, within the call's CPU budget (api/work.py)
            return await offload(call.request, render, call)
        return render(call)

    _sign(handler, call=Annotated[Call, Depends(metered(spec))])
    app.add_api_route(spec.path, handler, **route)


def register_all(app: FastAPI, endpoints: Iterable[Endpoint[Any, Any]]) -> None:
    """Register every endpoint, and add the schemas of the JSON bodies to the OpenAPI
    document's components."""
    schemas: dict[str, Any] = {}
    for spec in endpoints:
        register(app, spec, schemas)
    build = app.openapi

    def openapi() -> dict[str, Any]:
        document = build()
        document.setdefault("components", {}).setdefault("schemas", {}).update(schemas)
        return document

    app.openapi = openapi  # type: ignore[method-assign]

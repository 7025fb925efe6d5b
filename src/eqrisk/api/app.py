"""The ASGI application: Service A (daily stock data, at the root) and Service B (risk metrics,
under /api) over the current snapshot, one error shape, one request id per request."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from eqrisk.accounts.db import make_engine
from eqrisk.accounts.limits import RateLimiter
from eqrisk.accounts.pricing import PriceTable
from eqrisk.accounts.service import Accounts
from eqrisk.api import billing, estimates
from eqrisk.api.errors import install_error_handlers, problem_body
from eqrisk.api.formats import RenderCache
from eqrisk.api.gate import Gate
from eqrisk.settings import Settings, get_settings
from eqrisk.snapshot.store import SnapshotStore

log = logging.getLogger("eqrisk.api")
SERVICES = ("daily", "risk")
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class RequestIdMiddleware:
    """Gives every request an id (the caller's X-Request-ID when sane, else a new one), puts it
    on every response, and turns an exception that escaped everything into a problem+json 500
    that carries the id (the framework's last-resort handler would not)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        request_id = incoming if _SAFE_ID.match(incoming) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode()))
                message["headers"] = headers
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            log.exception("unhandled error, request %s", request_id)
            if started:
                raise
            body = problem_body(
                "INTERNAL_ERROR", "an internal error occurred; quote the request_id", request_id
            )
            await send(
                {
                    "type": "http.response.start",
                    "status": 500,
                    "headers": [
                        (b"content-type", b"application/problem+json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"x-request-id", request_id.encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})


def create_app(settings: Settings | None = None, services: Sequence[str] | None = None) -> FastAPI:
    """Build the application for `services` ("daily" = Service A, "risk" = Service B)."""
    settings = settings or get_settings()
    services = tuple(services if services is not None else settings.services)
    unknown = set(services) - set(SERVICES)
    if unknown or not services:
        raise ValueError(f"services must be a non-empty subset of {SERVICES}; got {services}")
    # The docs page's JavaScript and CSS are served by the app itself (no CDN): it works offline.
    app = FastAPIOffline(
        title="eqrisk",
        version="2.0.0",
        description=(
            "Equity risk data computed by eqrisk from daily prices. Service A (daily stock data) "
            "at the root, key in the `apikey` header; Service B (risk metrics) under `/api`, key "
            "as `Authorization: Bearer <key>` or `X-API-Key`. Errors are problem+json."
        ),
    )
    app.state.settings = settings
    app.state.snapshots = SnapshotStore(settings.home_dir)
    app.state.prices = PriceTable.load(settings.pricing_file)
    app.state.render_cache = RenderCache(settings.render_cache_mb * 2**20)
    database_url = settings.database_url.get_secret_value() if settings.database_url else None
    app.state.accounts = Accounts(make_engine(settings.home_dir, database_url))
    app.state.accounts.ensure_demo_key(settings.demo_key.get_secret_value())
    redis_url = settings.redis_url.get_secret_value() if settings.redis_url else None
    app.state.limiter = RateLimiter(redis_url)
    install_error_handlers(app)
    if "risk" in services:
        from eqrisk.api import risk

        app.include_router(risk.router)
        app.include_router(billing.router)
    if "daily" in services:
        from eqrisk.api import daily

        app.include_router(daily.router)

    def estimate(endpoint: str, params: dict[str, Any]) -> dict[str, Any]:
        return estimates.estimate(endpoint, params, app.state.snapshots.current(), app.state.prices)

    # Starlette runs the last added middleware first: request id, then the gate, then routes.
    app.add_middleware(
        Gate,
        accounts=app.state.accounts,
        limiter=app.state.limiter,
        prices=app.state.prices,
        estimate=estimate,
        services=services,
    )
    app.add_middleware(RequestIdMiddleware)
    return app

"""What the HTTP layer says when a backend fails (docs/decisions/outages.md): a
`BackendUnavailable` from anywhere (the gate's key lookup and charge, a route's read) is a 503
`SERVICE_UNAVAILABLE` problem+json with `Retry-After` and one log line, never a traceback.
`/api/ready` (api/endpoints/ready.py), the readiness check a load balancer polls, reports the
states these functions give; `/api/health` stays the liveness check (the process answers).

The state functions (`snapshot_state`, `database_state`, `redis_state`) are what anything else
that reports on the server (a metrics exporter, a configuration check) reads.
"""

# No `from __future__ import annotations`: FastAPI reads the route's annotations at runtime.

import contextlib
import logging
from typing import Any

from fastapi import FastAPI, Request
from sqlalchemy import text
from starlette.responses import Response

from eqrisk.accounts.backends import BackendUnavailable
from eqrisk.accounts.book import Accounts
from eqrisk.accounts.limits import RateLimiter
from eqrisk.api.errors import ApiError, problem_response, request_id_of
from eqrisk.snapshot.versions import SnapshotError, SnapshotStore

log = logging.getLogger("eqrisk.api")


def unavailable(exc: BackendUnavailable, request_id: str | None) -> ApiError:
    """The 503 for a backend that cannot answer, logged as one line (no traceback)."""
    log.warning(
        "503 %s unavailable: %s (request %s, retry after %ds)",
        exc.backend,
        exc.reason,
        request_id or "-",
        exc.retry_after_s,
    )
    return ApiError(
        "SERVICE_UNAVAILABLE",
        f"the {exc.backend} is unavailable; nothing was charged, retry in "
        f"{exc.retry_after_s}s (the reason is in the server's log, under this request id)",
        headers={"Retry-After": str(exc.retry_after_s)},
        backend=exc.backend,
    )


def snapshot_state(store: SnapshotStore) -> dict[str, Any]:
    """The served snapshot: up with its version, or down with why none can be served."""
    try:
        snapshot = store.current()
    except SnapshotError as exc:
        return {"state": "down", "error": str(exc)}
    return {"state": "up", "version": snapshot.version}


def database_state(accounts: Accounts) -> dict[str, Any]:
    """The accounts database's state, asked (`SELECT 1`, bounded by the database timeouts) at
    most once per `backend_retry_s`; blocking (call it off the event loop)."""
    backend = accounts.backend
    if not backend.reported_within(backend.retry_s):
        with (
            contextlib.suppress(BackendUnavailable),
            backend.probe(),
            accounts.engine.connect() as conn,
        ):
            conn.execute(text("SELECT 1"))
    return {**backend.state().as_dict(), "kind": accounts.engine.dialect.name}


def redis_state(limiter: RateLimiter) -> dict[str, Any]:
    """Redis's state (`off` without Redis: limits are counted in `limits`), asked (PING) on
    every call, bounded by the Redis timeouts: whichever worker answers the readiness check
    says what Redis does now, not what this worker's last request saw; blocking."""
    backend = limiter.backend
    if backend.state().state != "off":
        with contextlib.suppress(BackendUnavailable):
            limiter.ping()
    return {**backend.state().as_dict(), "limits": limiter.kind}


def include(app: FastAPI) -> None:
    """The 503 for a backend error raised in any route."""

    async def _unavailable(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, BackendUnavailable)
        error = unavailable(exc, request_id_of(request))
        return problem_response(request, error.code, error.detail, error.headers, **error.context)

    app.add_exception_handler(BackendUnavailable, _unavailable)

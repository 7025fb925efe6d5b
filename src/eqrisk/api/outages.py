"""What the HTTP layer says when a backend fails (docs/decisions/outages.md): a
`BackendUnavailable` from anywhere (the gate's key lookup and charge, a route's read) is a 503
`SERVICE_UNAVAILABLE` problem+json with `Retry-After` and one log line, never a traceback; and
`/api/ready`, the readiness check a load balancer polls, with the state of the snapshot, the
database and Redis. `/api/health` stays the liveness check (the process answers).

The state functions (`snapshot_state`, `database_state`, `redis_state`) are what anything else
that reports on the server (a metrics exporter, a configuration check) reads.
"""

# No `from __future__ import annotations`: FastAPI reads the route's annotations at runtime.

import contextlib
import logging
from typing import Any

import anyio
from fastapi import APIRouter, FastAPI, Request
from pydantic import BaseModel, Field
from sqlalchemy import text
from starlette.responses import Response

from eqrisk.accounts.backends import BackendUnavailable
from eqrisk.accounts.book import Accounts
from eqrisk.accounts.limits import RateLimiter
from eqrisk.api.errors import ApiError, problem_response, problem_responses, request_id_of
from eqrisk.api.formats import json_response
from eqrisk.snapshot.versions import SnapshotError, SnapshotStore

log = logging.getLogger("eqrisk.api")

router = APIRouter(prefix="/api", tags=["Service B: operations"])


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
    """Redis's state (`off` without Redis: limits are counted in `limits`), asked (PING) at
    most once per `backend_retry_s`; blocking."""
    backend = limiter.backend
    if backend.state().state != "off" and not backend.reported_within(backend.retry_s):
        with contextlib.suppress(BackendUnavailable):
            limiter.ping()
    return {**backend.state().as_dict(), "limits": limiter.kind}


class ReadyResponse(BaseModel):
    ready: bool = Field(description="Serving: a snapshot is served and the database answers.")
    snapshot: dict[str, Any] = Field(description="state (up/down), version or error.")
    database: dict[str, Any] = Field(
        description="state (up/down/unknown), since (unix time of the last change), kind."
    )
    redis: dict[str, Any] = Field(
        description="state (up/down/off), since; limits: where they are counted (while Redis "
        "is down, in each process)."
    )


@router.get(
    "/ready",
    summary="Readiness: the snapshot, the database and Redis (no key needed)",
    description=(
        "200 while this server can answer keyed calls: a snapshot is served and the accounts "
        "database answers. Otherwise 503 (problem+json, with the same states and "
        "`Retry-After`), so that a load balancer takes it out. Redis down is reported but "
        "not a reason to be out: limits are then counted in each process."
    ),
    response_model=ReadyResponse,
    responses=problem_responses(503),
)
async def ready(request: Request) -> Response:
    app = request.app
    database = await anyio.to_thread.run_sync(database_state, app.state.accounts)
    redis = await anyio.to_thread.run_sync(redis_state, app.state.limiter)
    # The drivers' messages name hosts and ports: they stay in the log, not in a public answer.
    states = {
        "snapshot": snapshot_state(app.state.snapshots),
        "database": {k: v for k, v in database.items() if k != "error"},
        "redis": {k: v for k, v in redis.items() if k != "error"},
    }
    if states["snapshot"]["state"] == "up" and states["database"]["state"] == "up":
        return json_response({"ready": True, **states})
    down = [name for name in ("snapshot", "database") if states[name]["state"] != "up"]
    retry = str(max(1, round(app.state.accounts.backend.retry_s)))
    return problem_response(
        request,
        "SERVICE_UNAVAILABLE",
        f"not ready: {' and '.join(down)} unavailable",
        {"Retry-After": retry},
        ready=False,
        **states,
    )


def include(app: FastAPI, *, routes: bool = True) -> None:
    """The 503 for a backend error raised in any route, and (`routes`) `/api/ready`."""
    if routes:
        app.include_router(router)

    async def _unavailable(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, BackendUnavailable)
        error = unavailable(exc, request_id_of(request))
        return problem_response(request, error.code, error.detail, error.headers, **error.context)

    app.add_exception_handler(BackendUnavailable, _unavailable)

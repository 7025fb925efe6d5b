"""Typed dependencies shared by the routes of both services: the current snapshot and the caller.

Keys, limits and account states are checked by the gate middleware (`api/gate.py`) before a keyed
route runs; the routes read who the gate let in, and price their calls through the gate
(`api/endpoint.py`, the `Metered` dependency).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader, HTTPBearer

from eqrisk.api.errors import ApiError
from eqrisk.api.gate import Caller
from eqrisk.snapshot.versions import Snapshot, SnapshotError, SnapshotStore

__all__ = ["Caller", "DailyCaller", "RiskCaller", "SnapshotDep", "served_snapshot"]


def served_snapshot(store: SnapshotStore) -> Snapshot:
    """The snapshot to answer from; none usable (none built, or only a damaged one) is a 503
    that says how to fix it, for the routes and for the gate's price estimate alike."""
    try:
        return store.current()
    except SnapshotError as exc:
        raise ApiError("SERVICE_UNAVAILABLE", str(exc)) from exc


async def current_snapshot(request: Request) -> Snapshot:
    return served_snapshot(request.app.state.snapshots)


def _gated(request: Request, how: str) -> Caller:
    caller: Caller | None = request.scope.get("state", {}).get("caller")
    if caller is None:  # the gate lets no keyed route through without a caller
        raise ApiError("AUTHENTICATION_REQUIRED", f"send your API key {how}")
    return caller


# Security schemes: they document the two ways to send a Service B key in OpenAPI (the gate
# does the checking).
_bearer = HTTPBearer(
    auto_error=False, scheme_name="BearerKey", description="`Authorization: Bearer <key>`"
)
_api_key = APIKeyHeader(
    name="X-API-Key", auto_error=False, scheme_name="ApiKeyHeader", description="`X-API-Key`"
)


async def risk_caller(
    request: Request,
    _bearer_key: Annotated[Any, Security(_bearer)] = None,
    _header_key: Annotated[Any, Security(_api_key)] = None,
) -> Caller:
    """Service B: the key came as `Authorization: Bearer <key>` or `X-API-Key: <key>`."""
    return _gated(request, "as 'Authorization: Bearer <key>' or 'X-API-Key: <key>'")


_apikey = APIKeyHeader(
    name="apikey",
    auto_error=False,
    scheme_name="apikey",
    description="Your API key, in the `apikey` header (every Service A route needs one).",
)


async def daily_caller(
    request: Request, _apikey_key: Annotated[Any, Security(_apikey)] = None
) -> Caller:
    """Service A: the key came in the `apikey` header."""
    return _gated(request, "in the 'apikey' header")


SnapshotDep = Annotated[Snapshot, Depends(current_snapshot)]
RiskCaller = Annotated[Caller, Depends(risk_caller)]
DailyCaller = Annotated[Caller, Depends(daily_caller)]

"""Typed dependencies shared by the routes of both services: the current snapshot and the caller.

Authentication here is the minimal key check of the first HTTP release: a key is valid when it
is the documented demo key or one of `settings.api_keys`. The accounts module replaces
`Authenticator` with keys stored (hashed) in the accounts database.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated, Protocol

from fastapi import Depends, Request

from eqrisk.api.errors import ApiError
from eqrisk.settings import Settings
from eqrisk.snapshot.store import Snapshot, SnapshotError


@dataclass(frozen=True)
class Caller:
    """Who is calling: the key's id (never the key), its account, and whether it is the demo key."""

    key_id: str
    account_id: str | None
    is_demo: bool


class Authenticator(Protocol):
    def authenticate(self, key: str) -> Caller | None: ...


class StaticKeys:
    """Keys from the settings, compared in constant time."""

    def __init__(self, settings: Settings) -> None:
        self._demo = settings.demo_key.get_secret_value()
        self._keys = [k.get_secret_value() for k in settings.api_keys]

    def authenticate(self, key: str) -> Caller | None:
        if hmac.compare_digest(key.encode(), self._demo.encode()):
            return Caller(key_id="demo", account_id=None, is_demo=True)
        for n, known in enumerate(self._keys):
            if hmac.compare_digest(key.encode(), known.encode()):
                return Caller(key_id=f"static-{n}", account_id=None, is_demo=False)
        return None


def current_snapshot(request: Request) -> Snapshot:
    try:
        return request.app.state.snapshots.current()
    except SnapshotError as exc:
        raise ApiError("SERVICE_UNAVAILABLE", str(exc)) from exc


def _key_from(request: Request, header_names: tuple[str, ...], bearer: bool) -> str | None:
    if bearer:
        auth = request.headers.get("authorization", "")
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    for name in header_names:
        value = request.headers.get(name)
        if value and value.strip():
            return value.strip()
    return None


def _authenticate(request: Request, key: str | None, how: str) -> Caller:
    if key is None:
        raise ApiError("AUTHENTICATION_REQUIRED", f"send your API key {how}")
    caller = request.app.state.authenticator.authenticate(key)
    if caller is None:
        raise ApiError("INVALID_API_KEY", "the API key is unknown or revoked")
    request.state.caller = caller
    return caller


def risk_caller(request: Request) -> Caller:
    """Service B: `Authorization: Bearer <key>` or `X-API-Key: <key>`."""
    key = _key_from(request, ("x-api-key",), bearer=True)
    return _authenticate(request, key, "as 'Authorization: Bearer <key>' or 'X-API-Key: <key>'")


def daily_caller(request: Request) -> Caller:
    """Service A: the `apikey` header."""
    key = _key_from(request, ("apikey",), bearer=False)
    return _authenticate(request, key, "in the 'apikey' header")


SnapshotDep = Annotated[Snapshot, Depends(current_snapshot)]
RiskCaller = Annotated[Caller, Depends(risk_caller)]
DailyCaller = Annotated[Caller, Depends(daily_caller)]

"""Typed dependencies shared by the routes of both services: the current snapshot and the caller.

Keys, limits and account states are checked by the gate middleware (`api/gate.py`) before a keyed
route runs; the routes read who the gate let in, and price their calls through the gate
(`api/endpoint.py`, the `Metered` dependency).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Annotated, Any

from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader, HTTPBearer

from eqrisk.api.errors import ApiError
from eqrisk.api.gate import Caller
from eqrisk.snapshot.versions import (
    Snapshot,
    SnapshotError,
    SnapshotStore,
    UnknownVersion,
)

__all__ = [
    "Caller",
    "DailyCaller",
    "KeptSnapshots",
    "RiskCaller",
    "SnapshotDep",
    "served_snapshot",
    "snapshot_at",
]


def served_snapshot(store: SnapshotStore) -> Snapshot:
    """The snapshot to answer from; none usable (none built, or only a damaged one) is a 503
    that says how to fix it, for the routes and for the gate's price estimate alike."""
    try:
        return store.current()
    except SnapshotError as exc:
        raise ApiError("SERVICE_UNAVAILABLE", str(exc)) from exc


class KeptSnapshots:
    """Kept versions other than the current one, opened on demand (`version=`), the most
    recently asked `size` of them held open (each holds its index, built once)."""

    def __init__(self, size: int = 3) -> None:
        self.size = size
        self._open: OrderedDict[str, Snapshot] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, store: SnapshotStore, version: str) -> Snapshot:
        with self._lock:
            snap = self._open.get(version)
            if snap is not None and (snap.path / "manifest.json").exists():
                self._open.move_to_end(version)
                return snap
            self._open.pop(version, None)
        snap = Snapshot.open(store.root / version)  # checks the files; a pruned one fails
        with self._lock:
            self._open[version] = snap
            while len(self._open) > self.size:
                self._open.popitem(last=False)
        return snap


_KEPT = "kept_snapshots"


def version_not_found(store: SnapshotStore, name: str, why: str) -> ApiError:
    kept = store.store.versions()
    return ApiError(
        "VERSION_NOT_FOUND",
        f"no kept snapshot version {name!r} ({why}); kept: {', '.join(kept) or 'none'} "
        "(leave `version` out for the current one)",
        parameter="version",
        kept=kept,
    )


def snapshot_at(app_state: Any, name: str | None) -> Snapshot:
    """The snapshot a request asks for: the kept version `name` (its full name or number), or
    the current one when `name` is None or blank. An unknown or pruned version is a 404
    VERSION_NOT_FOUND listing the kept versions."""
    store: SnapshotStore = app_state.snapshots
    current = served_snapshot(store)
    if name is None or not name.strip():
        return current
    name = name.strip()
    if name == current.version:
        return current
    try:
        version = store.store.resolve(name)
    except UnknownVersion:
        raise version_not_found(store, name, "not kept") from None
    if version == current.version:
        return current
    kept: KeptSnapshots | None = getattr(app_state, _KEPT, None)
    if kept is None:
        kept = KeptSnapshots()
        setattr(app_state, _KEPT, kept)
    try:
        return kept.get(store, version)
    except SnapshotError as exc:
        raise version_not_found(store, name, str(exc)) from exc


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

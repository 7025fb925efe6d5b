"""The served risk model, read once: a session's `RiskModelDay` (F, the exposures H at a hedge
level, D, the factor keys) is built from a version's files on first use and kept in a bounded
LRU cache that every request of the process shares, keyed by (version folder, session, level);
what all sessions of a version share (`risk_arrays.RiskRows`: the symbols, the factor slots) is
read once per version. A version is immutable, so a cached day never goes stale; a new version
is a new key, and the old one's days fall out of the LRU.

Every reader of the risk model on a request path goes through `risk_day` (the portfolio's risk,
its hedge, `/api/specific-risk`): a `RiskModelDay` is the unit cached, so whatever the model
adds to it (more exposure columns per stock) is cached with it. Thread-safe: routes read it
from worker threads; two requests for a day not yet cached build it once (the second waits).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import numpy as np
from cachetools import LRUCache

from eqrisk.model.risk_model import RiskModelDay, served_factors
from eqrisk.snapshot.risk_arrays import (
    HEDGE_FIELDS,
    FactorCovarianceDay,
    RiskRows,
    factor_covariance_of,
    model_day,
    n_etf,
)
from eqrisk.snapshot.version import Snapshot

__all__ = [
    "MAX_DAYS",
    "MAX_VERSIONS",
    "cached_days",
    "clear",
    "day_level",
    "implied_etfs",
    "risk_day",
    "risk_rows",
    "served_covariance",
]

MAX_DAYS = 16  # (version, session, level) days kept: the served version's recent sessions
MAX_VERSIONS = 4  # versions whose RiskRows are kept

DayKey = tuple[str, int, int]

_lock = threading.Lock()
_days: LRUCache[DayKey, RiskModelDay] = LRUCache(maxsize=MAX_DAYS)
_rows: LRUCache[str, RiskRows] = LRUCache(maxsize=MAX_VERSIONS)
_building: dict[object, threading.Lock] = {}


def day_level(snap: Snapshot) -> int:
    """The level of the model's own exposures (the level its F and D were estimated at)."""
    return int(snap.manifest["risk"]["params"]["level"])


def _once(key: object) -> threading.Lock:
    """The lock under which the value of `key` is built (one build per key at a time)."""
    with _lock:
        return _building.setdefault(key, threading.Lock())


def risk_rows(snap: Snapshot) -> RiskRows:
    """The version's `RiskRows`, read once."""
    key = str(snap.path)
    with _lock:
        found = _rows.get(key)
    if found is not None:
        return found
    with _once(("rows", key)):
        with _lock:
            found = _rows.get(key)
        if found is None:
            found = RiskRows.read(snap.path, snap.manifest)
            with _lock:
                _rows[key] = found
                _building.pop(("rows", key), None)
    return found


def risk_day(snap: Snapshot, t: int, level: int | None = None) -> RiskModelDay:
    """The risk model of session t with the exposures of `level` (default: the model's),
    built once per (version, session, level) and shared."""
    key: DayKey = (str(snap.path), int(t), level or day_level(snap))
    with _lock:
        found = _days.get(key)
    if found is not None:
        return found
    with _once(key):
        with _lock:
            found = _days.get(key)
        if found is None:
            arrays = {name: snap.array(name) for name in (*HEDGE_FIELDS, "risk_specific_var")}
            found = model_day(
                snap.path, snap.manifest, arrays, key[1], level=key[2], rows=risk_rows(snap)
            )
            _ = found.row_of, found.usable  # built here, once, not by the first request
            with _lock:
                _days[key] = found
                _building.pop(key, None)
    return found


def served_covariance(snap: Snapshot, t: int) -> FactorCovarianceDay:
    """F of session t as served (`/api/factor-covariance`): the factors its answers carry
    (`served_factors`: a style factor without a forecast that session is left out)."""
    f = factor_covariance_of(snap.path, snap.manifest, t)
    keep = np.flatnonzero(served_factors(f.cov, n_etf(snap.manifest)))
    if len(keep) == len(f.keys):
        return f
    pick = keep.tolist()
    return FactorCovarianceDay(
        t, [f.keys[k] for k in pick], [f.levels[k] for k in pick], f.cov[np.ix_(keep, keep)]
    )


def implied_etfs(snap: Snapshot, tickers: Iterable[str]) -> list[str]:
    """The ETFs the risk model ties `tickers` to (each one's market, sector and subsector
    factor that is an ETF, not a group portfolio): a book of these tickers' benchmark and hedge
    legs. Sorted; empty for a version without the risk model."""
    if "risk" not in snap.manifest:
        return []
    rows = risk_rows(snap)
    keys = list(snap.manifest["risk"]["keys"])
    found = [rows.row_of[t] for t in tickers if t in rows.row_of]
    slots = {int(k) for k in rows.fidx[found].ravel().tolist() if k >= 0}
    return sorted(keys[k] for k in slots if not keys[k].startswith("group:"))


def cached_days() -> list[DayKey]:
    """The keys held now (least recently used first)."""
    with _lock:
        return list(_days.keys())


def clear() -> None:
    """Forget every cached day and version (tests; a process never needs it)."""
    with _lock:
        _days.clear()
        _rows.clear()

"""Answer shapes of the real Service B (RiskModels V2) where the specification shows none.

Code written against the real service reads these shapes (docs/SERVICE-B-WIRE.md, kept in
../shared/docs): the `hedge_levels` block of /api/metrics and of a batch entry, the batch entry
itself (`status: "success"`, a flat `full_metrics`, the latest `hedge_ratios` object, column-wise
`returns`, entry `meta`, a string `error`), the column-wise /api/l3-decomposition answer and the
batch long table of the CSV/Parquet formats. Everything here is read from the snapshot arrays
the routes already use; nothing is estimated again.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson

from eqrisk.api import lstar
from eqrisk.api.errors import ApiError
from eqrisk.api.fields import (
    HEDGE_RATIO_COLUMNS,
    L3_COLUMNS,
    LONG_NAMES,
    METRICS_FIELDS,
    RETURNS_COLUMNS,
)
from eqrisk.api.formats import dumps
from eqrisk.api.plans import BatchPlan, SeriesPlan
from eqrisk.snapshot.index import Symbol
from eqrisk.snapshot.versions import Snapshot

# Level -> (its hr/er fields by the block's key names, the ETFs it hedges with).
_LEVELS: dict[str, dict[str, str]] = {
    "L1": {"market_hr": "l1_mkt_hr", "market_er": "l1_mkt_er", "residual_er": "l1_res_er"},
    "L2": {
        "market_hr": "l2_mkt_hr",
        "sector_hr": "l2_sec_hr",
        "market_er": "l2_mkt_er",
        "sector_er": "l2_sec_er",
        "residual_er": "l2_res_er",
    },
    "L3": {
        "market_hr": "l3_mkt_hr",
        "sector_hr": "l3_sec_hr",
        "subsector_hr": "l3_sub_hr",
        "market_er": "l3_mkt_er",
        "sector_er": "l3_sec_er",
        "subsector_er": "l3_sub_er",
        "residual_er": "l3_res_er",
    },
}
_BLOCK_KEYS = (
    "market_hr",
    "sector_hr",
    "subsector_hr",
    "market_er",
    "sector_er",
    "subsector_er",
    "residual_er",
)
# The latest hedge ratios of a batch entry: the real service's short keys -> eqrisk fields.
HEDGE_RATIO_KEYS: dict[str, str] = {
    "l1_market": "l1_mkt_hr",
    "l2_market": "l2_mkt_hr",
    "l2_sector": "l2_sec_hr",
    "l3_market": "l3_mkt_hr",
    "l3_sector": "l3_sec_hr",
    "l3_subsector": "l3_sub_hr",
}
_L3_HR = ("l3_market_hr", "l3_sector_hr", "l3_subsector_hr")  # their LONG_NAMES
# The batch long table (format parquet / csv): output column -> snapshot array.
LONG_TABLE_COLUMNS: dict[str, str] = {
    "returns_gross": RETURNS_COLUMNS["returns_gross"],
    **{LONG_NAMES[k]: v for k, v in HEDGE_RATIO_COLUMNS.items()},
}


def _num(value: float) -> float | None:
    return None if math.isnan(value) else value


def _listed(values: np.ndarray) -> list[Any] | np.ndarray:
    """JSON-ready: NaN as null. A float64 array goes to orjson as it is (it writes the same
    text as for the Python floats, NaN as null, without a Python object per value)."""
    if values.dtype == np.float64:
        return np.ascontiguousarray(values)
    return [None if v != v else v for v in values.tolist()]


def _dates(snap: Snapshot, plan: SeriesPlan) -> list[str]:
    """The plan's sessions as YYYY-MM-DD texts, picked from the version's texts."""
    texts: list[str] = snap.session_texts[plan.lo : plan.hi][plan.mask].tolist()
    return texts


def latest_values(snap: Snapshot, sym: Symbol) -> dict[str, float | None]:
    """The /api/metrics values of a priced symbol on its last session (NaN -> None)."""
    t = sym.last
    return {
        name: _num(float(snap.array(field)[sym.row, t])) for name, field in METRICS_FIELDS.items()
    }


def hedge_levels(sym: Symbol, values: dict[str, float | None]) -> dict[str, Any]:
    """`{L1, L2, L3, statistical_lstar, recommended_level}` from the flat values.

    A level whose own ETF's hedge ratio is null is left out (an ETF's L2/L3, a stock without a
    subsector ETF at L3, a stock whose sector ETF's sample is still short of min_obs at L2 and
    L3: those columns carry the level above): the real client counts a missing block as no
    hedge. `statistical_lstar` is the L* rule of the latest session (the level whose
    out-of-sample hedge left the least residual variance, docs/decisions/drop-in-routes.md) and
    `recommended_level` names the deepest level the symbol has.
    """
    etfs = {
        "L1": {"market": sym.market_etf, "sector": None, "subsector": None},
        "L2": {"market": sym.market_etf, "sector": sym.sector_etf, "subsector": None},
        "L3": {"market": sym.market_etf, "sector": sym.sector_etf, "subsector": sym.subsector_etf},
    }
    out: dict[str, Any] = {}
    for level, fields in _LEVELS.items():
        block: dict[str, Any] = {key: values.get(fields[key]) if key in fields else None
                                 for key in _BLOCK_KEYS}  # fmt: skip
        if all(block[k] is None for k in ("market_hr", "sector_hr", "subsector_hr")):
            continue
        if level == "L2" and block["sector_hr"] is None:
            continue  # no sector level (yet): L2 would only repeat L1
        if level == "L3" and block["subsector_hr"] is None:
            continue  # no subsector level (yet): L3 would only repeat L2
        block["hedge_etfs"] = etfs[level]
        out[level] = block
    out["statistical_lstar"] = statistical_lstar(values, out)
    out["recommended_level"] = max((k for k in _LEVELS if k in out), default=None)
    return out


def statistical_lstar(values: dict[str, float | None], blocks: dict[str, Any]) -> str | None:
    """The L* rule (`api/lstar.py`) on the latest session's hedge quality, among the levels
    the symbol has a block for; None without an L1 quality."""
    hq = np.array(
        [[np.nan if (v := values.get(f)) is None else v] for f in lstar.HQ_FIELDS], dtype=float
    )
    for k, level in enumerate(lstar.LEVELS):
        if level not in blocks:
            hq[k] = np.nan
    (name,) = lstar.level_names(lstar.lstar_levels(hq))
    return name


def entry_meta(snap: Snapshot, sym: Symbol) -> dict[str, Any]:
    """A batch entry's `meta`: the symbol's ETFs and names under the real service's keys."""
    return {
        **sym.meta(),
        "ticker": sym.ticker,
        "name": sym.company_name,
        "subsector_etf_symbol": sym.subsector_etf,
        "universe": snap.manifest.get("universe", snap.manifest.get("data_source")),
    }


def flat_metrics(snap: Snapshot, sym: Symbol, values: dict[str, float | None]) -> dict[str, Any]:
    """A batch entry's flat `full_metrics`: ticker, date (= teo), the values, staleness."""
    teo = snap.sessions[sym.last].astype(object)
    behind = snap.index.sessions_behind(sym)
    return {
        "ticker": sym.ticker,
        "date": teo,
        "teo": teo,
        **values,
        "stale": bool(behind),
        "sessions_behind": behind,
    }


def returns_columns(snap: Snapshot, plan: SeriesPlan) -> dict[str, Any]:
    """Column-wise returns of a batch entry: `dates`, `values` (gross return) and the L3 hedge
    ratio series under their explicit names and under the legacy `l1`/`l2`/`l3`. Each hedge
    ratio series is written as JSON once and its text placed under both names (an
    `orjson.Fragment`: the same bytes as the array written twice, for half the work)."""
    mapping = {"values": "return", **{n: LONG_TABLE_COLUMNS[n] for n in _L3_HR}}
    cols = {k: _listed(plan.column(snap, field)) for k, field in mapping.items()}
    hr = {name: orjson.Fragment(dumps(cols[name])) for name in _L3_HR}
    return {
        "dates": _dates(snap, plan),
        "values": cols["values"],
        "l1": hr["l3_market_hr"],
        "l2": hr["l3_sector_hr"],
        "l3": hr["l3_subsector_hr"],
        **hr,
    }


def l3_columns(snap: Snapshot, plan: SeriesPlan) -> dict[str, Any]:
    """`{dates, l3_market_hr, ..., l3_residual_er}`: the column layout of /api/l3-decomposition."""
    cols = {k: _listed(plan.column(snap, field)) for k, field in l3_long_columns().items()}
    return {"dates": _dates(snap, plan), **cols}


def l3_long_columns() -> dict[str, str]:
    """Long output name -> snapshot array, for the L3 decomposition."""
    return {long: L3_COLUMNS[short] for short, long in LONG_NAMES.items()}


def error_entry(ticker: str, err: ApiError) -> dict[str, Any]:
    """A failed batch entry: `error` is the sentence (the real service's readers take a
    string), `code` the machine code, and the error's context beside them."""
    return {
        **err.context,
        "status": "error",
        "ticker": ticker,
        "error": err.detail,
        "code": err.code,
        "detail": err.detail,
    }


def batch_entry(
    snap: Snapshot, ticker: str, plan: SeriesPlan, metrics: tuple[str, ...]
) -> dict[str, Any]:
    """A succeeded batch entry in the real service's shape; `ticker` is the name asked for
    (the symbol's own name is in `meta.ticker`)."""
    sym = plan.symbol
    values = latest_values(snap, sym)
    entry: dict[str, Any] = {"status": "success", "ticker": ticker}
    if "full_metrics" in metrics:
        entry["full_metrics"] = flat_metrics(snap, sym, values)
    if "hedge_ratios" in metrics:
        entry["hedge_ratios"] = {k: values[f] for k, f in HEDGE_RATIO_KEYS.items()}
    if "returns" in metrics:
        entry["returns"] = returns_columns(snap, plan)
    if "l3_decomposition" in metrics:
        entry["l3_decomposition"] = l3_columns(snap, plan)
    entry["hedge_levels"] = hedge_levels(sym, values)
    entry["meta"] = entry_meta(snap, sym)
    return entry


def batch_results(snap: Snapshot, plan: BatchPlan) -> list[bytes]:
    """`results`, keyed by the ticker as asked (a class twin keeps the asked name), as JSON
    text in pieces: joined, what `orjson.dumps` writes for the object of the entries. Each
    entry is written on its own: one `orjson.dumps` of a 50 MB batch would hold the
    interpreter lock, and so the event loop, for its whole time (tens of ms); an entry's holds
    it for well under one, and the answer is copied once, by the join."""
    parts: list[bytes] = []
    for ticker, item in plan.items.items():
        if isinstance(item, ApiError):
            entry = error_entry(ticker, item)
        else:
            entry = batch_entry(snap, ticker, item, plan.metrics)
        parts += [b"," if parts else b"{", dumps(ticker), b":", dumps(entry)]
    parts.append(b"}" if parts else b"{}")
    return parts


def long_table(snap: Snapshot, plan: BatchPlan) -> dict[str, np.ndarray]:
    """The batch long table: one row per (ticker, date) of the succeeded tickers, in request
    order, then date order."""
    parts: list[dict[str, np.ndarray]] = []
    for ticker, item in plan.items.items():
        if isinstance(item, ApiError):
            continue
        cols = item.columns(snap, LONG_TABLE_COLUMNS)
        n = len(cols["date"])
        parts.append({"ticker": np.array([ticker] * n, dtype=object), **cols})
    names = ["ticker", "date", *LONG_TABLE_COLUMNS]
    if not parts:
        empty: dict[str, np.ndarray] = {"ticker": np.array([], dtype=object)}
        empty["date"] = np.array([], dtype="datetime64[D]")
        empty.update({k: np.array([], dtype=np.float64) for k in LONG_TABLE_COLUMNS})
        return empty
    return {name: np.concatenate([p[name] for p in parts]) for name in names}

"""`GET /api/macro-factors` and `GET /api/etf/factor-returns`: the real Service B's macro and
style factor series (from the data set's ETFs, `api/macro_factors.py`) and the trailing returns
of the market and sector ETFs (docs/decisions/drop-in-routes.md)."""

# No `from __future__ import annotations`: pydantic and FastAPI read these annotations.

from dataclasses import dataclass
from datetime import date
from typing import Any, Literal

import numpy as np
from pydantic import Field
from starlette.responses import Response

from eqrisk.api import macro_factors as mf
from eqrisk.api.answers import document, snap_headers
from eqrisk.api.endpoint import Call, Doc, Endpoint
from eqrisk.api.errors import ApiError
from eqrisk.api.formats import JSON, render
from eqrisk.api.models import ERRORS_NO_TICKER
from eqrisk.api.params import FORMAT_DESCRIPTION, FORMATS, Format, IsoDate, VersionedParams
from eqrisk.api.sizes import Size, approx_bytes
from eqrisk.snapshot.index import minus_years
from eqrisk.snapshot.versions import Snapshot

DEFAULT_YEARS, MAX_SPAN_YEARS = 5, 20


class MacroParams(VersionedParams):
    factors: str | None = Field(
        None,
        max_length=2000,
        description=(
            "Factor keys, comma- or space-separated, case-insensitive, aliases accepted "
            f"(default: all 18: {', '.join(mf.DEFAULT_KEYS)}); unknown ones are dropped with "
            "a warning, none known is a 400."
        ),
        examples=["credit,oil,gold,momentum"],
    )
    factor: str | None = Field(None, max_length=2000, description="Same as `factors`.")
    start: IsoDate | None = Field(None, description="First date (default: end - 5 years).")
    end: IsoDate | None = Field(None, description="Last date (default: data_as_of).")
    format: Format | None = Field(None, description=FORMAT_DESCRIPTION)


@dataclass(frozen=True)
class MacroPlan:
    series: list[mf.Series]
    warnings: list[str]
    lo: int
    hi: int
    start: date
    end: date
    rows: int


def plan_macro(snap: Snapshot, p: MacroParams) -> MacroPlan:
    idx = snap.index
    if p.factors is not None and p.factor is not None:
        raise ApiError(
            "INVALID_PARAMETER",
            "factors and factor are the same parameter; give one of the two",
            parameters=["factors", "factor"],
        )
    keys, unknown = mf.parse_keys(p.factors if p.factors is not None else p.factor)
    if not keys:
        raise ApiError(
            "INVALID_PARAMETER",
            f"no known factor key in {unknown}; accepted: {', '.join(mf.DEFAULT_KEYS)}",
            parameter="factors",
            accepted=list(mf.DEFAULT_KEYS),
        )
    if idx.data_as_of is None:
        raise ApiError("SERVICE_UNAVAILABLE", "the served snapshot has no sessions")
    end = p.end or idx.data_as_of
    start = p.start or minus_years(end, DEFAULT_YEARS)
    if start > end:
        raise ApiError(
            "INVALID_PARAMETER",
            f"start={start} is after end={end}; give start <= end",
            parameters=["start", "end"],
        )
    if start < minus_years(end, MAX_SPAN_YEARS):
        raise ApiError(
            "INVALID_PARAMETER",
            f"start={start} to end={end} spans more than {MAX_SPAN_YEARS} years",
            parameters=["start", "end"],
        )
    warnings = [f"unknown factor key dropped: {name}" for name in unknown]
    series = [mf.series_of(snap, key) for key in keys]
    warnings += [s.warning for s in series if s.warning]
    lo, hi = idx.date_range(start, end)
    ret = snap.array("return")
    rows = sum(int(np.isfinite(ret[s.row, lo:hi]).sum()) for s in series if s.row is not None)
    return MacroPlan(series, warnings, lo, hi, start, end, rows)


def size_macro(plan: MacroPlan, p: MacroParams) -> Size:
    return Size(1, plan.rows, approx_bytes(plan.rows, 1, p.format or "json", 2))


def macro_columns(snap: Snapshot, plan: MacroPlan) -> dict[str, np.ndarray]:
    """The long table: factor_key, teo, return_gross, sorted by teo, then the asked order."""
    keys: list[np.ndarray] = []
    days: list[np.ndarray] = []
    values: list[np.ndarray] = []
    order: list[np.ndarray] = []
    sessions = snap.sessions[plan.lo : plan.hi]
    for k, s in enumerate(plan.series):
        if s.row is None:
            continue
        r = np.asarray(snap.array("return")[s.row, plan.lo : plan.hi], dtype=np.float64)
        ok = np.isfinite(r)
        keys.append(np.full(int(ok.sum()), s.key, dtype=object))
        days.append(sessions[ok])
        values.append(r[ok])
        order.append(np.full(int(ok.sum()), k))
    if not keys:
        return {
            "factor_key": np.array([], dtype=object),
            "teo": np.array([], dtype="datetime64[D]"),
            "return_gross": np.array([], dtype=np.float64),
        }
    teo = np.concatenate(days).astype("datetime64[D]")
    rank = np.lexsort((np.concatenate(order), teo))
    return {
        "factor_key": np.concatenate(keys)[rank],
        "teo": teo[rank],
        "return_gross": np.concatenate(values)[rank],
    }


def render_macro(call: Call[MacroParams, MacroPlan]) -> Response:
    snap, plan = call.snap, call.plan
    cols = macro_columns(snap, plan)
    if call.fmt != JSON:
        return render(call.fmt, cols, headers=snap_headers(snap), filename="macro_factors")
    meta = {
        s.key: {"series": s.etf, "category": mf.BY_KEY[s.key].sleeve}
        | ({"proxy_for": mf.BY_KEY[s.key].etfs[0]} if s.proxy else {})
        for s in plan.series
    }
    series = [
        {"factor_key": k, "teo": str(t), "return_gross": v, "metadata": meta[k]}
        for k, t, v in zip(
            cols["factor_key"].tolist(),
            cols["teo"].tolist(),
            cols["return_gross"].tolist(),
            strict=True,
        )
    ]
    warnings = list(plan.warnings)
    if not series:
        warnings.append("no rows: none of the asked factors has a return in the range")
    doc = {
        "factors_requested": [s.key for s in plan.series],
        "start": plan.start,
        "end": plan.end,
        "row_count": len(series),
        "series": series,
        "warnings": warnings,
    }
    return document(snap, doc)


MACRO = Endpoint(
    path="/api/macro-factors",
    service="risk",
    price_key="macro-factors",
    params=MacroParams,
    plan=plan_macro,
    size=size_macro,
    tickers=lambda plan: tuple(s.etf for s in plan.series if s.etf),
    formats=FORMATS,
    render=render_macro,
    threaded=True,
    doc=Doc(
        name="macro_factors",
        summary="Macro and style factor return series (the real Service B's keys)",
        description=(
            "Long rows `{factor_key, teo, return_gross, metadata}` sorted by date, from the "
            "data set's ETFs (credit HYG, oil USO, gold GLD, momentum MTUM, quality QUAL, "
            "low_vol USMV, value VLUE, growth IWF, size IWM; term_spread from IEF, labelled a "
            "proxy for VGIT). A key whose ETF the data lacks has no rows and a warning. "
            "Default end: data_as_of; start: 5 years before; a span over 20 years is a 400."
        ),
        responses=ERRORS_NO_TICKER,
    ),
)

# ------------------------------------------------------------------------------ ETF returns

ETF_WINDOWS = {"1d": 1, "21d": 21, "63d": 63, "252d": 252}
SECTOR_SPDRS = ("XLE", "XLB", "XLI", "XLY", "XLP", "XLV", "XLF", "XLK", "XLC", "XLU", "XLRE")


class EtfFactorParams(VersionedParams):
    sleeve: Literal["market", "sector", "all"] = Field(
        "all", description="market (SPY), sector (the 11 sector SPDRs) or all."
    )
    tickers: str | None = Field(
        None, max_length=400, description="Comma-separated ETFs of that scope (default: all)."
    )
    teo: IsoDate | None = Field(
        None, description="The session the windows end on (default: data_as_of)."
    )


@dataclass(frozen=True)
class EtfPlan:
    etfs: list[tuple[str, str]]  # (ticker, sleeve) served
    t: int


def plan_etf(snap: Snapshot, p: EtfFactorParams) -> EtfPlan:
    idx = snap.index
    scope = [("SPY", "market")] if p.sleeve in ("market", "all") else []
    if p.sleeve in ("sector", "all"):
        scope += [(etf, "sector") for etf in SECTOR_SPDRS]
    if p.tickers is not None:
        asked = [t.strip().upper() for t in p.tickers.split(",") if t.strip()]
        allowed = dict(scope)
        outside = [t for t in asked if t not in allowed]
        if outside or not asked:
            raise ApiError(
                "INVALID_PARAMETER",
                f"tickers outside the {p.sleeve} scope: {', '.join(outside) or '(none given)'};"
                f" accepted: {', '.join(allowed)}",
                parameter="tickers",
                accepted=list(allowed),
            )
        scope = [(t, allowed[t]) for t in dict.fromkeys(asked)]
    if idx.data_as_of is None:
        raise ApiError("SERVICE_UNAVAILABLE", "the served snapshot has no sessions")
    day = p.teo or idx.data_as_of
    t = int(np.searchsorted(idx.sessions, np.datetime64(day, "D"), side="right")) - 1
    if t < 0:
        raise ApiError(
            "INVALID_PARAMETER", f"teo={day} is before the first session", parameter="teo"
        )
    served = [(e, s) for e, s in scope if e in idx.symbols]
    return EtfPlan(served, t)


def size_etf(plan: EtfPlan, p: EtfFactorParams) -> Size:
    return Size(1, len(plan.etfs), 500 + 220 * len(plan.etfs))


def trailing_return(snap: Snapshot, row: int, t: int, sessions: int) -> float | None:
    """Compounded simple return over the `sessions` sessions ending at t (None: a gap)."""
    if t + 1 - sessions < 0:
        return None
    r = np.asarray(snap.array("return")[row, t + 1 - sessions : t + 1], dtype=np.float64)
    value = float(np.prod(1.0 + r) - 1.0)
    return value if np.isfinite(value) else None


def render_etf(call: Call[EtfFactorParams, EtfPlan]) -> Response:
    snap, plan = call.snap, call.plan
    idx = snap.index
    rows: list[dict[str, Any]] = []
    for etf, sleeve in plan.etfs:
        sym = idx.symbols[etf]
        close = float(snap.array("price_close")[sym.row, plan.t])
        rows.append(
            {
                "ticker": etf,
                "sleeve": sleeve,
                "name": sym.company_name,
                "close": close if np.isfinite(close) else None,
                "returns": {
                    w: trailing_return(snap, sym.row, plan.t, n) for w, n in ETF_WINDOWS.items()
                },
            }
        )
    doc = {
        "teo": snap.sessions[plan.t].astype(object),
        "filter": {"sleeve": call.params.sleeve, "tickers": call.params.tickers},
        "windows": list(ETF_WINDOWS),
        "rows": rows,
    }
    return document(snap, doc)


ETF_FACTORS = Endpoint(
    path="/api/etf/factor-returns",
    service="risk",
    price_key="etf/factor-returns",
    params=EtfFactorParams,
    plan=plan_etf,
    size=size_etf,
    asked=lambda p: [t.strip().upper() for t in (p.tickers or "").split(",") if t.strip()],
    tickers=lambda plan: tuple(etf for etf, _ in plan.etfs),
    render=render_etf,
    threaded=True,
    doc=Doc(
        name="etf_factor_returns",
        summary="Trailing returns of the market and sector ETFs (the real Service B's shape)",
        description=(
            "Rows `{ticker, sleeve, name, close, returns: {1d, 21d, 63d, 252d}}` for SPY and "
            "the 11 sector SPDRs the data set holds, compounded daily returns ending on `teo` "
            "(a window with a missing return is null); another ticker is a 400."
        ),
        responses=ERRORS_NO_TICKER,
    ),
)

"""The risk model's routes as client calls: a portfolio's risk (`/api/portfolio/risk`) read
into one frame per breakdown, and the model itself (F: `/api/factor-covariance`, H and D:
`/api/specific-risk`) as DataFrames an optimiser takes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import pandas as pd

from eqrisk.client.bind import method
from eqrisk.client.calls import Call, extra
from eqrisk.client.frames import frame_of


@dataclass(frozen=True)
class PortfolioRisk:
    """One answer of `/api/portfolio/risk`, every figure in the units of the positions.

    `summary`: a row per book (`portfolio`, and `active`, the positions less the benchmark,
    whose vol is the tracking error) with vol daily and annual, factor and specific vol;
    `by_level`: the Euler contributions per level (rows market, sector, subsector, style,
    specific; a column per book); `factors` and `positions`: exposure or position, marginal,
    contribution and share (index factor / ticker; the benchmark's in `active_factors` and
    `active_positions`); `hedge`: the ETF legs (notional, tradable, exposure after);
    `hedge_after`: what the hedge leaves (`vol_after_hedge`) by level, the style and the
    specific risk the ETFs do not remove; `unused`: ticker -> why; `notes`: what the figures leave out (a position modelled on the
    market factor alone); `positions` has each one's `model_level`. `raw` is the JSON answer."""

    date: str
    summary: pd.DataFrame
    by_level: pd.DataFrame
    factors: pd.DataFrame
    positions: pd.DataFrame
    active_factors: pd.DataFrame | None
    active_positions: pd.DataFrame | None
    hedge: pd.DataFrame
    vol_after_hedge: float
    hedge_after: pd.Series
    unused: dict[str, str]
    raw: dict[str, Any]

    @property
    def vol(self) -> float:
        return float(self.raw["portfolio"]["vol_daily"])

    @property
    def tracking_error(self) -> float | None:
        active = self.raw.get("tracking_error")
        return None if active is None else float(active["vol_daily"])

    @property
    def used_share(self) -> float:
        """The share of the book's gross size the answer used (`partial` below 0.9)."""
        return float(self.raw.get("used_share", 1.0))

    @property
    def partial(self) -> bool:
        return bool(self.raw.get("partial", False))

    @property
    def notes(self) -> list[str]:
        """What the figures leave out, e.g. "QQQ: an ETF that is not a factor of the model,
        modelled on the market factor alone"."""
        return [str(n) for n in self.raw.get("notes", [])]


SUMMARY = ("vol_daily", "vol_annual", "factor_vol_daily", "style_vol_daily", "specific_vol_daily")


def portfolio_risk_of(doc: dict[str, Any]) -> PortfolioRisk:
    books = {"portfolio": doc["portfolio"]}
    if doc.get("tracking_error") is not None:
        books["active"] = doc["tracking_error"]
    summary = pd.DataFrame(
        {name: {k: b.get(k, 0.0) for k in SUMMARY} for name, b in books.items()}
    ).T
    by_level = pd.DataFrame({name: b["by_level"] for name, b in books.items()})
    active = books.get("active")
    return PortfolioRisk(
        date=doc["date"],
        summary=summary,
        by_level=by_level,
        factors=pd.DataFrame(doc["portfolio"]["factors"]).set_index("factor"),
        positions=pd.DataFrame(doc["portfolio"]["positions"]).set_index("ticker"),
        active_factors=None if active is None else pd.DataFrame(active["factors"]),
        active_positions=None if active is None else pd.DataFrame(active["positions"]),
        hedge=pd.DataFrame(
            doc["hedge"]["legs"], columns=["etf", "notional", "tradable", "exposure_after"]
        ).set_index("etf"),
        vol_after_hedge=float(doc["hedge"]["vol_after_daily"]),
        hedge_after=pd.Series(doc["hedge"].get("after", {}), dtype=float),
        unused={u["ticker"]: u["reason"] for u in doc["unused"]},
        raw=doc,
    )


def portfolio_risk(
    positions: Mapping[str, float],
    benchmark: str | Mapping[str, float] | None,
    date: str | None,
    level: str | None,
    units: str | None,
    style_neutral: bool = False,
) -> Call[PortfolioRisk]:
    body: dict[str, Any] = {"positions": {str(k): float(v) for k, v in positions.items()}}
    if style_neutral:
        body["style_neutral"] = True
    if isinstance(benchmark, Mapping):
        body["benchmark"] = {str(k): float(v) for k, v in benchmark.items()}
    elif benchmark is not None:
        body["benchmark"] = benchmark
    optional = {"date": date, "level": level, "units": units}
    body.update({k: v for k, v in optional.items() if v is not None})
    return Call("POST", "/api/portfolio/risk", lambda r: portfolio_risk_of(r.json()), body=body)


def _covariance(response: httpx.Response) -> pd.DataFrame:
    if not response.headers.get("content-type", "").startswith("application/json"):
        frame = frame_of(response, "-").set_index("factor")
        return frame.drop(columns=["level"])
    doc = response.json()
    frame = pd.DataFrame(doc["matrix"], index=doc["factors"], columns=doc["factors"], dtype=float)
    frame.attrs.update(
        {"date": doc["date"], "levels": dict(zip(doc["factors"], doc["levels"], strict=True))}
    )
    return frame


def factor_covariance(date: str | None, format: str | None = None) -> Call[pd.DataFrame]:
    return Call("GET", "/api/factor-covariance", _covariance, {"date": date, "format": format})


def _specific(response: httpx.Response) -> pd.DataFrame:
    if not response.headers.get("content-type", "").startswith("application/json"):
        return frame_of(response, "-").set_index("ticker")
    doc = response.json()
    frame = pd.DataFrame(doc["data"]).set_index("ticker")
    frame.attrs["date"] = doc["date"]
    return frame


def specific_risk(date: str | None, format: str | None = None) -> Call[pd.DataFrame]:
    return Call("GET", "/api/specific-risk", _specific, {"date": date, "format": format})


def _styles(response: httpx.Response) -> pd.DataFrame:
    if not response.headers.get("content-type", "").startswith("application/json"):
        return frame_of(response, "-").set_index("ticker")
    doc = response.json()
    frame = pd.DataFrame(doc["data"]).set_index("ticker")
    frame.attrs.update(
        {
            "date": doc["date"],
            "factors": pd.DataFrame(doc["factors"]).set_index("factor"),
            "r2": doc["r2"],
            "regression_stocks": doc["regression_stocks"],
        }
    )
    return frame


class RiskMethods:
    """Mixed into `Client` and `AsyncClient` (bound by `bind.method` to the client's kind)."""

    @method
    def style_exposures(
        date: str | None = None, *, format: str | None = None, version: str | None = None
    ) -> Call[pd.DataFrame]:
        """GET /api/style-exposures: each stock's exposure to the second layer's style factors on
        a session (rows: tickers); `attrs` hold the session's factor returns, t-statistics and R^2
        (JSON answers)."""
        call = Call("GET", "/api/style-exposures", _styles, {"date": date, "format": format})
        return extra(call, version=version)

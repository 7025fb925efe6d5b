"""The whole risk model over a panel: returns, volatility, the L3 cascade, combined factor and
residual returns per level, and Service A's flat market + sector factor model. Pure: arrays in,
arrays out, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from eqrisk.data.panel import Panel
from eqrisk.model.cascade import rolling_cascade, rolling_std
from eqrisk.model.layout import FactorLayout, factor_layout
from eqrisk.model.quality import hedge_quality
from eqrisk.model.returns import log_returns, simple_returns

ANNUALIZATION = np.sqrt(252.0)
VOL_SHORT_WINDOW = 23
VOL_SHORT_MIN_OBS = 16
MARKET_FACTOR = "Mkt"
LEVEL_HR = {
    1: ("l1_mkt_hr",),
    2: ("l2_mkt_hr", "l2_sec_hr"),
    3: ("l3_mkt_hr", "l3_sec_hr", "l3_sub_hr"),
}


@dataclass(frozen=True)
class ModelParams:
    """Estimation settings, reported with every answer as `_metadata.method`."""

    window: int = 252
    min_obs: int = 126
    halflife: float | None = None

    def __post_init__(self) -> None:
        if self.min_obs > self.window:
            raise ValueError(f"min_obs ({self.min_obs}) cannot exceed window ({self.window})")

    @property
    def weighting(self) -> str:
        return "equal" if self.halflife is None else "ewma"

    def describe(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "min_obs": self.min_obs,
            "weighting": self.weighting,
            "halflife": self.halflife,
            "returns": "simple, consecutive sessions only",
            "vol_23d_min_obs": VOL_SHORT_MIN_OBS,
        }


@dataclass
class ModelResult:
    """Per-symbol metric arrays (n x T) plus the factor series and each symbol's hierarchy."""

    symbols: np.ndarray
    sessions: np.ndarray
    metrics: dict[str, np.ndarray]
    # The series each symbol is hedged with: market/sector/subsector names ("SPY", "XLK", or
    # "group:<level>:<name>" for a cap-weighted group portfolio where the data has no ETF).
    hierarchy: pd.DataFrame
    flat: FlatModel
    factor_keys: list[str]  # name of each factor row (ETF symbol or group portfolio key)
    params: ModelParams
    # What the build did beyond the arithmetic (leave-one-out rows, caps given by the
    # missing-cap rule), for the build's output and the manifest.
    notes: dict[str, Any] = field(default_factory=dict)


def run_model(
    panel: Panel,
    master: pd.DataFrame,
    params: ModelParams,
    *,
    exclude: np.ndarray | None = None,
) -> ModelResult:
    """Build every published metric from a panel and a classified security master.

    `exclude` (n x T bool) marks returns that are no returns (an unadjusted split found at
    ingest): they are null everywhere, as a missing price's are, so that one missing adjustment
    reaches neither the stock's hedge ratios nor its peers' group factors.
    """
    symbols = panel.symbols
    info = master.set_index("symbol").reindex(symbols)
    r = simple_returns(panel.close)
    if exclude is not None:
        r[exclude] = np.nan
    layout = factor_layout(panel, info, r)
    factors, fidx = layout.factors, layout.fidx
    is_stock = info["asset_type"].fillna("stock").to_numpy() == "stock"
    sectors = info["gics_sector"].to_numpy(dtype=object)

    metrics = rolling_cascade(
        r,
        layout.model_factors,
        layout.model_fidx,
        window=params.window,
        min_obs=params.min_obs,
        halflife=params.halflife,
    )
    _add_price_metrics(metrics, panel, r, is_stock, params)
    _add_level_metrics(metrics, r, layout, params)
    hierarchy = _hierarchy(symbols, layout)
    flat = flat_factor_model(
        r, factors, fidx, metrics, sectors, info["factor_name"].to_numpy(dtype=object), params
    )
    metrics["beta_mkt"] = flat.beta_mkt
    metrics["beta_sec"] = flat.beta_sec
    metrics["resid_return"] = flat.resid_return
    return ModelResult(
        symbols=symbols,
        sessions=panel.sessions,
        metrics=metrics,
        hierarchy=hierarchy,
        flat=flat,
        factor_keys=layout.keys,
        params=params,
        notes={
            "returns_excluded": int(exclude.sum()) if exclude is not None else 0,
            "leave_one_out_rows": int(layout.model_factors.shape[0] - factors.shape[0]),
            "caps_imputed": len(layout.caps_imputed),
            "caps_imputed_symbols": layout.caps_imputed,
        },
    )


def _add_price_metrics(
    metrics: dict[str, np.ndarray],
    panel: Panel,
    r: np.ndarray,
    is_stock: np.ndarray,
    params: ModelParams,
) -> None:
    """The metrics read straight off prices and returns: returns, close, cap and its rank,
    turnover, short and long volatility."""
    metrics["return"] = r
    metrics["log_return"] = log_returns(r)
    metrics["price_close"] = panel.close
    metrics["market_cap"] = panel.market_cap
    metrics["mktcap_rank"] = cap_rank(panel.market_cap, is_stock)
    traded = np.where(np.isnan(panel.close_raw), panel.close, panel.close_raw)
    metrics["turnover"] = traded * panel.volume
    metrics["vol_23d"] = (
        rolling_std(r, window=VOL_SHORT_WINDOW, min_obs=VOL_SHORT_MIN_OBS) * ANNUALIZATION
    )
    metrics["vol_252d_ann"] = (
        rolling_std(r, window=params.window, min_obs=params.min_obs) * ANNUALIZATION
    )


def _add_level_metrics(
    metrics: dict[str, np.ndarray], r: np.ndarray, layout: FactorLayout, params: ModelParams
) -> None:
    """Per level, the combined factor return of its hedge ratios, the residual return and the
    hedge quality."""
    for level, hr_names in LEVEL_HR.items():
        cfr = combined_factor_returns(
            [metrics[h] for h in hr_names],
            layout.model_factors,
            layout.model_fidx[:, : len(hr_names)],
        )
        metrics[f"l{level}_cfr"] = cfr
        metrics[f"l{level}_rr"] = r - cfr
        metrics[f"l{level}_hq"] = hedge_quality(
            r, metrics[f"l{level}_rr"], window=params.window, min_obs=params.min_obs
        )


def _hierarchy(symbols: np.ndarray, layout: FactorLayout) -> pd.DataFrame:
    """Each row's factor key per level (None where the level is absent)."""
    fidx = layout.fidx
    n = fidx.shape[0]
    names = np.full((n, 3), None, dtype=object)
    for i in range(n):
        for j in range(3):
            if fidx[i, j] >= 0:
                names[i, j] = layout.keys[fidx[i, j]]
    return pd.DataFrame(
        {
            "symbol": symbols,
            "market": names[:, 0],
            "sector": names[:, 1],
            "subsector": names[:, 2],
        },
        dtype=object,
    )


def cap_rank(market_cap: np.ndarray, eligible: np.ndarray) -> np.ndarray:
    """Per session, the rank of each eligible row by market cap (1 = largest); NaN where the
    row has no cap that day or is not eligible (ETFs are not ranked)."""
    caps = np.where(eligible[:, None] & np.isfinite(market_cap), market_cap, -np.inf)
    order = np.argsort(-caps, axis=0, kind="stable")
    ranks = np.empty_like(caps)
    np.put_along_axis(ranks, order, np.arange(1, caps.shape[0] + 1, dtype=float)[:, None], axis=0)
    return np.where(np.isfinite(caps), ranks, np.nan)


def combined_factor_returns(
    hedge_ratios: list[np.ndarray], factors: np.ndarray, fidx: np.ndarray
) -> np.ndarray:
    """Sum over levels of HR_{t-1} x factor_t: the return the hedge of day t-1 earns on day t.

    A level the symbol does not have (no sector, no subsector factor) is no part of its hedge:
    the symbol's level-k columns carry the hedge of the levels it has, so its `lk_cfr` is that of
    its deepest level. NaN where the symbol has no market factor or where yesterday's hedge on a
    level it has is not published (including a collinear level).
    """
    n, n_t = hedge_ratios[0].shape
    total = np.zeros((n, n_t))
    total[:, 0] = np.nan
    total[fidx[:, 0] < 0] = np.nan
    for j, hr in enumerate(hedge_ratios):
        idx = fidx[:, j]
        has = idx >= 0
        total[has, 1:] += hr[has, :-1] * factors[idx[has], 1:]
    return total


@dataclass(frozen=True)
class FlatModel:
    """Service A's factor model: factor returns (K x T) and per-stock betas and residuals."""

    names: list[str]  # "Mkt", then sector factor names
    returns: np.ndarray  # (K x T)
    sources: list[int]  # factor row behind each factor
    sector_market_beta: np.ndarray  # (K-1 x T) g_t of each sector series on the market
    exposure: np.ndarray  # (n,) index of the stock's sector factor, -1 = Mkt only
    beta_mkt: np.ndarray  # (n x T)
    beta_sec: np.ndarray  # (n x T)
    resid_return: np.ndarray  # (n x T)


def flat_factor_model(
    r: np.ndarray,
    factors: np.ndarray,
    fidx: np.ndarray,
    metrics: dict[str, np.ndarray],
    sectors: np.ndarray,
    factor_names: np.ndarray,
    params: ModelParams,
) -> FlatModel:
    """Service A: factor Mkt = the market return; one factor per GICS sector, the sector series
    cleaned of the market with the link beta known the day before: f_sec,t = s_t - g_{t-1} m_t.

    A stock's betas are its L2 cascade coefficients (b_Mkt = b_m, b_sec = b_s: the regression
    of the stock on the market and the market-cleaned sector); its residual uses the previous
    session's betas: e_t = r_t - b_Mkt,t-1 f_Mkt,t - b_sec,t-1 f_sec,t.
    """
    n, n_t = r.shape
    has_market = fidx[:, 0] >= 0
    market_idx = int(fidx[has_market, 0][0]) if has_market.any() else -1
    m = factors[market_idx] if market_idx >= 0 else np.full(n_t, np.nan)
    sector_of: dict[str, tuple[int, str]] = {}
    for i in range(n):
        sec = sectors[i]
        if fidx[i, 1] >= 0 and isinstance(sec, str):
            name = factor_names[i] if isinstance(factor_names[i], str) else sec.replace(" ", "_")
            sector_of.setdefault(sec, (int(fidx[i, 1]), name))
    ordered = sorted(sector_of.items(), key=lambda item: item[1][1])
    rows = np.array([row for _, (row, _) in ordered], dtype=np.int64)
    link = np.empty((0, n_t))
    if len(rows):
        link_idx = np.full((len(rows), 3), -1, dtype=np.int64)
        link_idx[:, 0] = market_idx
        link = rolling_cascade(
            factors[rows],
            factors,
            link_idx,
            window=params.window,
            min_obs=params.min_obs,
            halflife=params.halflife,
        )["l1_mkt_hr"]
    link_prev = np.full(link.shape, np.nan)
    link_prev[:, 1:] = link[:, :-1]
    returns = np.vstack([m[None, :], factors[rows] - link_prev * m[None, :]])
    position = {sec: 1 + j for j, (sec, _) in enumerate(ordered)}

    exposure = np.full(n, -1, dtype=np.int64)
    for i in range(n):
        if fidx[i, 1] >= 0 and sectors[i] in position:
            exposure[i] = position[sectors[i]]
    exposed = exposure >= 0
    beta_mkt = metrics["l1_mkt_hr"].copy()
    beta_sec = np.full((n, n_t), np.nan)
    beta_sec[exposed] = metrics["l2_sec_hr"][exposed]
    systematic = beta_mkt[:, :-1] * m[None, 1:]
    systematic[exposed] += beta_sec[exposed, :-1] * returns[exposure[exposed], 1:]
    resid = np.full((n, n_t), np.nan)
    resid[:, 1:] = r[:, 1:] - systematic
    return FlatModel(
        names=[MARKET_FACTOR] + [name for _, (_, name) in ordered],
        returns=returns,
        sources=[market_idx, *rows.tolist()],
        sector_market_beta=link,
        exposure=exposure,
        beta_mkt=beta_mkt,
        beta_sec=beta_sec,
        resid_return=resid,
    )

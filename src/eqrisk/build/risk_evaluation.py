"""The risk forecast's accuracy on a data set (`eqrisk evaluate`): the model run, the risk model
of every session, and the accuracy figures of `model.accuracy`, as one small record.

The record (`accuracy_record`) is what a snapshot can carry beside its lineage: the period, the
risk model's settings, and per horizon and family of portfolios the bias statistic and its
rolling 12-month deviation, the model's next to the baseline's, with the band and the floor that
say what "close to 1" means on that many observations with these tails.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from eqrisk.build.accuracy_store import figures
from eqrisk.data.panel import Panel
from eqrisk.model.accuracy import FAMILIES, HEDGED_SIZES, previous
from eqrisk.model.accuracy_state import previous_params, record_of
from eqrisk.model.risk_model import RiskParams, StyleInputs, risk_model
from eqrisk.model.run import ModelParams, ModelResult, plan_model, run_model

DAILY = np.sqrt(252.0)
MEASURE = (
    "bias statistic b = standard deviation of (realised return / predicted volatility) over "
    "the forecasts of a period; 1 = right on average, above 1 = risk under-predicted, below 1 = "
    "over-predicted"
)
READING = {
    "bias": "closer to 1 is better; within `band` it cannot be told from 1 on that many "
    "observations",
    "mad_12m": "mean absolute deviation from 1 of b over rolling 12-month windows (one a "
    "month): lower is better; `mad_12m_floor` is what a forecast right on every session "
    "would still show with these fat tails",
    "baseline": "a portfolio's volatility as the weighted average of its positions' "
    "23-session volatilities, sum |w_i| s_i (no diversification; the hedge's ETF legs are "
    "positions)",
}
RUNNING_READING = {
    "mad_12m": "mean absolute deviation from 1 of b over 12-month windows (12 blocks of 21 "
    "sessions from the first evaluated session, one a month, each counted once complete): "
    "lower is better; `mad_12m_floor` is what a forecast right on every session would still "
    "show with these fat tails (from each row's daily kurtosis)",
    "worst_12m": "the highest median b (over the family's rows) of a 12-month window: the "
    "year the risk was most under-stated",
    "previous_model": "the same figures of the previous model on the same rows, sessions and "
    "members: the ETF layer alone (F of the ETF factors, D of the residuals after the ETF "
    "hedge, the same half-lives and prior), without the second layer and the regime "
    "adjustment; a hedged book's forecast is its specific risk alone",
}
FAMILY_TEXT = {
    "single_stocks": "single stocks (median over stocks of each one's figure)",
    "random_long_only": "100 random long-only portfolios of 50 stocks",
    "sector": "one equal-weight portfolio per sector",
    "long_short": "100 random long-short portfolios (50 long, 50 short, dollar neutral)",
    "hedged_l3": "the random long-only portfolios hedged with their L3 ETF hedge",
    **{
        f"hedged_l3_{size}": f"50 equal-weight books of {size} random stocks hedged with their "
        "L3 ETF hedge"
        for size in HEDGED_SIZES
    },
}


def risk_accuracy(
    panel: Panel,
    master: pd.DataFrame,
    model_params: ModelParams,
    risk_params: RiskParams,
    *,
    exclude: np.ndarray | None = None,
    result: ModelResult | None = None,
    horizons: tuple[int, ...] = (1, 21),
    say: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The accuracy record of the risk model on this panel (`result`: a run of the same panel
    and parameters, reused when the caller has one)."""
    progress = say or (lambda _msg: None)
    progress("risk model: factor series")
    plan = plan_model(panel, master, model_params, exclude=exclude)
    if result is None:
        progress("risk model: hedge ratios")
        result = run_model(panel, master, model_params, exclude=exclude)
    m = result.arrays()
    layout = plan.layout
    progress("risk model: F and D of every session")
    stocks = plan.is_stock & (layout.fidx[:, 1] >= 0)
    inputs = None if risk_params.styles is None else style_inputs(panel, result.symbols, stocks)
    model = risk_model(
        m["return"], layout.factors, layout.fidx, layout.keys, result.symbols, m, risk_params,
        style_inputs=inputs,
    )  # fmt: skip
    progress("risk model: the previous model (the ETF layer alone)")
    before = risk_model(m["return"], layout.factors, layout.fidx, layout.keys, result.symbols, m,
                        previous_params(risk_params))  # fmt: skip
    progress("risk model: out-of-sample figures")
    state = record_of(model, m["return"], layout.factors, previous(m["vol_23d"] / DAILY),
                      stocks, np.where(stocks, layout.fidx[:, 1], -1),
                      previous=before)  # fmt: skip
    running = figures(state)
    running["horizons"] = {f"{h}d": running["horizons"][f"{h}d"] for h in horizons}
    sessions = np.asarray(result.sessions)[model.start :]
    return stored_record(running, sessions, risk_params, computed="by `eqrisk evaluate`: the "
                         "build's running record of every session, in one step")  # fmt: skip


def style_inputs(panel: Panel, symbols: np.ndarray, stocks: np.ndarray) -> StyleInputs:
    """What the second layer reads of the panel, in the rows of `symbols`: the market caps,
    and the turnover volume / shares = volume x raw close / cap (None where the data set has
    no volume or no cap)."""
    rows = np.array([panel.index_of()[str(s)] for s in symbols.tolist()], dtype=np.int64)
    cap = np.where(stocks[:, None], panel.market_cap[rows], np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        turnover = panel.volume[rows] * panel.close_raw[rows] / cap
    turnover = np.where(np.isfinite(turnover) & (turnover > 0), turnover, np.nan)
    has_volume = bool(np.isfinite(turnover).any())
    return StyleInputs(cap=cap, turnover=turnover if has_volume else None, stocks=stocks)


def stored_record(
    running: dict[str, Any],
    sessions: np.ndarray | pd.Index,
    params: RiskParams,
    computed: str = "incrementally by every build: each build adds its new sessions' outcomes "
    "to the running state the previous version stored (docs/decisions/risk-forecast.md)",
) -> dict[str, Any]:
    """The record every build stores (`accuracy_store.figures` of the running state: its
    first and last session indexes and the figures), in `accuracy_record`'s form."""
    days = pd.DatetimeIndex(np.asarray(sessions)[int(running["first"]) : int(running["last"]) + 1])
    record = accuracy_record(running["horizons"], days, params)
    record["reading"] = {**record["reading"], **RUNNING_READING}
    record["computed"] = computed
    return record


def accuracy_record(
    figures: dict[str, dict[str, Any]], sessions: pd.DatetimeIndex, params: RiskParams
) -> dict[str, Any]:
    """The small record a snapshot can carry: what is measured, how to read it, the period,
    the settings and the figures."""
    return {
        "measure": MEASURE,
        "reading": READING,
        "period": {
            "first": sessions[0].date().isoformat() if len(sessions) else None,
            "last": sessions[-1].date().isoformat() if len(sessions) else None,
            "sessions": len(sessions),
        },
        "forecast": "the forecast of session t uses data up to t-1; the h-day forecast is "
        "sqrt(h) times the daily volatility, against the sum of the next h daily returns",
        "risk_model": params.describe(),
        "families": {name: FAMILY_TEXT[name] for name in ("single_stocks", *FAMILIES)},
        "horizons": figures,
    }

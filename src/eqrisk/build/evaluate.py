"""`eqrisk evaluate`: how good the model was, out of sample, on the ingested data. Two parts:

- the risk forecast's accuracy (`risk_evaluation`): bias statistics of stocks and portfolios
  next to the weighted-average-volatility baseline;
- the realised hedge quality per level and per estimator option, so that a user chooses the
  estimator on evidence. Options:
equal weights over the window, EWMA half-lives, and (L1 only) Vasicek shrinkage of the market
beta toward the sector's mean beta, applied to the equal-weight estimates.

For each option the model is run on the same panel; each stock's quality at level k is
var(lk_rr) / var(r) over all its days where the level-3 residual exists (the hedge of day t-1
on day t, never in-sample), summarised across the stocks that have a subsector ETF and across
every stock with a sector.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from eqrisk.build.risk_evaluation import risk_accuracy
from eqrisk.build.universe import read_universe
from eqrisk.data.corporate_actions import return_breaks
from eqrisk.data.master import Mappings
from eqrisk.data.panel import Panel
from eqrisk.model.quality import pooled_hedge_quality, vasicek_market_beta
from eqrisk.model.risk_model import RiskParams
from eqrisk.model.run import ModelParams, ModelResult, run_model

DEFAULT_HALFLIVES = (63.0, 126.0)


def _vasicek_l1(result: ModelResult, stocks: np.ndarray) -> np.ndarray:
    """Next-day L1 residuals with Vasicek-shrunk market betas (groups: the stock's sector)."""
    sectors = result.hierarchy["sector"].to_numpy(dtype=object)
    codes = pd.factorize(pd.Series(sectors).where(pd.Series(sectors).notna()))[0]
    groups = np.full(len(sectors), -1, dtype=np.int64)
    groups[stocks] = codes[stocks]
    m = result.arrays()
    beta = vasicek_market_beta(m["l1_mkt_hr"], m["l1_mkt_er"], m["n_obs"], groups)
    market = result.flat.returns[0]
    rr = np.full(beta.shape, np.nan)
    rr[:, 1:] = m["return"][:, 1:] - beta[:, :-1] * market[None, 1:]
    return rr


def load_universe(
    home: Path, market_etf: str
) -> tuple[Panel, pd.DataFrame, np.ndarray, dict[str, Any]]:
    """The ingested data set as the build reads it: panel, classified master, the returns to
    exclude (unadjusted splits) and the ingest's metadata."""
    panel, master, meta = read_universe(home, Mappings.load(), market_etf)
    breaks = return_breaks(meta.get("return_breaks", []), panel.symbols, panel.sessions)
    return panel, master, breaks, meta


def evaluate(
    home: Path,
    params: ModelParams,
    *,
    halflives: tuple[float, ...] = DEFAULT_HALFLIVES,
    market_etf: str = "SPY",
    risk: RiskParams | None = None,
    hedges: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The risk forecast's accuracy (with `risk`) and the hedge quality per estimator option
    and level (with `hedges`); see the module docstring."""
    say = progress or (lambda _msg: None)
    panel, master, breaks, meta = load_universe(home, market_etf)
    report: dict[str, Any] = {
        "data_source": meta.get("data_source"),
        "symbols": len(panel.symbols),
        "sessions": len(panel.sessions),
    }
    equal: ModelResult | None = None
    if hedges:
        equal, report["measure"], report["estimators"] = _hedge_quality(
            panel, master, breaks, params, halflives, say
        )
    if risk is not None:
        report["risk_forecast"] = risk_accuracy(
            panel, master, params, risk, exclude=breaks, result=equal, say=say
        )
    return report


def _hedge_quality(
    panel: Panel,
    master: pd.DataFrame,
    breaks: np.ndarray,
    params: ModelParams,
    halflives: tuple[float, ...],
    say: Callable[[str], None],
) -> tuple[ModelResult | None, str, list[dict[str, Any]]]:
    """Hedge quality per estimator option and level; also the run with `params`' own
    weighting (the published hedge ratios), for the risk part to reuse."""
    options = [("equal", replace(params, halflife=None))]
    options += [(f"ewma_{h:g}", replace(params, halflife=h)) for h in halflives]
    results = []
    published: ModelResult | None = None
    for name, option in options:
        say(f"estimating with {name}")
        result = run_model(panel, master, option, exclude=breaks)
        if option == params:
            published = result
        hier = result.hierarchy
        info = master.set_index("symbol").reindex(result.symbols)
        stock = (info["asset_type"].fillna("stock") == "stock").to_numpy()
        with_sub = np.flatnonzero(stock & hier["subsector"].notna().to_numpy())
        with_sec = np.flatnonzero(stock & hier["sector"].notna().to_numpy())
        m = result.arrays()
        r = m["return"]
        levels: dict[str, Any] = {}
        for universe, rows in (("with_subsector", with_sub), ("with_sector", with_sec)):
            # One sample for all levels of a stock: the days its level-3 residual exists.
            common = np.isfinite(m["l3_rr"])
            levels[universe] = {
                f"l{k}": pooled_hedge_quality(np.where(common, r, np.nan), m[f"l{k}_rr"], rows)
                for k in (1, 2, 3)
            }
        results.append({"estimator": name, "method": option.describe(), "levels": levels})
        if name == "equal":
            shrunk = _vasicek_l1(result, with_sec)
            levels = {
                universe: {
                    "l1": pooled_hedge_quality(
                        np.where(np.isfinite(m["l3_rr"]), r, np.nan), shrunk, rows
                    )
                }
                for universe, rows in (("with_subsector", with_sub), ("with_sector", with_sec))
            }
            method = {**option.describe(), "shrinkage": "vasicek toward the sector mean beta"}
            results.append({"estimator": "vasicek_l1", "method": method, "levels": levels})
    measure = (
        "hedge quality = var(lk_rr) / var(r) per stock over its out-of-sample days (the hedge "
        "of day t-1 on day t): the share of the variance left after the level-k hedge; lower is "
        "better (1 = the hedge removed nothing); median, mean and pooled (sum of variances) "
        "across stocks"
    )
    return published, measure, results

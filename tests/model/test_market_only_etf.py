"""Issue 39: an ETF that is not a factor of the model (QQQ, TLT, GLD ...) held as a position is
modelled on the market factor alone. On a real-data slice holding QQQ beside its factor ETFs,
QQQ's row has level 1 (exposure on SPY only), and the answer's note names it; a factor ETF
(XLK) and the stocks get no note."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from eqrisk.data.panel import Panel
from eqrisk.model.portfolio_risk import portfolio_risk
from eqrisk.model.risk_model import RiskModelDay, RiskParams, risk_model
from eqrisk.model.run import ModelParams, plan_model, run_model
from eqrisk.snapshot.portfolio import market_only, model_levels

SLICE = ["SPY", "XLK", "SMH", "QQQ", "NVDA", "AMD", "MSFT", "AAPL", "ORCL"]


@pytest.fixture(scope="module")
def slice_day(real_universe: tuple[Panel, pd.DataFrame]) -> tuple[RiskModelDay, dict[str, str]]:
    panel, master = real_universe
    keep = np.isin(panel.symbols, SLICE)
    fields = {
        k: v[keep] for k, v in panel.__dict__.items() if isinstance(v, np.ndarray) and v.ndim == 2
    }
    sub = Panel(**{**panel.__dict__, **fields, "symbols": panel.symbols[keep]})
    sub_master = master[master["symbol"].isin(sub.symbols)]
    params = ModelParams(252, 126)
    result = run_model(sub, sub_master, params)
    layout = plan_model(sub, sub_master, params).layout
    m = result.metrics
    model = risk_model(
        m["return"], layout.factors, layout.fidx, layout.keys, result.symbols, m, RiskParams()
    )
    types = dict(zip(sub_master["symbol"], sub_master["asset_type"], strict=True))
    return model.day(len(sub.sessions) - 1), types


def test_a_non_factor_etf_is_modelled_on_the_market_alone_and_named(
    slice_day: tuple[RiskModelDay, dict[str, str]],
) -> None:
    day, types = slice_day
    assert types["QQQ"] == "etf" and "QQQ" not in day.factor_keys
    levels = model_levels(day, ["QQQ", "XLK", "NVDA", "NOPE"])
    assert levels == {"QQQ": 1, "XLK": 1, "NVDA": 3}
    row = day.row_of["QQQ"]
    used = day.index[row][day.index[row] >= 0]
    assert [day.factor_keys[k] for k in used.tolist()] == ["SPY"]
    risk = portfolio_risk(day, {"QQQ": 1.0, "NVDA": 0.5})
    qqq_alone = portfolio_risk(day, {"QQQ": 1.0}).portfolio
    assert qqq_alone.factors.keys == ["SPY"] and qqq_alone.specific_vol > 0.0
    assert risk.portfolio.positions.tickers == ["QQQ", "NVDA"]
    assert market_only(levels, day.factor_keys, types) == [
        "QQQ: an ETF that is not a factor of the model, modelled on the market factor alone"
    ]

"""The real-data slice the risk model's tests share (tests/model/conftest.py makes it once):
ETF factors at three levels, and an energy sector without its ETF, so a group portfolio."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from eqrisk.data.panel import Panel
from eqrisk.model.layout import FactorLayout
from eqrisk.model.risk_model import RiskModel, RiskParams, risk_model
from eqrisk.model.run import ModelParams, ModelResult, plan_model, run_model

ETFS = ["SPY", "XLK", "SMH", "IGV", "XLF", "KRE", "KBE", "XLC", "FDN", "XLV", "XBI"]
STOCKS = [
    "NVDA", "AMD", "MSFT", "ORCL", "AAPL", "JPM", "BAC", "KEY", "RF", "GOOGL", "META",
    "NFLX", "XOM", "CVX", "COP", "AMGN", "GILD", "VRTX",
]  # fmt: skip
ENERGY = ["XOM", "CVX", "COP"]  # no XLE in the slice: their sector is a group portfolio


@dataclass
class Case:
    panel: Panel
    result: ModelResult
    layout: FactorLayout
    model: RiskModel

    def run(self, params: RiskParams, **kw: object) -> RiskModel:
        m = self.result.metrics
        lay = self.layout
        return risk_model(
            m["return"], lay.factors, lay.fidx, lay.keys, self.result.symbols, m, params, **kw
        )

    def row(self, symbol: str) -> int:
        return int(np.flatnonzero(self.result.symbols == symbol)[0])


def make_case(panel: Panel, master: pd.DataFrame) -> Case:
    keep = np.isin(panel.symbols, ETFS + STOCKS)
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
    return Case(sub, result, layout, model)

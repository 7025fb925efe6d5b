"""The accuracy bench (`python -m eqrisk.bench.accuracy`) on the real-data slice of the model
tests: each variant's figures are the build's running record of its model (`record_of`), and the
table prints them."""

from __future__ import annotations

import numpy as np
import pandas as pd

from eqrisk.bench.accuracy import ROWS, Prepared, measure, table, variants
from eqrisk.build.risk_evaluation import style_inputs
from eqrisk.data.panel import Panel
from eqrisk.model.cascade import rolling_std
from eqrisk.model.risk_model import RiskParams
from eqrisk.model.run import VOL_SHORT_MIN_OBS, VOL_SHORT_WINDOW
from model.risk_case import make_case


def test_each_variant_is_measured_and_tabled(real_universe: tuple[Panel, pd.DataFrame]) -> None:
    case = make_case(*real_universe)
    stocks = ~np.isin(case.result.symbols, case.layout.keys) & (case.layout.fidx[:, 1] >= 0)
    shares = np.linspace(1e9, 5e9, len(case.panel.symbols))
    panel = Panel(**{**case.panel.__dict__, "market_cap": shares[:, None] * case.panel.close})
    prep = Prepared(
        "slice",
        panel,
        case.result,
        case.layout,
        stocks,
        style_inputs(panel, case.result.symbols, stocks),
        rolling_std(case.layout.factors, window=VOL_SHORT_WINDOW, min_obs=VOL_SHORT_MIN_OBS),
    )
    names = variants()
    assert names["etf"] == RiskParams() and names["served"].styles is not None
    results = {name: measure(prep, names[name], (1,)) for name in ("etf", "served")}
    etf = results["etf"]["horizons"]["1d"]
    assert 0.8 < etf["single_stocks"]["model"]["bias"] < 1.25
    assert etf["single_stocks"] != results["served"]["horizons"]["1d"]["single_stocks"]
    text = table(results, "1d")
    lines = text.splitlines()
    assert lines[0] == "| portfolios | etf | served |" and len(lines) == 2 + len(ROWS)
    first = etf["single_stocks"]["model"]
    assert lines[2].startswith(f"| stocks | {first['bias']:.3f} / {first['mad_12m']:.3f} / ")

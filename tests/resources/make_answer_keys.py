"""Make the answer keys of the model tests: statsmodels regressions on the seeded demo market.

Run once (and again only when the demo generator or the model's definition changes on purpose):

    python tests/resources/make_answer_keys.py

Why: the model's equality tests used to need ../shared/data and skipped on a clone without it.
These keys come from the demo generator alone (`eqrisk.data.demo`, seed fixed) and from
statsmodels, never from `eqrisk.model`: the returns, the windows and the factor hierarchy are
rebuilt here from the generated prices and the generator's own `true_betas` table, so a test
that compares the model's published values with them checks the model against an independent
computation on any clone.

Files (one row per stock x session; values at full precision, `%.17g`):
- `demo_ols.csv`: equal weights, window 252, min_obs 126. The regressions of the stock's simple
  return r on (1, m) [level 1], (1, m, s) [level 2] and (1, m, s, u) [level 3], each on its own
  joint sample: the window's sessions where r and that level's factors have a return (issue 22;
  before it, every level used the sessions where all of the stock's factors had one): hedge
  ratios, R^2 (level 1) and 1 - R^2; `n_obs` is level 1's count. A stock without a subsector
  ETF stops at level 2: its level-3 columns repeat level 2 and l3_sub_hr is empty (the
  model's rule, docs/decisions/levels.md).
- `demo_ewma.csv`: the level-3 regression by weighted least squares with EWMA weights
  0.5 ** (age / halflife), halflife 60 sessions, age counted in sessions from the window's end.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import statsmodels.api as sm

from eqrisk.data.demo import generate_demo

SEED = 7  # generate_demo's default: the market the demo home (and `eqrisk demo`) is built on
WINDOW, MIN_OBS, HALFLIFE = 252, 126, 60.0
# Stocks with every level: the NVDA split, a delisting (VII), a late listing (ZALT), and AAPL
# (no subsector ETF: levels 1 and 2 only).
STOCKS = ["MSFT", "NVDA", "GOOGL", "VII", "ZALT", "POBE", "AAPL"]
HERE = Path(__file__).resolve().parent
OLS_COLUMNS = [
    "symbol", "date", "n_obs",
    "l1_mkt_hr", "l1_mkt_er", "l1_res_er",
    "l2_mkt_hr", "l2_sec_hr", "l2_res_er",
    "l3_mkt_hr", "l3_sec_hr", "l3_sub_hr", "l3_res_er",
]  # fmt: skip
EWMA_COLUMNS = ["symbol", "date", "n_obs", "l3_mkt_hr", "l3_sec_hr", "l3_sub_hr"]


def simple_returns(prices: pd.DataFrame) -> pd.DataFrame:
    """Sessions x symbols of P_t / P_{t-1} - 1, NaN unless both sessions have a price."""
    close = prices.pivot(index="date", columns="symbol", values="close").sort_index()
    return close / close.shift(1) - 1.0


def design(
    returns: pd.DataFrame, symbol: str, factors: list[str], t: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(y, X with a constant, age in sessions) on the window ending at session t, kept where the
    stock and every factor have a return."""
    lo = max(0, t - WINDOW + 1)
    y = returns[symbol].to_numpy()[lo : t + 1]
    xs = returns[factors].to_numpy()[lo : t + 1]
    age = np.arange(t - lo, -1, -1, dtype=float)
    ok = np.isfinite(y) & np.isfinite(xs).all(axis=1)
    return y[ok], sm.add_constant(xs[ok], has_constant="add"), age[ok]


def key_sessions(returns: pd.DataFrame, symbol: str, factors: list[str]) -> list[int]:
    """The first session with MIN_OBS joint returns of the deepest level in its window, one in
    the middle of the published span, and the last session the stock has a price."""
    joint = (returns[[symbol, *factors]].notna().all(axis=1)).to_numpy().astype(int)
    counts = np.convolve(joint, np.ones(WINDOW, dtype=int))[: len(joint)]
    priced = np.flatnonzero(returns[symbol].notna().to_numpy())
    first = int(np.flatnonzero(counts >= MIN_OBS)[0])
    last = int(priced[-1])
    return [first, (first + last) // 2, last]


def ols_row(returns: pd.DataFrame, symbol: str, factors: list[str], t: int) -> dict[str, object]:
    fits = []
    for level in range(1, len(factors) + 1):  # each level on its own joint sample
        y, x, _ = design(returns, symbol, factors[:level], t)
        fits.append(sm.OLS(y, x).fit())
    one, two = fits[0], fits[1]
    row: dict[str, object] = {
        "symbol": symbol,
        "date": returns.index[t],
        "n_obs": int(one.nobs),
        "l1_mkt_hr": one.params[1],
        "l1_mkt_er": one.rsquared,
        "l1_res_er": 1.0 - one.rsquared,
        "l2_mkt_hr": two.params[1],
        "l2_sec_hr": two.params[2],
        "l2_res_er": 1.0 - two.rsquared,
    }
    # Without a subsector ETF the third level is the second (l3_sub_hr unpublished).
    three = fits[-1]
    hedge = [*three.params[1:], np.nan][:3]
    row |= dict(zip(["l3_mkt_hr", "l3_sec_hr", "l3_sub_hr"], hedge, strict=True))
    row["l3_res_er"] = 1.0 - three.rsquared
    return row


def ewma_row(returns: pd.DataFrame, symbol: str, factors: list[str], t: int) -> dict[str, object]:
    y, x, age = design(returns, symbol, factors, t)
    fit = sm.WLS(y, x, weights=0.5 ** (age / HALFLIFE)).fit()
    hedge = dict(zip(["l3_mkt_hr", "l3_sec_hr", "l3_sub_hr"], fit.params[1:], strict=True))
    return {"symbol": symbol, "date": returns.index[t], "n_obs": len(y), **hedge}


def main() -> None:
    market = generate_demo(seed=SEED)
    returns = simple_returns(market.prices)
    levels = market.true_betas.set_index("symbol")
    ols, ewma = [], []
    for symbol in STOCKS:
        hier = levels.loc[symbol]
        factors = [hier["market_etf"], hier["sector_etf"]]
        if isinstance(hier["subsector_etf"], str):
            factors.append(hier["subsector_etf"])
        for t in key_sessions(returns, symbol, factors):
            ols.append(ols_row(returns, symbol, factors, t))
            if len(factors) == 3:
                ewma.append(ewma_row(returns, symbol, factors, t))
    for name, rows, columns in [
        ("demo_ols.csv", ols, OLS_COLUMNS),
        ("demo_ewma.csv", ewma, EWMA_COLUMNS),
    ]:
        frame = pd.DataFrame(rows).reindex(columns=columns)
        frame["date"] = pd.to_datetime(frame["date"]).dt.strftime("%Y-%m-%d")
        frame.to_csv(HERE / name, index=False, float_format="%.17g", lineterminator="\n")
        print(f"{HERE / name}: {len(frame)} rows")


if __name__ == "__main__":
    main()

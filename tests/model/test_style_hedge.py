"""The style-neutral hedge (`model/style_hedge.py`) on a small synthetic model day: the ETFs'
loadings equal statsmodels OLS, the legs equal an independent least-squares solve of the stacked
system, and the volatility after the legs and the ETF hedge equals a dense sqrt(w' Sigma w) and
the closed form; the legs never leave more risk than no legs."""

from __future__ import annotations

import numpy as np
import pytest
import statsmodels.api as sm

from eqrisk.model.portfolio_risk import portfolio_risk
from eqrisk.model.risk_model import STYLE_LEVEL, RiskModelDay
from eqrisk.model.style_hedge import neutral_legs, style_loadings, tradable_etfs, with_loadings

KEYS = ["SPY", "XLK", "XLF", "residual_market", "size", "momentum"]
N_ETF = 3
STOCKS = [f"S{i}" for i in range(9)]
ETFS = ["MTUM", "IWM", "USMV"]
SYMBOLS = ["SPY", "XLK", "XLF", *STOCKS, *ETFS]


def _day(seed: int = 3) -> RiskModelDay:
    rng = np.random.default_rng(seed)
    n = len(SYMBOLS)
    a = rng.normal(size=(len(KEYS), len(KEYS))) * 0.01
    cov = a @ a.T + np.diag(np.full(len(KEYS), 1e-5))
    index = np.full((n, 3), -1, dtype=np.int64)
    values = np.zeros((n, 3))
    level = np.ones(n, dtype=np.int64)
    spec = np.zeros(n)
    style = np.zeros((n, len(KEYS) - N_ETF))
    for i, s in enumerate(SYMBOLS):
        if s in KEYS:  # a factor row: itself, no specific risk
            index[i, 0], values[i, 0] = KEYS.index(s), 1.0
        elif s in STOCKS:
            index[i, :2] = [0, 1 + i % 2]
            values[i, :2] = rng.normal(1.0, 0.3, size=2)
            level[i] = 2
            spec[i] = rng.uniform(1e-4, 4e-4)
            style[i] = [1.0, *rng.normal(size=2)]
        else:  # a factor ETF: the market factor only
            index[i, 0], values[i, 0] = 0, rng.normal(1.0, 0.1)
            spec[i] = rng.uniform(2e-5, 8e-5)
    levels = np.array([1, 2, 2, *[STYLE_LEVEL] * (len(KEYS) - N_ETF)])
    return RiskModelDay(0, np.array(SYMBOLS, dtype=object), KEYS, levels, cov, index, values,
                        level, spec, style)  # fmt: skip


def test_loadings_equal_statsmodels_ols_with_gaps_and_a_short_factor() -> None:
    rng = np.random.default_rng(0)
    w = 252
    g = rng.normal(0.0, 0.01, size=(3, w))
    g[2, :200] = np.nan  # a factor with too few returns in the window: loading 0
    g[0, 7] = np.nan
    true = np.array([[0.5, -0.3, 9.0], [0.0, 1.2, 9.0]])
    resid = true[:, :2] @ np.nan_to_num(g[:2]) + rng.normal(0.0, 0.004, size=(2, w))
    resid[1, 30:60] = np.nan
    loadings, r2 = style_loadings(resid, g)
    assert loadings[:, 2].tolist() == [0.0, 0.0]
    for i in range(2):
        days = np.isfinite(resid[i]) & np.isfinite(g[:2]).all(axis=0)
        fit = sm.OLS(resid[i, days], g[:2, days].T).fit()
        np.testing.assert_allclose(loadings[i, :2], fit.params, rtol=1e-10)
        assert r2[i] == pytest.approx(fit.rsquared, rel=1e-10)  # uncentred without a constant
    short, _ = style_loadings(resid[:, :100], g[:, :100])
    assert np.isnan(short).all()  # fewer than 126 sessions: no loadings


def _dense_sigma(day: RiskModelDay) -> np.ndarray:
    h = np.zeros((len(day.symbols), len(day.factor_keys)))
    for j in range(3):
        has = day.index[:, j] >= 0
        np.add.at(h, (np.flatnonzero(has), day.index[has, j]), day.values[has, j])
    assert day.style is not None
    h[:, day.n_etf :] = day.style
    sigma: np.ndarray = h @ day.cov @ h.T + np.diag(day.specific_var)
    return sigma


def test_legs_solve_the_stacked_least_squares_and_vol_after_is_the_dense_one() -> None:
    base = _day()
    b = np.array([[0.2, -0.8, 1.1], [-0.1, 1.5, -0.2], [0.05, 0.4, 0.3]])
    r2 = np.array([0.6, 0.5, 0.3])
    etfs = tradable_etfs(base, ETFS, b, r2)
    day = with_loadings(base, etfs)
    assert etfs.rows.tolist() == [SYMBOLS.index(e) for e in ETFS]
    np.testing.assert_allclose(day.specific_var[etfs.rows], base.specific_var[etfs.rows] * (1 - r2))
    book = {"S0": 0.3, "S1": 0.25, "S2": 0.2, "S5": 0.15, "S7": -0.1}
    x = np.zeros(3)
    for t, w in book.items():
        assert day.style is not None
        x += w * day.style[SYMBOLS.index(t)]
    legs = neutral_legs(day, x, etfs)
    # Independently: min ||L'(x + B'n)||^2 + sum d n^2 as one stacked least-squares problem.
    f = day.cov[N_ETF:, N_ETF:]
    chol = np.linalg.cholesky(f)
    d = day.specific_var[etfs.rows]
    lhs = np.vstack([chol.T @ b.T, np.diag(np.sqrt(d))])
    rhs = np.concatenate([-chol.T @ x, np.zeros(3)])
    np.testing.assert_allclose(legs, np.linalg.lstsq(lhs, rhs, rcond=None)[0], rtol=1e-9)
    # The book with the legs, then its ETF hedge (the legs' market exposure sold with it).
    hedged = dict(book)
    for k, n in zip(ETFS, legs.tolist(), strict=True):
        hedged[k] = n
    hedge = portfolio_risk(day, hedged).hedge
    for k, n in zip(hedge.keys, hedge.notional.tolist(), strict=True):
        hedged[k] = hedged.get(k, 0.0) + n
    after = portfolio_risk(day, hedged).portfolio
    w = np.array([hedged.get(s, 0.0) for s in SYMBOLS])
    sigma = _dense_sigma(day)
    assert after.vol == pytest.approx(float(np.sqrt(w @ sigma @ w)), rel=1e-12)
    left = x + b.T @ legs
    spec = sum(v * v * day.specific_var[SYMBOLS.index(t)] for t, v in book.items())
    closed = float(np.sqrt(left @ f @ left + spec + np.sum(legs**2 * d)))
    assert after.vol == pytest.approx(closed, rel=1e-12)
    np.testing.assert_allclose(after.factors.exposure[after.factors.levels.index("style") :], left,
                               atol=1e-15)  # fmt: skip
    # No legs leave at least as much: the legs minimise what is left.
    plain = float(np.sqrt(x @ f @ x + spec))
    assert closed < plain
    for bump in np.eye(3) * 1e-3:
        moved = x + b.T @ (legs + bump)
        assert closed**2 <= moved @ f @ moved + spec + np.sum((legs + bump) ** 2 * d)


def test_an_etf_outside_the_day_or_without_loadings_is_no_leg() -> None:
    base = _day()
    b = np.array([[0.2, -0.8, 1.1], [np.nan, 1.5, -0.2], [0.05, 0.4, 0.3], [1.0, 1.0, 1.0]])
    etfs = tradable_etfs(base, [*ETFS, "QUAL"], b, np.full(4, 0.5))
    assert etfs.keys == ["MTUM", "USMV"]
    none = tradable_etfs(base, [], np.zeros((0, 3)), np.zeros(0))
    assert neutral_legs(with_loadings(base, none), np.ones(3), none).tolist() == []

"""Issue 23, the covariance forecast on the ETF hierarchy and a portfolio's risk, on real data
(a slice of ../shared/data with ETF and group-portfolio factors): exposures are yesterday's
hedge ratios, specific returns are the cascade's residuals, the forecast never looks ahead and
resumes bit for bit, and the portfolio's figures keep their identities and equal a dense
w' Sigma w."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from eqrisk.bench.risk import synthetic_day
from eqrisk.model.portfolio_risk import portfolio_risk
from eqrisk.model.risk_model import (
    RiskModelDay,
    RiskParams,
    risk_model,
    served_factors,
    specific_returns,
)
from model.risk_case import ENERGY, STOCKS, Case


def test_exposures_are_the_previous_sessions_hedge_ratios(risk_case: Case) -> None:
    m, ex = risk_case.result.metrics, risk_case.model.exposures
    i = risk_case.row("NVDA")
    assert [risk_case.layout.keys[j] for j in ex.index[i]] == ["SPY", "XLK", "SMH"]
    t = np.flatnonzero(ex.level[i] == 3)
    assert len(t) > 3000
    for j, name in enumerate(("l3_mkt_hr", "l3_sec_hr", "l3_sub_hr")):
        np.testing.assert_array_equal(ex.values[j, i, t], m[name][i, t - 1])
    # A row that is a factor series is that factor, with no specific risk.
    k = risk_case.row("XLK")
    assert ex.index[k].tolist() == [risk_case.layout.keys.index("XLK"), -1, -1]
    assert (ex.values[:, k, 1:] == np.array([[1.0], [0.0], [0.0]])).all()
    assert (risk_case.model.specific.var[k, 300:] == 0.0).all()
    energy = risk_case.row("XOM")
    assert risk_case.layout.keys[ex.index[energy, 1]].startswith("group:sector:")


def test_specific_returns_are_the_cascades_out_of_sample_residuals(risk_case: Case) -> None:
    m = risk_case.result.metrics
    e = specific_returns(m["return"], risk_case.layout.factors, risk_case.model.exposures)
    checked = 0
    for symbol in ("NVDA", "JPM", "AAPL", "GOOGL"):  # ETF factors only: no leave-one-out row
        i = risk_case.row(symbol)
        # At the row's deepest level (3; 2 for GOOGL, which has no subsector ETF and whose L3
        # fields are its L2 ones): the L3 hedge, whose residual is `l3_rr`.
        level = risk_case.model.exposures.level[i]
        at = (level == level.max()) & np.isfinite(m["l3_rr"][i])
        np.testing.assert_array_equal(e[i, at], m["l3_rr"][i, at])
        checked += at.sum()
    assert checked > 10000


def test_a_level_not_published_falls_back_to_the_one_above(risk_case: Case) -> None:
    m = dict(risk_case.result.metrics)
    i = risk_case.row("NVDA")
    gap = slice(2000, 2100)
    for name in ("l3_mkt_hr", "l3_sec_hr", "l3_sub_hr"):
        m[name] = m[name].copy()
        m[name][i, gap] = np.nan
    lay = risk_case.layout
    model = risk_model(
        m["return"], lay.factors, lay.fidx, lay.keys, risk_case.result.symbols, m, RiskParams()
    )
    ex = model.exposures
    t = np.arange(2001, 2101)  # forecasts made with the hedge of sessions 2000 .. 2099
    assert (ex.level[i, t] == 2).all() and (ex.level[i, 2101] == 3)
    np.testing.assert_array_equal(ex.values[0, i, t], m["l2_mkt_hr"][i, t - 1])
    np.testing.assert_array_equal(ex.values[1, i, t], m["l2_sec_hr"][i, t - 1])
    assert (ex.values[2, i, t] == 0.0).all()
    e = specific_returns(m["return"], lay.factors, ex)
    np.testing.assert_array_equal(e[i, t], m["l2_rr"][i, t])
    day = model.day(2050)
    assert day.index[i].tolist()[2] == -1 and day.level[i] == 2


def test_each_stocks_predicted_volatility_is_its_exposures_through_f_plus_d(
    risk_case: Case,
) -> None:
    pred = risk_case.model.predicted
    for t in (600, 2500, len(risk_case.result.sessions) - 1):
        day = risk_case.model.day(t)
        for symbol in ("NVDA", "XOM", "META", "XLK"):
            i = risk_case.row(symbol)
            h = np.zeros(len(day.factor_keys))
            for j in range(3):
                if day.index[i, j] >= 0:
                    h[day.index[i, j]] += day.values[i, j]
            used = h != 0
            factor = h[used] @ day.cov[np.ix_(used, used)] @ h[used]
            total = factor + day.specific_var[i]
            if not day.usable[i]:
                assert np.isnan(pred["risk_total_vol"][i, t]), (symbol, t)
                continue
            assert pred["risk_total_vol"][i, t] == pytest.approx(np.sqrt(total), rel=1e-12)
            assert pred["risk_factor_vol"][i, t] == pytest.approx(np.sqrt(factor), rel=1e-12)
            assert pred["risk_specific_vol"][i, t] ** 2 == pytest.approx(
                day.specific_var[i], rel=1e-12
            )


def test_f_and_d_of_the_real_slice_equal_pandas_ewm(risk_case: Case) -> None:
    model, lay = risk_case.model, risk_case.layout
    params = model.params
    frame = pd.DataFrame(lay.factors.T, columns=lay.keys)
    hv, hc = params.covariance.vol_halflife, params.covariance.corr_halflife

    def ewm(x: pd.Series, h: float, min_obs: int = 1) -> np.ndarray:
        return x.ewm(halflife=h, min_periods=min_obs).mean().shift(1).to_numpy()

    vol = {k: np.sqrt(ewm(frame[k] ** 2, hv, params.covariance.min_obs)) for k in ("SPY", "SMH")}
    for k in ("SPY", "SMH"):
        j = lay.keys.index(k)
        np.testing.assert_allclose(model.factor_cov.vol[:, j], vol[k], rtol=1e-12, equal_nan=True)
    a, b = lay.keys.index("SPY"), lay.keys.index("SMH")
    rho = ewm(frame["SPY"] * frame["SMH"], hc) / np.sqrt(
        ewm(frame["SPY"] ** 2, hc) * ewm(frame["SMH"] ** 2, hc)
    )
    got = model.factor_cov.cov[:, a, b]
    ok = np.isfinite(got) & ~model.factor_cov.clipped
    assert ok.sum() > 3000
    np.testing.assert_allclose(got[ok], (rho * vol["SPY"] * vol["SMH"])[ok], rtol=1e-10)
    i = risk_case.row("NVDA")
    e = specific_returns(risk_case.result.metrics["return"], lay.factors, model.exposures)[i]
    raw = ewm(pd.Series(e) ** 2, params.specific.halflife, params.specific.min_obs)
    np.testing.assert_allclose(model.specific.raw[i], raw, rtol=1e-12, equal_nan=True)


def test_f_is_positive_definite_on_every_session(risk_case: Case) -> None:
    fc = risk_case.model.factor_cov
    checked = 0
    for t in range(len(fc.cov)):
        keep = np.isfinite(fc.vol[t])
        if keep.sum() < 2:
            continue
        s = fc.vol[t, keep]
        assert np.linalg.eigvalsh(fc.cov[t][np.ix_(keep, keep)] / np.outer(s, s))[0] > 0.0
        checked += 1
    assert checked > 4000


def _inputs_until(risk_case: Case, stop: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    m = {k: v[:, :stop] for k, v in risk_case.result.metrics.items()}
    return m, risk_case.layout.factors[:, :stop]


@pytest.mark.parametrize("split", [1500, 4000])
def test_a_resumed_risk_model_equals_one_run_bitwise(risk_case: Case, split: int) -> None:
    head_m, head_f = _inputs_until(risk_case, split)
    lay = risk_case.layout
    symbols = risk_case.result.symbols
    params = RiskParams()
    head = risk_model(head_m["return"], head_f, lay.fidx, lay.keys, symbols, head_m, params)
    tail = risk_case.run(params, state=head.state)
    full = risk_case.model
    assert tail.start == split
    for name in ("risk_total_vol", "risk_factor_vol", "risk_specific_vol"):
        both = np.hstack([head.predicted[name], tail.predicted[name]])
        np.testing.assert_array_equal(both, full.predicted[name], err_msg=name)
    np.testing.assert_array_equal(
        np.concatenate([head.factor_cov.cov, tail.factor_cov.cov]), full.factor_cov.cov
    )
    np.testing.assert_array_equal(np.hstack([head.specific.var, tail.specific.var]),
                                  full.specific.var)  # fmt: skip
    # ... and the forecasts before the split are the ones a run that stops there made.
    np.testing.assert_array_equal(head.predicted["risk_total_vol"],
                                  full.predicted["risk_total_vol"][:, :split])  # fmt: skip


def _dense(day: RiskModelDay, rows: np.ndarray) -> np.ndarray:
    """Sigma of `rows` as a user would build it: H F H' + diag(D), N x N."""
    h = np.zeros((len(rows), len(day.factor_keys)))
    for j in range(3):
        idx = day.index[rows, j]
        has = idx >= 0
        h[np.flatnonzero(has), idx[has]] += day.values[rows[has], j]
    cov = np.nan_to_num(day.cov)
    return h @ cov @ h.T + np.diag(day.specific_var[rows])


@pytest.fixture(scope="module")
def last_day(risk_case: Case) -> RiskModelDay:
    return risk_case.model.day(len(risk_case.result.sessions) - 1)


def test_portfolio_risk_equals_a_dense_covariance_and_splits_exactly(
    risk_case: Case, last_day: RiskModelDay
) -> None:
    rng = np.random.default_rng(1)
    positions = {s: float(rng.normal(0, 1)) for s in [*STOCKS, "SMH", "XLF"]}
    risk = portfolio_risk(last_day, positions)
    a = risk.portfolio
    assert risk.unusable == []
    rows = np.array([last_day.row_of[t] for t in a.positions.tickers])
    w = np.array([positions[t] for t in a.positions.tickers])
    sigma = _dense(last_day, rows)
    vol = np.sqrt(w @ sigma @ w)
    assert a.vol == pytest.approx(vol, rel=1e-12)
    assert a.vol_annual == pytest.approx(vol * np.sqrt(252), rel=1e-12)
    np.testing.assert_allclose(a.positions.marginal, sigma @ w / vol, rtol=1e-10, atol=1e-15)
    for parts in (
        a.positions.contribution.sum(),
        a.factors.contribution.sum() + a.by_level["specific"],
        sum(a.by_level.values()),
    ):
        assert abs(parts - a.vol) <= 1e-12 * a.vol
    assert a.positions.share.sum() == pytest.approx(1.0, abs=1e-12)
    assert a.factor_vol**2 + a.specific_vol**2 == pytest.approx(a.vol**2, rel=1e-12)
    assert set(a.factors.levels) == {"market", "sector", "subsector"}
    # In dollars every figure scales with the positions.
    dollars = portfolio_risk(last_day, {t: 1e6 * v for t, v in positions.items()})
    assert dollars.portfolio.vol == pytest.approx(1e6 * a.vol, rel=1e-12)


def test_one_stock_is_its_own_predicted_volatility(risk_case: Case, last_day: RiskModelDay) -> None:
    t = last_day.session
    for symbol in ("NVDA", "XOM", "GOOGL", "SPY"):
        got = portfolio_risk(last_day, {symbol: 1.0}).portfolio
        expected = risk_case.model.predicted["risk_total_vol"][risk_case.row(symbol), t]
        assert got.vol == pytest.approx(expected, rel=1e-12)
        assert got.positions.contribution[0] == pytest.approx(got.vol, rel=1e-12)


def test_the_hedge_removes_the_exposure_and_leaves_the_specific_risk(
    last_day: RiskModelDay,
) -> None:
    positions = {"NVDA": 0.3, "AMD": 0.2, "JPM": 0.25, "KEY": -0.1, "GOOGL": 0.35}
    risk = portfolio_risk(last_day, positions)
    hedge = risk.hedge
    assert all(hedge.tradable)
    hedged = dict(positions)
    for key, notional in zip(hedge.keys, hedge.notional, strict=True):
        hedged[key] = hedged.get(key, 0.0) + float(notional)  # the ETF legs, as positions
    after = portfolio_risk(last_day, hedged).portfolio
    assert np.abs(after.factors.exposure).max() < 1e-15
    assert after.vol == pytest.approx(hedge.vol_after, rel=1e-12)
    assert hedge.vol_after == pytest.approx(risk.portfolio.specific_vol, rel=1e-15)
    assert hedge.vol_after < 0.7 * risk.portfolio.vol


def test_a_group_factor_is_hedged_but_not_tradable(last_day: RiskModelDay) -> None:
    hedge = portfolio_risk(last_day, dict.fromkeys(ENERGY, 1.0)).hedge
    tradable = dict(zip(hedge.keys, hedge.tradable, strict=True))
    assert tradable["SPY"] and not tradable[next(k for k in hedge.keys if k.startswith("group"))]


def test_tracking_error_is_the_risk_of_the_active_positions(last_day: RiskModelDay) -> None:
    positions = {"NVDA": 0.5, "MSFT": 0.3, "JPM": 0.2}
    benchmark = {"SPY": 1.0}
    risk = portfolio_risk(last_day, positions, benchmark=benchmark)
    rows = np.array([last_day.row_of[s] for s in ("NVDA", "MSFT", "JPM", "SPY")])
    active = np.array([0.5, 0.3, 0.2, -1.0])
    expected = np.sqrt(active @ _dense(last_day, rows) @ active)
    assert risk.tracking_error == pytest.approx(expected, rel=1e-12)
    assert risk.active is not None
    assert risk.active.positions.contribution.sum() == pytest.approx(expected, rel=1e-12)


def test_unusable_tickers_say_why(risk_case: Case) -> None:
    early = risk_case.model.day(300)  # META was not listed yet
    positions = {"NVDA": 1.0, "ZZZZ": 1.0, "AMD": float("nan"), "MSFT": 0.0, "META": 1.0}
    risk = portfolio_risk(early, positions, benchmark={"QQQ": 1.0})
    reasons = {u.ticker: u.reason for u in risk.unusable}
    assert reasons == {
        "ZZZZ": "not in the model's universe",
        "AMD": "position is not a finite number",
        "MSFT": "position is zero",
        "META": "no hedge ratios published for the previous session",
    }
    assert [u.ticker for u in risk.benchmark_unusable] == ["QQQ"]
    assert risk.portfolio.positions.tickers == ["NVDA"]


def test_params_are_checked() -> None:
    with pytest.raises(ValueError, match="level"):
        RiskParams(level=4)
    assert replace(RiskParams(), level=2).describe()["exposures"].startswith("L2")


def test_a_style_factor_without_a_forecast_is_left_out_of_the_answer() -> None:
    """A second-layer factor with no forecast that session (a NaN row and column of F, its
    exposures 0) is not among the factors served nor the portfolio's factors, and the answer is
    the dense w' Sigma w over the others; an ETF factor with too few returns stays served (the
    stocks it hedges have no forecast)."""
    day, _ = synthetic_day(60, seed=4)
    assert day.style is not None
    k0 = day.n_etf
    gone = day.factor_keys.index("momentum")
    cov = day.cov.copy()
    cov[gone, :] = cov[:, gone] = np.nan
    style = day.style.copy()
    style[:, gone - k0] = 0.0
    without = replace(day, cov=cov, style=style)
    assert without.served.tolist() == [k != gone for k in range(len(day.factor_keys))]
    assert day.served.all()
    rng = np.random.default_rng(5)
    w = rng.normal(0.0, 1.0, 60) / 60
    positions = dict(zip(day.symbols.tolist(), w.tolist(), strict=True))
    risk = portfolio_risk(without, positions).portfolio
    assert (
        "momentum" not in risk.factors.keys and len(risk.factors.keys) == len(day.factor_keys) - 1
    )
    assert "size" in risk.factors.keys
    keep = np.flatnonzero(without.served)
    h = np.zeros((60, len(day.factor_keys)))
    for j in range(3):
        h[np.arange(60), day.index[:, j]] += day.values[:, j]
    h[:, k0:] = style
    sigma = h[:, keep] @ cov[np.ix_(keep, keep)] @ h[:, keep].T + np.diag(day.specific_var)
    assert risk.vol == pytest.approx(float(np.sqrt(w @ sigma @ w)), rel=1e-12)
    assert risk.vol != portfolio_risk(day, positions).portfolio.vol
    etf = day.cov.copy()
    etf[5, :] = etf[:, 5] = np.nan
    assert served_factors(etf, k0)[5] and served_factors(etf, k0).all()

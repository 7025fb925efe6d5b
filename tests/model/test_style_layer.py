"""Issue 34, the risk model's second layer on real data: style descriptors equal an independent
pandas computation, standardisation keeps its identities, the cross-sectional regression equals
statsmodels' WLS on a day of the real data set, and the model over both layers with the regime
adjustment never looks ahead, resumes bit for bit and matches a dense h' F h; the calibration
(each style factor shrunk by its signal share, D from leverage-adjusted residuals, the regime's
limit and power) is what it says."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm

from eqrisk.build.risk_evaluation import style_inputs
from eqrisk.data.panel import Panel
from eqrisk.model.covariance import CovarianceParams, CovarianceState, factor_covariance
from eqrisk.model.regime import RegimeParams, RegimeState, bias_squared, regime_multipliers
from eqrisk.model.risk_model import (
    MIN_SIGNAL,
    RiskModel,
    RiskParams,
    RiskState,
    StyleInputs,
    risk_model,
)
from eqrisk.model.specific import SpecificParams, SpecificState, specific_variance
from eqrisk.model.style_regression import estimation_noise, style_returns, wls
from eqrisk.model.styles import (
    StyleParams,
    block_exposures,
    descriptor_block,
    descriptors,
    exposures_of,
    standardise,
    style_exposures,
)
from helpers import shared_file
from model.risk_case import Case

# The calibration switches on (leverage aside: off in the served model, and with 18 stocks
# and 5 factors each stock's h is near 0.3), so that the identities below cover them.
STYLES = StyleParams(names=("size", "momentum", "beta", "residual_volatility"), min_stocks=10,
                     shrink=True, shrink_power=0.75)  # fmt: skip
REGIME = RegimeParams(limit=4.0, power=0.75, debias=True)
# Correlations of standardised returns, as served (their noise is taken out scaled too).
PARAMS = RiskParams(covariance=CovarianceParams(corr_standardised=True), styles=STYLES,
                    regime=REGIME)  # fmt: skip


def _weighted(series: pd.Series, halflife: float, length: int) -> pd.Series:
    """An independent rolling EWMA-weighted sum (pandas windows, missing values skipped)."""
    w = 0.5 ** (np.arange(length)[::-1] / halflife)
    return series.rolling(length, min_periods=1).apply(
        lambda a: np.nansum(a * w[-len(a) :]), raw=True
    )


def _count(series: pd.Series, length: int) -> pd.Series:
    return series.notna().astype(float).rolling(length, min_periods=1).sum()


@pytest.fixture(scope="module")
def slice_data(real_universe: tuple[Panel, pd.DataFrame]) -> dict[str, np.ndarray]:
    """The last 800 sessions of 60 real stocks and SPY, with caps from the real share counts."""
    panel, master = real_universe
    fin = pd.read_csv(shared_file("constituents_financials.csv"))
    shares = (fin["Market Cap"] / fin["Price"]).groupby(fin["Symbol"]).first()
    stocks = [s for s in master.loc[master["asset_type"] == "stock", "symbol"] if s in shares]
    rows = np.flatnonzero(np.isin(panel.symbols, stocks[:60]))
    spy = int(np.flatnonzero(panel.symbols == "SPY")[0])
    close = panel.close[:, -801:]
    r = close[:, 1:] / close[:, :-1] - 1.0
    cap = shares.reindex(panel.symbols[rows]).to_numpy()[:, None] * close[rows, 1:]
    return {"returns": r[rows], "market": np.broadcast_to(r[spy], r[rows].shape).copy(),
            "cap": cap}  # fmt: skip


def test_descriptors_equal_pandas(slice_data: dict[str, np.ndarray]) -> None:
    r, mkt, cap = slice_data["returns"], slice_data["market"], slice_data["cap"]
    rng = np.random.default_rng(3)
    turnover = rng.lognormal(-5.0, 0.5, r.shape)
    turnover[rng.random(r.shape) < 0.05] = np.nan
    d = descriptors(r, mkt, cap, turnover)
    for i in (0, 7, 31):
        ri, mi = pd.Series(r[i]), pd.Series(mkt[i])
        lr = np.log1p(ri)
        mom = _weighted(lr.shift(21), 126.0, 504).where(_count(lr.shift(21), 504) >= 252)
        both = ri.notna() & mi.notna()
        num = _weighted((ri * mi).where(both), 63.0, 252)
        den = _weighted((mi * mi).where(both), 63.0, 252)
        beta = (num / den).where(_count((ri * mi).where(both), 252) >= 126)
        rv = np.sqrt(_weighted(ri * ri, 42.0, 252) / _weighted(ri.notna() * 1.0, 42.0, 252))
        rev = _weighted(lr, 5.0, 21).where(_count(lr, 21) >= 10)
        u = pd.Series(turnover[i])
        parts = [
            np.log(u.rolling(n, min_periods=1).mean() * n / months).where(_count(u, n) >= n / 2)
            for n, months in ((21, 1), (63, 3), (252, 12))
        ]
        liq = 0.35 * parts[0] + 0.35 * parts[1] + 0.3 * parts[2]
        expected = {"size": np.log(cap[i]), "momentum": mom, "beta": beta,
                    "residual_volatility": rv.where(_count(ri, 252) >= 63),
                    "reversal": rev, "liquidity": liq}  # fmt: skip
        for name, want in expected.items():
            np.testing.assert_allclose(d[name][i], np.asarray(want, float), rtol=1e-10,
                                       atol=1e-14, err_msg=name)  # fmt: skip
    assert np.isfinite(d["momentum"][:, -1]).all()


def test_a_descriptor_depends_on_its_window_only(slice_data: dict[str, np.ndarray]) -> None:
    r, mkt, cap = slice_data["returns"], slice_data["market"], slice_data["cap"]
    full = descriptors(r, mkt, cap, None)
    part = descriptors(r[:, :700], mkt[:, :700], cap[:, :700], None, columns=slice(650, 700))
    for name in full:
        np.testing.assert_array_equal(part[name][:, 650:700], full[name][:, 650:700])


def test_a_run_computes_the_descriptors_and_exposures_of_its_sessions_only(
    slice_data: dict[str, np.ndarray],
) -> None:
    r, mkt, cap = slice_data["returns"], slice_data["market"], slice_data["cap"]
    turnover = np.abs(r) + 0.01  # any positive series
    cols = slice(600, 700)
    full = descriptors(r, mkt, cap, turnover, columns=cols)
    block = descriptor_block(r, mkt, cap, turnover, columns=cols)
    part = dict(zip(full, block, strict=True))
    assert block.shape == (len(full), r.shape[0], 100)
    for name, values in part.items():
        assert values.shape == (r.shape[0], 100)
        np.testing.assert_array_equal(values, full[name][:, cols])
        assert np.isnan(full[name][:, : cols.start]).all()
    stocks = np.isfinite(cap[:, 650])
    want = style_exposures(full, cap, stocks, range(600, 700))
    have = exposures_of(part, cap[:, cols], stocks)
    assert have.shape == want.shape and np.isfinite(have).any()
    np.testing.assert_array_equal(have, want)
    # The kernel writes every cell of its output (NaN outside the rows with a cap): a block of
    # garbage, a strided view of a larger block, ends the same.
    into = np.full((len(part) + 1, r.shape[0], 130), 7.0)
    block_exposures(block, list(part), cap[:, cols], stocks, out=into[1:, :, 30:])
    np.testing.assert_array_equal(into[1:, :, 30:], want)
    assert (into[0] == 7.0).all() and (into[:, :, :30] == 7.0).all()


def test_standardised_exposures_keep_their_identities(slice_data: dict[str, np.ndarray]) -> None:
    cap = slice_data["cap"][:, -1].copy()
    x = descriptors(slice_data["returns"], slice_data["market"], slice_data["cap"], None)
    mom = x["momentum"][:, -1].copy()
    mom[3] = np.nan  # a stock with a cap and no descriptor: average
    mom[5] = 40.0  # an outlier: limited
    cap[8] = np.nan  # no cap: out of the layer
    z = standardise(mom, cap)
    ok = np.isfinite(cap)
    assert np.isnan(z[8]) and z[3] == 0.0
    held = ok & np.isfinite(mom)
    assert abs(np.sum(cap[held] * z[held]) / np.sum(cap[held])) < 1e-12
    assert abs(np.std(z[held]) - 1.0) < 1e-12
    assert z[5] == z[held].max() and 2.9 < z[5] <= 3.05
    # The same day by pandas: centre on the cap-weighted mean, scale, limit, until in range.
    s = pd.Series(mom[held])
    c = pd.Series(cap[held])
    while True:
        s = s - (s * c).sum() / c.sum()
        s = s / s.std(ddof=0)
        if s.abs().max() <= 3.05:
            break
        s = s.clip(-3.0, 3.0)
    np.testing.assert_allclose(z[held], s.to_numpy(), rtol=1e-12)


def test_exposures_are_standardised_and_made_orthogonal_as_statsmodels_ols_does(
    slice_data: dict[str, np.ndarray],
) -> None:
    """A block of real sessions at once: each style the session's `standardise` (checked
    against pandas above), residual volatility the standardised OLS residual on an intercept,
    size and beta, liquidity on an intercept and size; rows without a cap or outside the
    stocks NaN."""
    r, cap = slice_data["returns"], slice_data["cap"].copy()
    rng = np.random.default_rng(5)
    turnover = rng.lognormal(-5.0, 0.5, r.shape)
    cap[4, -30:] = np.nan  # no cap: out of the layer
    stocks = np.ones(len(r), dtype=bool)
    stocks[9] = False
    raw = descriptors(r, slice_data["market"], cap, turnover, columns=slice(770, 800))
    x = style_exposures(raw, cap, stocks, range(770, 800))
    names = list(raw)
    for k, t in enumerate(range(770, 800)):
        c = np.where(stocks, cap[:, t], np.nan)
        held = np.isfinite(c)
        z = {name: standardise(raw[name][:, t], c) for name in names}
        for name, on in (("residual_volatility", ["size", "beta"]), ("liquidity", ["size"])):
            a = sm.add_constant(np.column_stack([z[b][held] for b in on]))
            resid = np.full(len(r), np.nan)
            resid[held] = sm.OLS(z[name][held], a).fit().resid
            z[name] = standardise(resid, c)
        for s, name in enumerate(names):
            assert np.isnan(x[s, ~held, k]).all() and not held[9]
            np.testing.assert_allclose(x[s, held, k], z[name][held], rtol=0, atol=1e-12,
                                       err_msg=f"{name} at {t}")  # fmt: skip
        assert np.isnan(x[:, 4, k]).all() == (t >= 770)


def test_the_regression_equals_statsmodels_wls_on_a_real_day(
    slice_data: dict[str, np.ndarray],
) -> None:
    r, cap = slice_data["returns"], slice_data["cap"]
    raw = descriptors(r, slice_data["market"], cap, None, STYLES.names)
    t = r.shape[1] - 1
    stocks = np.ones(len(r), dtype=bool)
    x = style_exposures(raw, cap, stocks, range(t - 1, t))  # the close before session t
    y = r[:, t : t + 1] - slice_data["market"][:, t : t + 1]
    reg = style_returns(y, x, cap[:, t - 1 : t], intercept=True, min_stocks=10)
    ok = np.isfinite(y[:, 0]) & np.isfinite(x[:, :, 0]).all(axis=0) & np.isfinite(cap[:, t - 1])
    assert ok.sum() >= 50 and reg.used[:, 0].tolist() == ok.tolist()
    xo, yo, wo = x[:, ok, 0].T, y[ok, 0], np.sqrt(cap[ok, t - 1])
    ref = sm.WLS(yo, sm.add_constant(xo), weights=wo).fit()
    np.testing.assert_allclose(reg.returns[:, 0], ref.params, rtol=0, atol=1e-10)
    np.testing.assert_allclose(reg.tstat[:, 0], ref.tvalues, rtol=1e-10)
    assert abs(reg.r2[0] - ref.rsquared) < 1e-10
    np.testing.assert_allclose(reg.residuals[ok, 0], ref.resid, rtol=0, atol=1e-12)
    # Leverage: the diagonal of W^1/2 X (X'WX)^-1 X' W^1/2.
    assert reg.leverage is not None
    xc = sm.add_constant(xo)
    hat = wo * np.einsum("ij,jk,ik->i", xc, np.linalg.inv(xc.T @ (xc * wo[:, None])), xc)
    np.testing.assert_allclose(reg.leverage[ok, 0], hat, rtol=1e-10)
    assert (reg.leverage[~ok, 0] == 0.0).all() and abs(hat.sum() - xc.shape[1]) < 1e-9
    # Without an intercept: R^2 uncentred, as statsmodels.
    fit = wls(yo, xo, wo, centred=False)
    ref0 = sm.WLS(yo, xo, weights=wo).fit()
    np.testing.assert_allclose(fit.params, ref0.params, rtol=0, atol=1e-10)
    assert abs(fit.r2 - ref0.rsquared) < 1e-10


def _style_inputs(case: Case, stop: int | None = None) -> StyleInputs:
    close = case.panel.close[:, :stop]
    shares = np.linspace(1e9, 5e9, len(close))
    stocks = np.isin(case.result.symbols, case.panel.symbols) & (case.layout.fidx[:, 1] >= 0)
    stocks &= ~np.isin(case.result.symbols, case.layout.keys)
    return StyleInputs(cap=np.where(stocks[:, None], shares[:, None] * close, np.nan),
                       turnover=None, stocks=stocks)  # fmt: skip


@pytest.fixture(scope="module")
def both_layers(risk_case: Case) -> RiskModel:
    return risk_case.run(PARAMS, style_inputs=_style_inputs(risk_case))


def test_both_layers_resume_bitwise_and_never_look_ahead(
    risk_case: Case, both_layers: RiskModel
) -> None:
    full = both_layers
    split = 3000
    m = {k: v[:, :split] for k, v in risk_case.result.metrics.items()}
    lay = risk_case.layout
    head = risk_model(m["return"], lay.factors[:, :split], lay.fidx, lay.keys,
                      risk_case.result.symbols, m, PARAMS,
                      style_inputs=_style_inputs(risk_case, split))  # fmt: skip
    assert head.state.regime is not None
    state = RiskState(  # through plain arrays, as a snapshot stores it
        CovarianceState.from_arrays(head.state.covariance.to_arrays()),
        SpecificState.from_arrays(head.state.specific.to_arrays()),
        RegimeState.from_arrays(head.state.regime.to_arrays()),
    )
    tail = risk_case.run(PARAMS, state=state, style_inputs=_style_inputs(risk_case))
    for name in ("risk_total_vol", "risk_factor_vol", "risk_specific_vol"):
        both = np.hstack([head.predicted[name], tail.predicted[name]])
        np.testing.assert_array_equal(both, full.predicted[name], err_msg=name)
    np.testing.assert_array_equal(
        np.concatenate([head.factor_cov.cov, tail.factor_cov.cov]), full.factor_cov.cov
    )
    assert full.style is not None and head.style is not None and tail.style is not None
    np.testing.assert_array_equal(
        np.hstack([head.style.returns, tail.style.returns]), full.style.returns
    )
    # The forecasts up to the split are those of a run that had no data after it.
    np.testing.assert_array_equal(
        head.predicted["risk_total_vol"], full.predicted["risk_total_vol"][:, :split]
    )


def test_both_layers_give_a_positive_definite_f_and_the_dense_variance(
    both_layers: RiskModel,
) -> None:
    model = both_layers
    k_etf = model.n_etf
    assert model.factor_keys[k_etf:] == STYLES.factor_names
    assert (model.factor_level[k_etf:] == 4).all()
    checked = 0
    for t in range(600, len(model.factor_cov.cov), 97):
        day = model.day(t)
        cov = day.cov
        np.testing.assert_array_equal(cov, cov.T)  # exactly symmetric (NaN rows alike)
        keep = np.isfinite(np.diag(cov))
        # Positive definite: positive variances and a positive definite correlation matrix
        # (scale-free: a shrunk factor's variance is far below the market's, so the smallest
        # eigenvalue of F itself is within rounding of the largest).
        sd = np.sqrt(np.diag(cov)[keep])
        assert (sd > 0).all()
        corr = cov[np.ix_(keep, keep)] / np.outer(sd, sd)
        assert np.linalg.eigvalsh(corr)[0] > 0.0
        assert day.style is not None
        rows = np.flatnonzero(day.usable)
        h = np.zeros((len(rows), len(day.factor_keys)))
        for j in range(3):
            idx = day.index[rows, j]
            has = idx >= 0
            h[np.flatnonzero(has), idx[has]] += day.values[rows[has], j]
        h[:, k_etf:] = day.style[rows]
        dense = np.einsum("ik,kl,il->i", h, np.nan_to_num(cov), h)
        np.testing.assert_allclose(model.factor_var[rows, t], dense, rtol=1e-12)
        checked += int((np.abs(day.style[rows]) > 0).any())
    assert checked > 30


def test_the_regime_multiplier_is_the_recent_over_the_long_run_bias(
    risk_case: Case, both_layers: RiskModel
) -> None:
    reg = both_layers.regime
    assert reg is not None
    b2 = pd.Series(reg.factor_b2)
    seen = b2.notna().cumsum().shift(1).fillna(0)
    recent = (b2.ewm(halflife=21.0).mean() / b2.ewm(halflife=504.0).mean()) ** REGIME.power
    raw = recent.shift(1).where(seen >= 21)
    # Debiased: over the EWMA (504) of the multipliers before it.
    level = raw.ewm(halflife=504.0, ignore_na=False).mean().shift(1)
    expected = (raw / level).where(level.notna(), raw).fillna(1.0)
    np.testing.assert_allclose(reg.factor, expected.to_numpy(), rtol=1e-10)
    # March 2020: realised risk far above the forecasts, so the multipliers rise within days.
    sessions = pd.DatetimeIndex(risk_case.result.sessions)
    crash = slice(sessions.searchsorted(pd.Timestamp("2020-03-09")),
                  sessions.searchsorted(pd.Timestamp("2020-04-15")))  # fmt: skip
    calm = slice(sessions.searchsorted(pd.Timestamp("2017-03-01")),
                 sessions.searchsorted(pd.Timestamp("2017-10-01")))  # fmt: skip
    assert reg.factor[crash].max() > 1.75 * reg.factor[calm].mean()
    assert reg.specific[crash].max() > 1.3 * reg.specific[calm].mean()


def test_the_debiased_multiplier_is_over_its_past_level_and_resumes_bitwise() -> None:
    rng = np.random.default_rng(0)
    level = np.repeat(rng.uniform(0.5, 2.0, 30), 100)  # regimes of 100 sessions
    b2 = rng.chisquare(1, (2, 3000)).mean(axis=0) * level
    plain = regime_multipliers(b2, b2, RegimeParams())
    params = RegimeParams(debias=True)
    got = regime_multipliers(b2, b2, params)
    # Each multiplier is the plain one over the EWMA (half-life 504) of the plain ones before.
    raw = pd.Series(plain.factor).where(np.arange(3000) >= 21)
    level_before = raw.ewm(halflife=504.0, ignore_na=False).mean().shift(1)
    expected = (plain.factor / level_before).where(level_before.notna(), plain.factor)
    np.testing.assert_allclose(got.factor, expected.to_numpy(), rtol=1e-12)
    head = regime_multipliers(b2[:1000], b2[:1000], params)
    state = RegimeState.from_arrays(head.state.to_arrays())
    tail = regime_multipliers(b2[1000:], b2[1000:], params, state=state)
    np.testing.assert_array_equal(np.concatenate([head.factor, tail.factor]), got.factor)


def test_bias_squared_limits_each_term() -> None:
    realised = np.array([[0.01, 0.2], [0.02, np.nan], [-0.5, 0.01]])
    var = np.full((3, 2), 1e-4)
    plain = bias_squared(realised, var)
    np.testing.assert_allclose(plain, [(1.0 + 4.0 + 2500.0) / 3, (400.0 + 1.0) / 2])
    np.testing.assert_allclose(bias_squared(realised, var, 4.0), [(1 + 4 + 16) / 3, 17 / 2])


def test_the_signal_share_is_the_ewma_moment_net_of_noise_over_the_moment() -> None:
    rng = np.random.default_rng(5)
    n_t = 400
    noise_var = rng.uniform(1e-6, 4e-6, (n_t, 2))
    f = np.vstack([rng.normal(0, 3e-3, n_t), np.zeros(n_t)])  # a clear factor, a null one
    f += rng.normal(0, np.sqrt(noise_var.T))
    f[1, 50:60] = np.nan  # days without an estimate join neither sum
    noise = np.zeros((n_t, 2, 2))
    noise[:, 0, 0], noise[:, 1, 1] = noise_var[:, 0], noise_var[:, 1]
    params = CovarianceParams(vol_halflife=42.0)
    got = factor_covariance(f, params, noise=noise)
    assert got.signal is not None
    for k in range(2):
        g = pd.Series(f[k])
        seen = g.notna()
        moment = (g * g).ewm(halflife=42.0, ignore_na=False).mean()
        n = (
            pd.Series(np.where(seen, noise_var[:, k], np.nan))
            .ewm(halflife=42.0, ignore_na=False)
            .mean()
        )
        kappa = ((moment - n) / moment).clip(0.0, 1.0).shift(1).fillna(1.0)
        np.testing.assert_allclose(got.signal[:, k], kappa.to_numpy(), rtol=1e-9)
    assert got.signal[100:, 0].min() > 0.6 and np.median(got.signal[100:, 1]) < 0.2
    # Resumed through plain arrays: the same signal shares bit for bit.
    head = factor_covariance(f[:, :200], params, noise=noise[:200])
    state = CovarianceState.from_arrays(head.state.to_arrays())
    tail = factor_covariance(f, params, state=state, noise=noise[200:])
    assert head.signal is not None and tail.signal is not None
    np.testing.assert_array_equal(np.vstack([head.signal, tail.signal]), got.signal)


def test_the_style_block_is_scaled_by_a_power_of_the_signal_share(
    risk_case: Case, both_layers: RiskModel
) -> None:
    plain = risk_case.run(
        RiskParams(
            covariance=PARAMS.covariance,
            styles=StyleParams(**{**STYLES.__dict__, "shrink": False}),
            regime=REGIME,
        ),
        style_inputs=_style_inputs(risk_case),
    )
    shrunk = both_layers
    k0 = shrunk.n_etf
    signal = shrunk.factor_cov.signal
    assert signal is not None
    np.testing.assert_array_equal(shrunk.factor_cov.cov[:, :k0, :k0],
                                  plain.factor_cov.cov[:, :k0, :k0])  # fmt: skip
    a = np.ones(signal.shape)
    a[:, k0:] = signal[:, k0:] ** (STYLES.shrink_power / 2)
    a[:, k0:][signal[:, k0:] < MIN_SIGNAL] = np.nan  # no forecast, as V - N <= 0
    np.testing.assert_allclose(shrunk.factor_cov.cov,
                               plain.factor_cov.cov * a[:, :, None] * a[:, None, :], rtol=1e-14)  # fmt: skip
    style = signal[600:, k0:]
    # A factor with a forecast has a positive share (0 only where its net moment is not
    # positive, a session it has no variance in either way).
    has = np.isfinite(np.diagonal(plain.factor_cov.cov, axis1=1, axis2=2)[600:, k0:])
    assert (style[has] > 0).all() and (style <= 1).all() and style[has].mean() < 0.95
    assert (style[~has] == 0).all()


def test_the_style_inputs_of_a_panel_are_its_caps_and_turnover() -> None:
    nan = np.nan
    cap = np.array([[2e9, 2e9, nan], [5e8, 6e8, 7e8], [nan, nan, nan]])
    close_raw = np.array([[20.0, 20.0, 21.0], [5.0, 6.0, 7.0], [30.0, 31.0, 32.0]])
    volume = np.array([[1e6, 2e6, 3e6], [nan, 4e5, 5e5], [1e5, 1e5, 1e5]])
    fields = {"close": close_raw, "open": close_raw, "high": close_raw, "low": close_raw,
              "close_raw": close_raw, "volume": volume, "market_cap": cap}  # fmt: skip
    panel = Panel(symbols=np.array(["A", "B", "SPY"]),
                  sessions=np.arange(3).astype("datetime64[D]"), **fields)  # fmt: skip
    stocks = np.array([True, True, False])
    got = style_inputs(panel, np.array(["B", "A", "SPY"]), stocks[[1, 0, 2]])
    # turnover = volume / shares, shares = cap / raw close (B: 1e8 shares, A: 1e8 shares)
    assert got.turnover is not None
    np.testing.assert_allclose(got.turnover[0], [nan, 4e5 / 1e8, 5e5 / 1e8])
    np.testing.assert_allclose(got.turnover[1], [1e6 / 1e8, 2e6 / 1e8, nan])
    assert np.isnan(got.turnover[2]).all() and np.isnan(got.cap[2]).all()
    np.testing.assert_array_equal(got.cap[0], cap[1])
    no_volume = Panel(**{**panel.__dict__, "volume": np.full((3, 3), nan)})
    assert style_inputs(no_volume, panel.symbols, stocks).turnover is None


def test_the_estimation_noise_is_exactly_symmetric_and_so_is_f() -> None:
    """(X'WX)^-1 X'W Omega W X (X'WX)^-1 of each session, against a dense computation, with its
    upper triangle mirrored: F, whose sums it is taken out of, is symmetric bit for bit."""
    rng = np.random.default_rng(11)
    n, n_t = 80, 40
    exposures = rng.normal(0.0, 1.0, (3, n, n_t))
    cap = rng.lognormal(20.0, 1.0, (n, n_t))
    g = rng.normal(0.0, 0.004, (4, n_t))
    resid = g[0] + np.einsum("snt,st->nt", exposures, g[1:]) + rng.normal(0.0, 0.01, (n, n_t))
    reg = style_returns(resid, exposures, cap, intercept=True, min_stocks=10)
    omega = rng.uniform(1e-4, 4e-4, (n, n_t))
    noise = estimation_noise(exposures, cap, reg, omega)
    np.testing.assert_array_equal(noise, noise.transpose(0, 2, 1))
    t = 17
    x = np.column_stack([np.ones(n), exposures[:, :, t].T])
    w = np.sqrt(cap[:, t])
    a = np.linalg.inv(x.T @ (w[:, None] * x)) @ (x.T * w)
    np.testing.assert_allclose(noise[t], a @ np.diag(omega[:, t]) @ a.T, rtol=1e-10)
    f = factor_covariance(reg.returns, CovarianceParams(min_obs=5), noise=noise)
    assert np.isfinite(f.cov[-1]).all()
    np.testing.assert_array_equal(f.cov, f.cov.transpose(0, 2, 1))


@pytest.mark.parametrize("blocks", [1, 3, 40])
def test_the_parallel_kernels_give_the_same_bits_however_the_sessions_are_split(
    blocks: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The regression, its estimation noise, the specific variances and the factor variance
    run blocks of sessions (rows) in parallel: each session's (row's) numbers are its own, so
    splitting them into one block, into 3 uneven ones or into one each changes no bit.
    Missing exposures, a session with too few stocks, a style with no exposure anywhere,
    groups that change over time and Newey-West lags are in the data."""
    import eqrisk.model.risk_kernel as kernels

    rng = np.random.default_rng(5)
    n, n_t = 90, 40
    exposures = rng.normal(0.0, 1.0, (3, n, n_t))
    exposures[:, rng.random((n, n_t)) < 0.1] = np.nan
    exposures[2, :, 7] = 0.0  # a style left out that session
    cap = rng.lognormal(20.0, 1.0, (n, n_t))
    cap[5:, 11] = np.nan  # 5 stocks: no regression that session
    resid = rng.normal(0.0, 0.01, (n, n_t))
    omega = rng.uniform(1e-4, 4e-4, (n, n_t))
    omega[rng.random((n, n_t)) < 0.05] = np.nan  # the session's median stands in

    def run(nb: int) -> tuple[np.ndarray, ...]:
        monkeypatch.setattr(kernels, "parallel_blocks", lambda count: min(nb, count))
        reg = style_returns(resid, exposures, cap, intercept=True, min_stocks=10)
        noise = estimation_noise(exposures, cap, reg, omega)
        assert reg.leverage is not None
        index = np.tile(np.array([0, 1, -1]), (n, 1))
        values = rng_values[:, :, :n_t]
        level = np.where(np.isfinite(values[0]), 2, 0).astype(np.int8)
        cov = np.tile(np.eye(5) * 1e-4 + 1e-5, (n_t, 1, 1))
        var = np.empty((n, n_t))
        kernels.factor_var_kernel(index, values, level, cov, np.nan_to_num(exposures), 2, var,
                                  kernels.parallel_blocks(n))  # fmt: skip
        params = SpecificParams(halflife=10.0, nw_lags=2, min_obs=5)
        head = specific_variance(reg.residuals[:, :25], groups[:, :25], params)
        tail = specific_variance(reg.residuals[:, 25:], groups[:, 25:], params, state=head.state,
                                 first_column=25)  # fmt: skip
        return (reg.returns, reg.tstat, reg.r2, reg.stocks, reg.residuals, reg.used,
                reg.leverage, noise, var, head.raw, head.evidence, head.var, tail.var,
                *tail.state.to_arrays().values())  # fmt: skip

    rng_values = np.random.default_rng(6).normal(1.0, 0.2, (3, n, n_t))
    groups = np.random.default_rng(7).integers(-1, 4, (n, n_t))  # -1: no group
    one, split = run(1), run(blocks)
    assert np.isnan(one[0][:, 11]).all() and np.isfinite(one[0][:3, 12]).all()
    assert np.isnan(one[0][3, 7]) and np.isfinite(one[0][3, 8])
    assert np.isnan(one[9][:, :4]).all() and np.isfinite(one[12]).mean() > 0.8
    for a, b in zip(one, split, strict=True):
        np.testing.assert_array_equal(a, b)

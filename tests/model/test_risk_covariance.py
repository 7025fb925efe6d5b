"""Issue 23, F and D: the factor covariance and the specific variances against pandas' `ewm`
on the same returns, positive definiteness on every session, no look-ahead, and a resumed run
equal to one run bit for bit."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from eqrisk.model.covariance import (
    CovarianceParams,
    CovarianceState,
    factor_covariance,
)
from eqrisk.model.psd import PIVOT_FLOOR, make_positive_definite
from eqrisk.model.specific import (
    MIN_GROUP,
    SpecificParams,
    SpecificState,
    specific_variance,
)

T = 900


def factor_data(seed: int = 3) -> np.ndarray:
    """Six correlated factor series with fat tails, a volatility regime change, a series that
    starts 600 sessions late and a few scattered missing days."""
    rng = np.random.default_rng(seed)
    m = rng.standard_t(4, T) * 0.01
    m[400:500] *= 3.0
    f = np.vstack(
        [
            m,
            0.9 * m + rng.normal(0, 0.006, T),
            0.8 * m + rng.normal(0, 0.009, T),
            0.7 * m + rng.normal(0, 0.012, T),
            -0.3 * m + rng.normal(0, 0.008, T),
            0.9 * m + rng.normal(0, 0.004, T),
        ]
    )
    f[2] = 0.5 * f[1] + 0.5 * f[2]
    f[5, :600] = np.nan  # listed late
    f[3, rng.choice(T, 25, replace=False)] = np.nan
    f[:, 0] = np.nan  # no return into the first session
    return f


def pandas_ewm(x: pd.Series, halflife: float, min_obs: int = 1) -> pd.Series:
    """The EWMA mean of a series known the session before (the forecast convention)."""
    return x.ewm(halflife=halflife, min_periods=min_obs).mean().shift(1)


def pandas_newey_west(x: pd.Series, halflife: float, lags: int, min_obs: int) -> pd.Series:
    """M_0 + 2 sum_l (1 - l / (L + 1)) M_l with pandas' EWMA means of x_t x_t-l; M_0 where the
    sum is not positive; NaN before `min_obs` observations."""
    var = pandas_ewm(x**2, halflife)
    for lag in range(1, lags + 1):
        term = pandas_ewm(x * x.shift(lag), halflife).fillna(0.0)
        var = var + 2.0 * (1.0 - lag / (lags + 1.0)) * term
    var = var.where(var > 0, pandas_ewm(x**2, halflife))
    return var.where(x.notna().cumsum().shift(1).fillna(0) >= min_obs)


def test_volatilities_and_correlations_equal_pandas_ewm() -> None:
    f = factor_data()
    p = CovarianceParams(vol_halflife=30.0, corr_halflife=150.0, min_obs=40)
    fc = factor_covariance(f, p)
    frame = pd.DataFrame(f.T)
    k = f.shape[0]
    for j in range(k):
        expected = np.sqrt(pandas_ewm(frame[j] ** 2, 30.0, 40)).to_numpy()
        np.testing.assert_allclose(fc.vol[:, j], expected, rtol=1e-12, equal_nan=True)
    unchanged = ~fc.clipped
    assert unchanged.sum() > 700
    for a in range(k):
        for b in range(a + 1, k):
            joint = frame[a].notna() & frame[b].notna()
            cross = pandas_ewm((frame[a] * frame[b]).where(joint), 150.0)
            own_a = pandas_ewm((frame[a] ** 2).where(joint), 150.0)
            own_b = pandas_ewm((frame[b] ** 2).where(joint), 150.0)
            count = joint.cumsum().shift(1).fillna(0)
            rho = (cross / np.sqrt(own_a * own_b)).where(count >= 40, 0.0)
            expected = (rho * np.sqrt(pandas_ewm(frame[a] ** 2, 30.0, 40))
                        * np.sqrt(pandas_ewm(frame[b] ** 2, 30.0, 40))).to_numpy()  # fmt: skip
            got = fc.cov[:, a, b]
            both = unchanged & np.isfinite(expected)
            assert both.sum() > 50
            np.testing.assert_allclose(got[both], expected[both], rtol=1e-10, atol=1e-18)
            assert np.array_equal(np.isfinite(got), np.isfinite(expected))
            np.testing.assert_array_equal(fc.cov[:, b, a], got)


def test_standardised_correlations_equal_pandas_ewm_of_returns_over_their_forecasts() -> None:
    """With `corr_standardised`, F_jk = rho_jk s_j s_k with rho the EWMA correlation (over the
    days both exist) of each return divided by its own volatility forecast for that day (the
    volatility half-life, data up to the day before); the volatilities are unchanged."""
    f = factor_data()
    p = CovarianceParams(vol_halflife=30.0, corr_halflife=150.0, min_obs=40,
                         corr_standardised=True)  # fmt: skip
    fc = factor_covariance(f, p)
    raw = factor_covariance(f, CovarianceParams(vol_halflife=30.0, corr_halflife=150.0,
                                                min_obs=40))  # fmt: skip
    np.testing.assert_array_equal(fc.vol, raw.vol)
    frame = pd.DataFrame(f.T)
    sigma = {j: np.sqrt(pandas_ewm(frame[j] ** 2, 30.0, 40)) for j in frame}
    z = pd.DataFrame({j: frame[j] / sigma[j] for j in frame})  # NaN before a forecast
    unchanged = ~fc.clipped
    differs = 0.0
    for a in range(f.shape[0]):
        for b in range(a + 1, f.shape[0]):
            joint = z[a].notna() & z[b].notna()
            cross = pandas_ewm((z[a] * z[b]).where(joint), 150.0)
            own_a = pandas_ewm((z[a] ** 2).where(joint), 150.0)
            own_b = pandas_ewm((z[b] ** 2).where(joint), 150.0)
            count = joint.cumsum().shift(1).fillna(0)
            rho = (cross / np.sqrt(own_a * own_b)).where(count >= 40, 0.0)
            expected = (rho * sigma[a] * sigma[b]).to_numpy()
            got = fc.cov[:, a, b]
            both = unchanged & np.isfinite(expected)
            assert both.sum() > 50
            np.testing.assert_allclose(got[both], expected[both], rtol=1e-10, atol=1e-18)
            np.testing.assert_array_equal(fc.cov[:, b, a], got)
            differs = max(
                differs,
                float(
                    np.nanmax(
                        np.abs(got - raw.cov[:, a, b])[both]
                        / (sigma[a] * sigma[b]).to_numpy()[both]
                    )
                ),
            )
    # The volatility regime of sessions 400-500 weighs less in them than in the raw ones.
    assert differs > 0.01


def test_newey_west_variance_equals_pandas_lagged_products() -> None:
    f = factor_data()
    lags = 2
    fc = factor_covariance(f, CovarianceParams(vol_halflife=30.0, nw_lags=lags, min_obs=40))
    frame = pd.DataFrame(f.T)
    for j in range(f.shape[0]):
        expected = np.sqrt(pandas_newey_west(frame[j], 30.0, lags, 40)).to_numpy()
        np.testing.assert_allclose(fc.vol[:, j], expected, rtol=1e-11, equal_nan=True)


def test_the_factor_covariance_is_positive_definite_on_every_session() -> None:
    f = factor_data()
    fc = factor_covariance(f, CovarianceParams(vol_halflife=20.0, corr_halflife=300.0))
    assert fc.clipped.any(), "the late factor should need the repair on some sessions"
    for t in range(len(fc.cov)):
        keep = np.isfinite(fc.vol[t])
        if keep.sum() < 2:
            continue
        cov = fc.cov[t][np.ix_(keep, keep)]
        np.testing.assert_array_equal(cov, cov.T)
        low = np.linalg.eigvalsh(cov / np.outer(fc.vol[t, keep], fc.vol[t, keep]))[0]
        assert low > 0.0, (t, low)


def test_the_repair_shrinks_the_late_factor_only() -> None:
    rho = np.array([[1.0, 0.9, 0.9], [0.9, 1.0, 0.2], [0.9, 0.2, 1.0]])
    assert np.linalg.eigvalsh(rho)[0] < 0
    fixed = rho[None].copy()
    changed = make_positive_definite(fixed, np.array([[500.0, 500.0, 60.0]]))
    assert changed.tolist() == [True]
    assert fixed[0, 0, 1] == 0.9  # the two old factors keep their correlation
    c = fixed[0, 0, 2] / 0.9
    assert 0 < c < 1 and fixed[0, 1, 2] == pytest.approx(0.2 * c, rel=1e-15)
    # The late factor's pivot (its variance not explained by the others) is the floor.
    old = fixed[0][:2, :2]
    b = fixed[0][2, :2]
    assert 1.0 - b @ np.linalg.solve(old, b) == pytest.approx(PIVOT_FLOOR, rel=1e-9)
    good = np.array([[[1.0, 0.5], [0.5, 1.0]]])
    assert not make_positive_definite(good, np.array([[10.0, 5.0]])).any()
    assert good[0, 0, 1] == 0.5


@pytest.mark.parametrize("standardised", [False, True])
def test_a_forecast_depends_on_earlier_sessions_only(standardised: bool) -> None:
    f = factor_data()
    p = CovarianceParams(nw_lags=1, corr_standardised=standardised)
    full = factor_covariance(f, p)
    cut = factor_covariance(f[:, :700], p)
    np.testing.assert_array_equal(cut.cov, full.cov[:700])
    changed = f.copy()
    changed[:, 700:] *= 5.0  # a crash after session 699 ...
    later = factor_covariance(changed, p)
    np.testing.assert_array_equal(later.cov[:701], full.cov[:701])  # ... reaches session 701 on
    assert not np.array_equal(later.cov[701], full.cov[701], equal_nan=True)


@pytest.mark.parametrize("standardised", [False, True])
@pytest.mark.parametrize("split", [1, 300, 650, T])
def test_a_resumed_run_equals_one_run_bitwise(split: int, standardised: bool) -> None:
    f = factor_data()
    p = CovarianceParams(nw_lags=2, corr_standardised=standardised)
    full = factor_covariance(f, p)
    head = factor_covariance(f[:, :split], p)
    # The state goes through plain arrays, as it would through a snapshot.
    state = CovarianceState.from_arrays(head.state.to_arrays())
    tail = factor_covariance(f, p, state=state)
    assert tail.start == split
    np.testing.assert_array_equal(np.concatenate([head.cov, tail.cov]), full.cov)
    np.testing.assert_array_equal(tail.clipped, full.clipped[split:])
    for name, arr in tail.state.to_arrays().items():
        np.testing.assert_array_equal(arr, full.state.to_arrays()[name], err_msg=name)


def residual_data(seed: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Residuals of 40 stocks in 4 groups (one too small to stand alone), with late starts."""
    rng = np.random.default_rng(seed)
    n = 40
    scale = rng.uniform(0.005, 0.03, n)
    e = rng.standard_t(5, (n, T)) * scale[:, None]
    for i in range(0, n, 7):
        e[i, : 100 + 10 * i] = np.nan
    e[:, 0] = np.nan
    groups = np.repeat([0, 1, 2, 3], [15, 15, MIN_GROUP - 1, n - 30 - (MIN_GROUP - 1)])
    groups[-2:] = -1
    return e, groups


def test_specific_variance_equals_pandas_ewm_and_the_posterior_mean() -> None:
    e, groups = residual_data()
    p = SpecificParams(halflife=30.0, min_obs=42, prior_obs=10.0, floor=0.004)
    sv = specific_variance(e, groups, p)
    lam = 0.5 ** (1 / 30.0)
    for i in range(len(e)):
        x = pd.Series(e[i])
        raw = pandas_ewm(x**2, 30.0, 42).to_numpy()
        np.testing.assert_allclose(sv.raw[i], raw, rtol=1e-12, equal_nan=True)
        # The effective number of observations from the weights themselves.
        seen = x.notna().to_numpy()
        for t in (150, 600, T - 1):
            w = lam ** (t - 1 - np.arange(t)[seen[:t]])
            if not len(w):
                assert sv.evidence[i, t] == 0.0
                continue
            assert sv.evidence[i, t] == pytest.approx(w.sum() ** 2 / (w**2).sum(), rel=1e-12)
    for t in (200, 700):
        day = pd.DataFrame({"v": sv.raw[:, t], "n": sv.evidence[:, t], "g": groups})
        day = day[day["v"].notna()]
        sizes = day.groupby("g")["v"].transform("size")
        pooled = (day["g"] < 0) | (sizes < MIN_GROUP)
        prior = day.groupby(day["g"].where(~pooled, -99))["v"].transform("mean")
        prior[pooled] = day["v"].mean()
        post = np.maximum((day["n"] * day["v"] + 10.0 * prior) / (day["n"] + 10.0), 0.004**2)
        np.testing.assert_allclose(sv.var[day.index, t], post, rtol=1e-12)
        assert np.isnan(sv.var[~np.isfinite(sv.raw[:, t]), t]).all()


def test_specific_newey_west_variance_equals_pandas_lagged_products() -> None:
    e, groups = residual_data()
    lags = 2
    sv = specific_variance(e, groups, SpecificParams(halflife=30.0, nw_lags=lags, min_obs=42))
    for i in (0, 3, 7):  # row 0 and 7 start late
        x = pd.Series(e[i])
        expected = pandas_newey_west(x, 30.0, lags, 42).to_numpy()
        np.testing.assert_allclose(sv.raw[i], expected, rtol=1e-11, equal_nan=True)
        first = int(np.argmax(x.notna().cumsum().to_numpy() >= 42)) + 1
        assert np.isnan(sv.raw[i, :first]).all() and np.isfinite(sv.raw[i, first])


def test_a_new_listing_is_pulled_toward_its_group_more_than_a_seasoned_stock() -> None:
    e, groups = residual_data()
    sv = specific_variance(e, groups, SpecificParams(min_obs=20, floor=0.0))
    new, old = 14, 1  # same group; row 14 starts at session 240
    t = 270
    assert sv.evidence[new, t] < 30 < sv.evidence[old, t]
    pull = np.abs(sv.var[:, t] - sv.raw[:, t]) / sv.raw[:, t]
    assert pull[new] > pull[old]


def test_specific_variance_resumes_bitwise_and_never_looks_ahead() -> None:
    e, groups = residual_data()
    p = SpecificParams(nw_lags=1)
    full = specific_variance(e, groups, p)
    head = specific_variance(e[:, :500], groups, p)
    tail = specific_variance(e, groups, p, state=SpecificState.from_arrays(head.state.to_arrays()))
    np.testing.assert_array_equal(np.hstack([head.var, tail.var]), full.var)
    np.testing.assert_array_equal(np.hstack([head.raw, tail.raw]), full.raw)
    # A resumed run needs the sessions from the state's on only.
    only_tail = specific_variance(e[:, 500:], groups, p, state=head.state, first_column=500)
    np.testing.assert_array_equal(only_tail.var, tail.var)
    with pytest.raises(ValueError, match="outside"):
        specific_variance(e[:, 600:], groups, p, state=head.state, first_column=600)
    changed = e.copy()
    changed[:, 500:] = 0.5
    np.testing.assert_array_equal(specific_variance(changed, groups, p).var[:, :501],
                                  full.var[:, :501])  # fmt: skip


def test_inputs_of_another_shape_are_refused() -> None:
    f = factor_data()
    head = factor_covariance(f[:, :100], CovarianceParams())
    with pytest.raises(ValueError, match="another factor set"):
        factor_covariance(f[:4], CovarianceParams(), state=head.state)
    with pytest.raises(ValueError, match="positive"):
        CovarianceParams(vol_halflife=0.0)
    e, groups = residual_data()
    with pytest.raises(ValueError, match="groups"):
        specific_variance(e, groups[:-1], SpecificParams())

"""The risk model against independent computations (statsmodels regressions on the same window,
pandas rolling moments) and against its identities."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm

from eqrisk.data.master import Mappings, classify
from eqrisk.data.panel import Panel, to_panel
from eqrisk.model.cascade import rolling_cascade, rolling_std
from eqrisk.model.returns import group_returns, simple_returns
from eqrisk.model.run import ModelParams, ModelResult, run_model
from helpers import nan_equal
from model.group_reference import held_returns

WINDOW, MIN_OBS = 252, 126
# At least 20 real stocks that have all three levels (market, sector ETF, subsector ETF).
REAL_STOCKS = [
    "NVDA", "AMD", "AVGO", "MU", "MSFT", "ORCL", "CRM", "ADBE", "JPM", "BAC", "WFC", "C",
    "KEY", "RF", "DVN", "COP", "EOG", "SLB", "HAL", "AMGN", "GILD", "VRTX", "PFE", "MRK",
    "LLY", "ABT", "MDT", "GS", "MS", "BA", "LMT", "UNP", "DAL", "HD", "LOW", "DHI", "LEN",
    "NEM", "NUE", "FCX", "GOOGL", "AMZN",
]  # fmt: skip


@pytest.fixture(scope="module")
def real_model(real_universe: tuple[Panel, pd.DataFrame]) -> ModelResult:
    panel, master = real_universe
    return run_model(panel, master, ModelParams(WINDOW, MIN_OBS))


def _window_design(
    result: ModelResult, panel: Panel, symbol: str, t: int, levels: int
) -> tuple[np.ndarray, np.ndarray]:
    """(y, X with a constant) over the window ending at t on the stock's joint observed days."""
    row = panel.index_of()
    r = result.metrics["return"]
    hier = result.hierarchy.set_index("symbol").loc[symbol]
    names = [hier["market"], hier["sector"], hier["subsector"]][:levels]
    lo = max(0, t - WINDOW + 1)
    y = r[row[symbol], lo : t + 1]
    xs = np.column_stack([r[row[n], lo : t + 1] for n in names])
    ok = np.isfinite(y) & np.isfinite(xs).all(axis=1)
    return y[ok], sm.add_constant(xs[ok], has_constant="add")


def _test_dates(result: ModelResult, row: int) -> list[int]:
    """First published session, one in the middle, the last: early, mid and late windows."""
    published = np.flatnonzero(np.isfinite(result.metrics["l3_sub_hr"][row]))
    assert len(published) > 500
    return [int(published[0]), int(published[len(published) // 2]), int(published[-1])]


def test_hedge_ratios_equal_the_multiple_regression(real_universe, real_model) -> None:
    panel, _ = real_universe
    row = panel.index_of()
    checked = 0
    for symbol in REAL_STOCKS:
        hier = real_model.hierarchy.set_index("symbol").loc[symbol]
        assert hier["subsector"] is not None, symbol
        for t in _test_dates(real_model, row[symbol]):
            y, x = _window_design(real_model, panel, symbol, t, 3)
            fit = sm.OLS(y, x).fit()
            got = [
                real_model.metrics[k][row[symbol], t]
                for k in ("l3_mkt_hr", "l3_sec_hr", "l3_sub_hr")
            ]
            np.testing.assert_allclose(got, fit.params[1:], rtol=0, atol=1e-8, err_msg=symbol)
            # Residual risk is the unexplained share of the same regression.
            res = real_model.metrics["l3_res_er"][row[symbol], t]
            assert abs(res - (1.0 - fit.rsquared)) < 1e-9
            # n_obs counts the market level's sample: the stock's joint days with the market.
            y1, _ = _window_design(real_model, panel, symbol, t, 1)
            assert real_model.metrics["n_obs"][row[symbol], t] == len(y1) >= len(y)
            checked += 1
    assert checked >= 60


def _assert_levels(model: ModelResult, panel: Panel, symbol: str, t: int) -> list[int]:
    """Each published level of `symbol` at t equals the regression on its own joint sample
    (L1: the stock's days with the market; L2: with the sector too; L3: with the subsector
    too); returns the levels that were published."""
    i = panel.index_of()[symbol]
    m = model.metrics
    fields = {1: ["l1_mkt_hr"], 2: ["l2_mkt_hr", "l2_sec_hr"],
              3: ["l3_mkt_hr", "l3_sec_hr", "l3_sub_hr"]}  # fmt: skip
    shares = {1: "l1_res_er", 2: "l2_res_er", 3: "l3_res_er"}
    published = []
    for level, names in fields.items():
        got = np.array([m[k][i, t] for k in names])
        if np.isnan(got[-1]):
            continue
        y, x = _window_design(model, panel, symbol, t, level)
        assert len(y) >= MIN_OBS, (symbol, level)
        fit = sm.OLS(y, x).fit()
        np.testing.assert_allclose(got, fit.params[1:], rtol=0, atol=1e-8, err_msg=symbol)
        assert abs(m[shares[level]][i, t] - (1.0 - fit.rsquared)) < 1e-9, (symbol, level)
        published.append(level)
    return published


def test_each_level_equals_its_own_regression(real_universe, real_model) -> None:
    panel, _ = real_universe
    row = panel.index_of()
    for symbol in REAL_STOCKS[:20]:
        t = _test_dates(real_model, row[symbol])[1]
        assert _assert_levels(real_model, panel, symbol, t) == [1, 2, 3]


def test_every_level_as_soon_as_its_own_inputs_exist(real_universe, real_model) -> None:
    """Issue 22 on the real data set: every stock has its L1 market beta from its 126th joint
    observation with SPY, whenever its sector ETF lists (XLC 2018-06, XLRE 2015-10, JETS
    2015); L2 and L3 come when their own samples reach 126, each equal to its own regression,
    and the L3 columns carry the deepest published level meanwhile."""
    panel, master = real_universe
    m = real_model.metrics
    r = m["return"]
    spy = r[panel.index_of()["SPY"]]
    stocks = np.flatnonzero(master.set_index("symbol").reindex(panel.symbols)["asset_type"]
                            .fillna("stock").to_numpy() == "stock")  # fmt: skip
    joint = np.isfinite(r[stocks]) & np.isfinite(spy)[None, :]
    # Joint observations in each session's window of WINDOW sessions.
    counts = np.cumsum(joint, axis=1)
    counts[:, WINDOW:] -= counts[:, :-WINDOW].copy()
    expected = counts >= MIN_OBS
    got = np.isfinite(m["l1_mkt_hr"][stocks])
    assert np.array_equal(got, expected)
    np.testing.assert_array_equal(m["n_obs"][stocks][expected], counts[expected])
    # Communication Services before XLC: a market beta, no sector level yet, carried in L3.
    xlc = np.flatnonzero(np.isfinite(r[panel.index_of()["XLC"]]))[0]
    sessions = panel.sessions.astype("datetime64[D]").astype(str)
    assert sessions[xlc].startswith("2018-06")
    for symbol in ("GOOGL", "DIS", "CMCSA", "VZ", "NFLX"):
        i = panel.index_of()[symbol]
        assert np.isfinite(m["l1_mkt_hr"][i, xlc - 1])
        assert np.isnan(m["l2_sec_hr"][i, : xlc + MIN_OBS - 1]).all()
        assert np.isfinite(m["l2_sec_hr"][i, xlc + MIN_OBS - 1])
        assert m["l3_mkt_hr"][i, xlc - 1] == m["l1_mkt_hr"][i, xlc - 1]
        assert np.isnan(m["l3_sec_hr"][i, xlc - 1])
    # Where the levels' samples differ, each published level is its own regression.
    checked = set()
    for symbol in ("GOOGL", "DIS", "T", "PLD", "AMT", "DAL", "UAL"):
        i = panel.index_of()[symbol]
        first = {lvl: int(np.flatnonzero(np.isfinite(m[f][i]))[0])
                 for lvl, f in ((1, "l1_mkt_hr"), (2, "l2_sec_hr"))}  # fmt: skip
        for t in (first[2] - 1, first[2], first[2] + 60):
            checked.update(_assert_levels(real_model, panel, symbol, t))
    assert checked == {1, 2, 3}


def test_risk_shares_sum_to_one_wherever_published(real_model) -> None:
    m = real_model.metrics
    for level, parts in {
        1: ["l1_mkt_er", "l1_res_er"],
        2: ["l2_mkt_er", "l2_sec_er", "l2_res_er"],
        3: ["l3_mkt_er", "l3_sec_er", "l3_sub_er", "l3_res_er"],
    }.items():
        stack = np.stack([m[p] for p in parts])
        published = np.isfinite(stack).all(axis=0)
        assert published.sum() > 100_000, level
        total = stack[:, published].sum(axis=0)
        assert np.max(np.abs(total - 1.0)) < 1e-9
        # Shares of the systematic parts are proper fractions.
        assert (stack[:-1, published] >= 0).all()
        assert (stack[-1, published] <= 1 + 1e-12).all()


def test_stock_without_subsector_etf_stops_at_level_two(real_universe, real_model) -> None:
    panel, master = real_universe
    row = panel.index_of()
    # Apple's GICS sub-industry (technology hardware) has no subsector ETF in the mapping.
    assert master.set_index("symbol").loc["AAPL", "subsector_etf"] is None
    i = row["AAPL"]
    m = real_model.metrics
    assert np.isnan(m["l3_sub_hr"][i]).all() and np.isnan(m["l3_sub_er"][i]).all()
    published = np.isfinite(m["l2_sec_hr"][i])
    assert published.sum() > 3000
    assert nan_equal(m["l3_sec_hr"][i], m["l2_sec_hr"][i])
    assert nan_equal(m["l3_res_er"][i], m["l2_res_er"][i])


def test_ewma_weights_equal_weighted_least_squares(real_universe) -> None:
    panel, master = real_universe
    halflife = 60.0
    result = run_model(panel, master, ModelParams(WINDOW, MIN_OBS, halflife))
    lam = 0.5 ** (1 / halflife)
    row = panel.index_of()
    r = result.metrics["return"]
    for symbol in ["NVDA", "JPM", "COP", "AMGN", "HD"]:
        t = _test_dates(result, row[symbol])[1]
        hier = result.hierarchy.set_index("symbol").loc[symbol]
        lo = t - WINDOW + 1
        y = r[row[symbol], lo : t + 1]
        xs = np.column_stack(
            [r[row[hier[k]], lo : t + 1] for k in ("market", "sector", "subsector")]
        )
        w = lam ** np.arange(WINDOW - 1, -1, -1)
        ok = np.isfinite(y) & np.isfinite(xs).all(axis=1)
        fit = sm.WLS(y[ok], sm.add_constant(xs[ok]), weights=w[ok]).fit()
        got = [result.metrics[k][row[symbol], t] for k in ("l3_mkt_hr", "l3_sec_hr", "l3_sub_hr")]
        np.testing.assert_allclose(got, fit.params[1:], atol=1e-8, err_msg=symbol)


def test_volatility_equals_pandas_rolling_std(real_universe, real_model) -> None:
    panel, _ = real_universe
    i = panel.index_of()["TSLA"]
    r = pd.Series(real_model.metrics["return"][i])
    for name, window, min_obs in (("vol_252d_ann", 252, 126), ("vol_23d", 23, 16)):
        expected = r.rolling(window, min_periods=min_obs).std() * np.sqrt(252)
        np.testing.assert_allclose(
            real_model.metrics[name][i], expected.to_numpy(), rtol=1e-10, atol=1e-14
        )


def test_nothing_published_for_a_day_depends_on_later_prices(real_universe, real_model) -> None:
    panel, master = real_universe
    cut = 3000
    rng = np.random.default_rng(0)
    close = panel.close.copy()
    close[:, cut + 1 :] *= np.exp(rng.normal(0, 0.05, close[:, cut + 1 :].shape))
    changed = Panel(**{**panel.__dict__, "close": close})
    other = run_model(changed, master, ModelParams(WINDOW, MIN_OBS))
    for name, arr in real_model.metrics.items():
        assert nan_equal(arr[:, : cut + 1], other.metrics[name][:, : cut + 1]), name
        # ...while every published series that depends on prices did change afterwards.
        if np.isfinite(arr).any() and name != "n_obs":
            assert not nan_equal(arr[:, cut + 1 :], other.metrics[name][:, cut + 1 :]), name
    assert nan_equal(real_model.flat.returns[:, : cut + 1], other.flat.returns[:, : cut + 1])


def test_missing_prices_are_not_forward_filled() -> None:
    close = np.array([[10.0, 11.0, np.nan, 12.1, 12.1, 13.31]])
    r = simple_returns(close)
    expected = np.array([[np.nan, 0.1, np.nan, np.nan, 0.0, 0.1]])
    np.testing.assert_allclose(r, expected, atol=1e-15)


def test_publication_starts_at_min_obs_joint_observations() -> None:
    rng = np.random.default_rng(1)
    n_t = 400
    m = rng.standard_t(4, n_t) * 0.01
    y = 1.3 * m + rng.normal(0, 0.01, n_t)
    y[:50] = np.nan  # listed late
    y[200:210] = np.nan  # a halt
    out = rolling_cascade(y[None, :], m[None, :], np.array([[0, -1, -1]]), window=100, min_obs=60)
    n_obs = out["n_obs"][0]
    published = np.isfinite(out["l1_mkt_hr"][0])
    assert np.all(published == (n_obs >= 60))
    assert np.flatnonzero(published)[0] == 50 + 60 - 1
    # A window that spans the halt has 10 fewer observations.
    assert n_obs[250] == 90
    fit = sm.OLS(y[151:251], sm.add_constant(m[151:251]), missing="drop").fit()
    assert abs(out["l1_mkt_hr"][0, 250] - fit.params[1]) < 1e-10


def test_collinear_subsector_is_null_not_garbage() -> None:
    rng = np.random.default_rng(2)
    n_t = 300
    m = rng.normal(0, 0.01, n_t)
    s = 0.9 * m + rng.normal(0, 0.005, n_t)
    u = s.copy()  # the "subsector" ETF is the sector ETF
    y = 1.0 * m + 0.5 * s + rng.normal(0, 0.01, n_t)
    out = rolling_cascade(
        y[None, :], np.vstack([m, s, u]), np.array([[0, 1, 2]]), window=252, min_obs=126
    )
    assert np.isnan(out["l3_sub_hr"][0]).all()
    assert np.isfinite(out["l2_sec_hr"][0, 200:]).all()


def test_group_portfolio_is_cap_weighted_on_previous_caps() -> None:
    r = np.array([[np.nan, 0.01, 0.02], [np.nan, 0.03, np.nan], [np.nan, -0.01, 0.04]])
    caps = np.array([[100.0, 110.0, 120.0], [300.0, 310.0, 320.0], [np.nan, np.nan, np.nan]])
    got = group_returns(r, np.array([0, 1, 2]), caps)
    assert np.isnan(got[0])
    # Member 2 has no cap: it weighs the day's median known cap (issue 12), never zero.
    assert got[1] == pytest.approx((100 * 0.01 + 300 * 0.03 + 200 * -0.01) / 600, abs=1e-15)
    # Member 1 has no return that day; member 2 weighs the only known cap, member 0's.
    assert got[2] == pytest.approx((110 * 0.02 + 110 * 0.04) / 220, abs=1e-15)
    eq = group_returns(r, np.array([0, 2]), None)
    assert eq[1] == pytest.approx(0.0, abs=1e-15)


def _subset(panel: Panel, keep: set[str]) -> Panel:
    rows = np.array([s in keep for s in panel.symbols])
    fields = {
        k: v[rows] for k, v in panel.__dict__.items() if isinstance(v, np.ndarray) and v.ndim == 2
    }
    return Panel(**{**panel.__dict__, **fields, "symbols": panel.symbols[rows]})


def test_levels_without_etfs_fall_back_to_group_portfolios(real_universe) -> None:
    panel, master = real_universe
    tech = ["AAPL", "AMD", "MSFT", "NVDA"]
    sub = _subset(panel, {*tech, "JPM", "BAC", "XOM", "CVX"})
    result = run_model(
        sub, master[master["symbol"].isin(sub.symbols)], ModelParams(WINDOW, MIN_OBS)
    )
    hier = result.hierarchy.set_index("symbol")
    assert hier.loc["NVDA", "market"] == "group:market:all"
    assert hier.loc["NVDA", "sector"] == "group:sector:Information Technology"
    assert hier.loc["NVDA", "subsector"] is None  # SMH is absent and the group is too small
    # No market caps in this data: each group factor is the equal-weighted mean of its members,
    # and NVDA is regressed on its groups without itself (leave-one-out, issue 12).
    rows = sub.index_of()
    r = result.metrics["return"]
    t = 4000
    window = slice(t - WINDOW + 1, t + 1)
    others = [i for s, i in rows.items() if s != "NVDA"]
    # Member returns as the group portfolios hold them (written out in group_reference.py).
    held = held_returns(r)
    tech_rows = np.array([rows[s] for s in tech])
    held_tech = held_returns(r[tech_rows])
    market = np.nanmean(held[others, window], axis=0)
    sector = np.nanmean(held_tech[tech_rows != rows["NVDA"], window], axis=0)
    y = r[rows["NVDA"], window]
    fit = sm.OLS(y, sm.add_constant(np.column_stack([market, sector]))).fit()
    assert abs(result.metrics["l2_sec_hr"][rows["NVDA"], t] - fit.params[2]) < 1e-8
    assert abs(result.metrics["l2_mkt_hr"][rows["NVDA"], t] - fit.params[1]) < 1e-8


def test_flat_model_betas_factors_and_residuals(real_universe, real_model) -> None:
    panel, _ = real_universe
    row = panel.index_of()
    flat = real_model.flat
    names = flat.names
    assert names[0] == "Mkt" and "Energy" in names and "Information_Technology" in names
    r = real_model.metrics["return"]
    m = r[row["SPY"]]
    # The sector factor: the sector ETF less the market with yesterday's link beta.
    k = names.index("Energy")
    t = 3500
    fit = sm.OLS(r[row["XLE"], t - 252 : t], sm.add_constant(m[t - 252 : t]), missing="drop").fit()
    assert abs(flat.returns[k, t + 0] - (r[row["XLE"], t] - fit.params[1] * m[t])) < 1e-10
    # Residual identity, with the previous day's betas, on every published row.
    i = row["XOM"]
    assert flat.exposure[i] == k
    e = real_model.metrics["resid_return"][i]
    b_m, b_s = real_model.metrics["beta_mkt"][i], real_model.metrics["beta_sec"][i]
    recon = b_m[:-1] * flat.returns[0, 1:] + b_s[:-1] * flat.returns[k, 1:] + e[1:]
    ok = np.isfinite(recon)
    assert ok.sum() > 3500
    np.testing.assert_allclose(recon[ok], r[i, 1:][ok], atol=1e-14)
    # b_Mkt is the stock's market beta; b_sec its coefficient on the market-cleaned sector,
    # which equals the coefficient on the raw sector ETF in the regression on (1, m, s).
    y, x = _window_design(real_model, panel, "XOM", t, 2)
    assert abs(b_s[t] - sm.OLS(y, x).fit().params[2]) < 1e-8
    assert abs(b_m[t] - sm.OLS(y, x[:, :2]).fit().params[1]) < 1e-8


def test_returns_are_simple_and_log(real_model) -> None:
    r = real_model.metrics["return"]
    lr = real_model.metrics["log_return"]
    ok = np.isfinite(r)
    np.testing.assert_allclose(lr[ok], np.log1p(r[ok]), rtol=1e-15)


def test_rolling_std_survives_a_large_level_shift() -> None:
    # Centred accumulation: a large common offset does not destroy the variance.
    rng = np.random.default_rng(3)
    x = 1e6 + rng.normal(0, 1e-3, 2000)
    got = rolling_std(x[None, :], window=252, min_obs=126)[0, -1]
    assert got == pytest.approx(np.std(x[-252:], ddof=1), rel=1e-6)


def test_classification_uses_the_reference_mappings() -> None:
    raw = pd.DataFrame(
        {
            "symbol": ["NVDA", "JPM", "XLK", "SPY", "ZZZ"],
            "name": ["Nvidia", "JPMorgan", "", "", "Unknown Co"],
            "asset_type": ["stock", "stock", "stock", "etf", "stock"],
            "gics_sector": ["Information Technology", "Financials", "", "", ""],
            "gics_sub_industry": ["Semiconductors", "Diversified Banks", "", "", ""],
        }
    )
    out = classify(raw, Mappings.load()).set_index("symbol")
    assert out.loc["NVDA", ["sector_etf", "subsector_etf", "sector_code", "factor_name"]].tolist() == [
        "XLK", "SMH", "45", "Information_Technology"
    ]  # fmt: skip
    assert out.loc["JPM", "subsector_etf"] == "KBE"
    assert out.loc["XLK", "asset_type"] == "etf"  # ETFs classify themselves
    assert out.loc["XLK", "gics_sector"] == "Information Technology"
    assert out.loc["SPY", "market_etf"] is None
    assert out.loc["ZZZ", "sector_etf"] is None


def test_mapping_override_changes_the_subsector(tmp_path) -> None:
    override = tmp_path / "sub.csv"
    override.write_text("gics_sub_industry,etf\nSemiconductors,soxx\nDiversified Banks,\n")
    maps = Mappings.load(subsector_map=override)
    assert maps.subsector_etf["Semiconductors"] == "SOXX"
    assert "Diversified Banks" not in maps.subsector_etf
    bad = tmp_path / "bad.csv"
    bad.write_text("industry,fund\nx,y\n")
    with pytest.raises(ValueError, match="needs columns"):
        Mappings.load(subsector_map=bad)


def test_panel_sessions_are_nyse_and_missing_stays_missing() -> None:
    prices = pd.DataFrame(
        {
            "date": ["2024-07-02", "2024-07-03", "2024-07-08", "2024-07-02", "2024-07-05"],
            "symbol": ["A", "A", "A", "B", "B"],
            "close": [1.0, 2.0, 3.0, 4.0, 5.0],
        }
    )
    panel = to_panel(prices)
    assert [str(d) for d in panel.sessions] == [
        "2024-07-02", "2024-07-03", "2024-07-05", "2024-07-08"
    ]  # fmt: skip
    assert nan_equal(panel.close[0], np.array([1.0, 2.0, np.nan, 3.0]))


def test_demo_true_betas_are_recovered(demo_home) -> None:
    """The generator's stocks are r = a + hr_m SPY + hr_s sector + hr_u subsector + eps, with
    constant hedge ratios. The time average of the published rolling L3 hedge ratios must sit
    within sampling error of the truth: |error| / (full-sample OLS standard error) below 5 for
    every coefficient (about 480; under normal errors P(|z| > 5) is 6e-7 each), and the median
    |z| below 1 (0.67 expected), so the estimates are neither biased nor too noisy."""
    from eqrisk.data.demo import generate_demo
    from eqrisk.snapshot.versions import SnapshotStore

    snap = SnapshotStore(demo_home).current()
    truth = generate_demo().true_betas.set_index("symbol")
    r = np.asarray(snap.array("return"))
    z = []
    for symbol, row in truth.iterrows():
        etfs = [row.market_etf, row.sector_etf]
        if isinstance(row.subsector_etf, str):
            etfs.append(row.subsector_etf)
        keys = ["l3_mkt_hr", "l3_sec_hr", "l3_sub_hr"][: len(etfs)]
        i = snap.row_of[symbol]
        x = np.column_stack([r[snap.row_of[e]] for e in etfs])
        ok = np.isfinite(r[i]) & np.isfinite(x).all(axis=1)
        se = sm.OLS(r[i, ok], sm.add_constant(x[ok])).fit().bse[1:]
        true = np.array([row.hr_mkt, row.hr_sec, row.hr_sub][: len(etfs)])
        estimate = np.array([np.nanmean(snap.array(k)[i]) for k in keys])
        z.extend(np.abs(estimate - true) / se)
    z = np.array(z)
    assert len(z) > 450
    assert z.max() < 5
    assert np.median(z) < 1


def test_market_cap_rank_ranks_stocks_only() -> None:
    from eqrisk.model.run import cap_rank

    caps = np.array([[5.0, np.nan], [9.0, 3.0], [7.0, 4.0], [100.0, 100.0]])
    eligible = np.array([True, True, True, False])
    got = cap_rank(caps, eligible)
    assert nan_equal(got, np.array([[3.0, np.nan], [1.0, 2.0], [2.0, 1.0], [np.nan, np.nan]]))

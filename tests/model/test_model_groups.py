"""Issue 12, model truth: L3 columns of stocks without a subsector, leave-one-out group factors
and the missing-cap rule, checked against regressions built here with statsmodels."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm

from eqrisk.data.panel import Panel
from eqrisk.model.returns import group_portfolio, group_returns
from eqrisk.model.run import ModelParams, ModelResult, run_model
from helpers import nan_equal, shared_file
from model.group_reference import held_returns

WINDOW, MIN_OBS = 252, 126
TECH = ["AAPL", "AMD", "MSFT", "NVDA", "ORCL", "CSCO", "INTC", "QCOM"]
FINANCIALS = ["JPM", "BAC", "WFC", "C"]
ENERGY = ["XOM", "CVX", "COP"]


@pytest.fixture(scope="module")
def real_model(real_universe: tuple[Panel, pd.DataFrame]) -> ModelResult:
    panel, master = real_universe
    return run_model(panel, master, ModelParams(WINDOW, MIN_OBS))


def _subset(panel: Panel, keep: set[str], caps: dict[str, float] | None = None) -> Panel:
    """The panel's rows for `keep`; market caps = shares x adjusted close where `caps` names
    a share count (the others have none)."""
    rows = np.array([s in keep for s in panel.symbols])
    fields = {
        k: v[rows].copy()
        for k, v in panel.__dict__.items()
        if isinstance(v, np.ndarray) and v.ndim == 2
    }
    symbols = panel.symbols[rows]
    if caps is not None:
        shares = np.array([caps.get(s, np.nan) for s in symbols])
        fields["market_cap"] = shares[:, None] * fields["close"]
    return Panel(**{**panel.__dict__, **fields, "symbols": symbols})


def _share_counts() -> dict[str, float]:
    fin = pd.read_csv(shared_file("constituents_financials.csv"))
    return dict(zip(fin["Symbol"], fin["Market Cap"] / fin["Price"], strict=True))


def _prev_caps(panel: Panel) -> np.ndarray:
    caps = np.full(panel.market_cap.shape, np.nan)
    caps[:, 1:] = panel.market_cap[:, :-1]
    return caps


def _weighted_mean(r: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Per column, sum(w r) / sum(w) over the rows with a return (written out, no model code)."""
    out = np.full(r.shape[1], np.nan)
    for t in range(r.shape[1]):
        ok = np.isfinite(r[:, t]) & (w[:, t] > 0)
        if ok.any():
            out[t] = float(np.sum(w[ok, t] * r[ok, t]) / np.sum(w[ok, t]))
    return out


# ---- (4) L3 columns for stocks without a subsector ----------------------------------------


def test_stock_without_subsector_carries_l2_factor_and_residual_returns(
    real_universe, real_model
) -> None:
    panel, master = real_universe
    row = panel.index_of()
    m = real_model.metrics
    r = m["return"]
    assert master.set_index("symbol").loc["AAPL", "subsector_etf"] is None
    i = row["AAPL"]
    # The L2 hedge of yesterday on today's SPY and XLK, computed here from the hedge ratios.
    spy, xlk = r[row["SPY"]], r[row["XLK"]]
    expected = np.full(r.shape[1], np.nan)
    expected[1:] = m["l2_mkt_hr"][i, :-1] * spy[1:] + m["l2_sec_hr"][i, :-1] * xlk[1:]
    ok = np.isfinite(expected)
    assert ok.sum() > 3500
    np.testing.assert_allclose(m["l3_cfr"][i, ok], expected[ok], rtol=0, atol=1e-15)
    np.testing.assert_allclose(m["l3_rr"][i, ok], r[i, ok] - expected[ok], rtol=0, atol=1e-15)
    assert nan_equal(m["l3_cfr"][i], m["l2_cfr"][i])
    assert nan_equal(m["l3_rr"][i], m["l2_rr"][i])
    # Every stock without a subsector ETF: its L3 columns are published wherever L2 is.
    no_sub = np.array([h is None for h in real_model.hierarchy["subsector"]])
    sector = np.array([h is not None for h in real_model.hierarchy["sector"]])
    both = no_sub & sector
    assert both.sum() > 250
    assert nan_equal(m["l3_rr"][both], m["l2_rr"][both])
    assert np.isfinite(m["l3_rr"][both]).sum() > 250 * 2000


def test_unclassified_stock_carries_its_market_level_in_every_column(real_universe) -> None:
    panel, master = real_universe
    sub = _subset(panel, {"SPY", "XLK", "AAPL", "MSFT", "BRK.B"})
    # BRK.B without a master row: an unclassified stock, hedged with the market only.
    keep = master[master["symbol"].isin(["SPY", "XLK", "AAPL", "MSFT"])]
    result = run_model(sub, keep, ModelParams(WINDOW, MIN_OBS))
    i = sub.index_of()["BRK.B"]
    m = result.metrics
    r = m["return"]
    spy = r[sub.index_of()["SPY"]]
    t = 3000
    y, x = r[i, t - WINDOW + 1 : t + 1], spy[t - WINDOW + 1 : t + 1]
    ok = np.isfinite(y) & np.isfinite(x)
    beta = sm.OLS(y[ok], sm.add_constant(x[ok])).fit().params[1]
    for level in ("l1", "l2", "l3"):
        assert abs(m[f"{level}_mkt_hr"][i, t] - beta) < 1e-10, level
    assert np.isnan(m["l2_sec_hr"][i]).all() and np.isnan(m["l3_sub_hr"][i]).all()
    expected = m["l1_mkt_hr"][i, t - 1] * spy[t]
    for level in ("l1", "l2", "l3"):
        assert abs(m[f"{level}_cfr"][i, t] - expected) < 1e-15, level
        assert abs(m[f"{level}_rr"][i, t] - (r[i, t] - expected)) < 1e-15, level
    published = np.isfinite(m["l1_rr"][i])
    assert published.sum() > 3000 and nan_equal(m["l3_rr"][i], m["l1_rr"][i])


# ---- (2) leave-one-out group factors -------------------------------------------------------


@pytest.fixture(scope="module")
def group_universe(real_universe) -> tuple[Panel, pd.DataFrame, ModelResult]:
    """Stocks only, no ETF at all, every stock with a share count: cap-weighted groups."""
    panel, master = real_universe
    names = {*TECH, *FINANCIALS, *ENERGY}
    shares = _share_counts()
    assert names <= set(shares)
    sub = _subset(panel, names, caps=shares)
    m = master[master["symbol"].isin(names)]
    return sub, m, run_model(sub, m, ModelParams(WINDOW, MIN_OBS))


def test_leave_one_out_betas_equal_an_explicit_regression(group_universe) -> None:
    panel, master, result = group_universe
    hier = result.hierarchy.set_index("symbol")
    assert hier.loc["NVDA", "market"] == "group:market:all"
    assert hier.loc["NVDA", "sector"] == "group:sector:Information Technology"
    rows = panel.index_of()
    r = result.metrics["return"]
    caps = _prev_caps(panel)
    tech = np.array([rows[s] for s in TECH])
    info = master.set_index("symbol")
    # Each group's members' returns as the portfolio holds them (every row is a stock here).
    held_all = held_returns(r)
    held_sector = {
        sec: (idx := np.array([rows[s] for s in panel.symbols if info.loc[s, "gics_sector"] == sec]),
              held_returns(r[idx]))
        for sec in set(info.loc[list(panel.symbols), "gics_sector"])
    }  # fmt: skip
    checked = 0
    for symbol in ("NVDA", "AAPL", "JPM", "XOM"):
        i = rows[symbol]
        sector = info.loc[symbol, "gics_sector"]
        peers = [rows[s] for s in panel.symbols if s != symbol]
        idx, held = held_sector[sector]
        keep = idx != i
        # The groups without the stock, weighted by the others' previous caps, built here.
        market = _weighted_mean(held_all[peers], caps[peers])
        sec = _weighted_mean(held[keep], caps[idx[keep]])
        for t in (1500, 3000, 4100):
            window = slice(t - WINDOW + 1, t + 1)
            y, x = r[i, window], np.column_stack([market[window], sec[window]])
            ok = np.isfinite(y) & np.isfinite(x).all(axis=1)
            fit2 = sm.OLS(y[ok], sm.add_constant(x[ok])).fit()
            fit1 = sm.OLS(y[ok], sm.add_constant(x[ok, :1])).fit()
            m = result.metrics
            assert abs(m["l2_mkt_hr"][i, t] - fit2.params[1]) < 1e-10, symbol
            assert abs(m["l2_sec_hr"][i, t] - fit2.params[2]) < 1e-10, symbol
            assert abs(m["l1_mkt_hr"][i, t] - fit1.params[1]) < 1e-10, symbol
            assert abs(m["l2_res_er"][i, t] - (1 - fit2.rsquared)) < 1e-10, symbol
            checked += 1
    assert checked == 12
    # The published group factor stays the whole group's (the stock included).
    k = result.flat.names.index("Information_Technology")
    idx, held = held_sector["Information Technology"]
    assert sorted(idx) == sorted(tech)
    full_sector = _weighted_mean(held, caps[idx])
    src = result.flat.sources[k]
    assert result.factor_keys[src] == "group:sector:Information Technology"
    # Service A's sector factor is that series cleaned of the (whole) market.
    full_market = _weighted_mean(held_all, caps)
    t = 3000
    ok = np.isfinite(full_sector[t - 252 : t]) & np.isfinite(full_market[t - 252 : t])
    g = (
        sm.OLS(full_sector[t - 252 : t][ok], sm.add_constant(full_market[t - 252 : t][ok]))
        .fit()
        .params[1]
    )
    assert abs(result.flat.returns[k, t] - (full_sector[t] - g * full_market[t])) < 1e-12


def test_leave_one_out_residual_uses_the_group_without_the_stock(group_universe) -> None:
    panel, _master, result = group_universe
    rows = panel.index_of()
    r = result.metrics["return"]
    caps = _prev_caps(panel)
    i = rows["NVDA"]
    peers = [rows[s] for s in panel.symbols if s != "NVDA"]
    market = _weighted_mean(held_returns(r)[peers], caps[peers])
    m = result.metrics
    t = 3500
    expected = m["l1_mkt_hr"][i, t - 1] * market[t]
    assert abs(m["l1_cfr"][i, t] - expected) < 1e-15
    assert abs(m["l1_rr"][i, t] - (r[i, t] - expected)) < 1e-15


def test_a_stock_alone_in_its_sector_gets_no_sector_group(real_universe) -> None:
    panel, master = real_universe
    sub = _subset(panel, {"AAPL", "MSFT", "NVDA", "XOM"})
    result = run_model(sub, master[master["symbol"].isin(sub.symbols)], ModelParams())
    hier = result.hierarchy.set_index("symbol")
    assert hier.loc["XOM", "sector"] is None  # without itself its sector would be empty
    assert hier.loc["NVDA", "sector"] == "group:sector:Information Technology"
    i = sub.index_of()["XOM"]
    assert np.isfinite(result.metrics["l1_mkt_hr"][i]).sum() > 3000


def test_leave_one_out_rows_of_a_small_group() -> None:
    r = np.array([[np.nan, 0.01, 0.02], [np.nan, 0.03, np.nan], [np.nan, -0.01, 0.04]])
    caps = np.array([[100.0, 110.0, 120.0], [300.0, 310.0, 320.0], [50.0, 60.0, 70.0]])
    loo = group_portfolio(r, np.array([0, 1, 2]), caps).leave_one_out()
    assert loo[0, 1] == pytest.approx((300 * 0.03 - 50 * 0.01) / 350, abs=1e-15)
    assert loo[1, 1] == pytest.approx((100 * 0.01 - 50 * 0.01) / 150, abs=1e-15)
    assert loo[1, 2] == pytest.approx((110 * 0.02 + 60 * 0.04) / 170, abs=1e-15)
    assert loo[0, 2] == pytest.approx(0.04, abs=1e-15)  # member 1 has no return that day
    assert np.isnan(loo[:, 0]).all()


# ---- (3) missing caps ---------------------------------------------------------------------


def test_missing_caps_get_the_median_cap_of_the_day_never_zero() -> None:
    r = np.array([[np.nan, 0.01, 0.02], [np.nan, 0.03, np.nan], [np.nan, -0.01, 0.04]])
    caps = np.array([[100.0, 110.0, 120.0], [300.0, 310.0, 320.0], [np.nan, np.nan, np.nan]])
    group = group_portfolio(r, np.array([0, 1, 2]), caps)
    assert group.imputed.tolist() == [False, False, True]
    got = group_returns(r, np.array([0, 1, 2]), caps)
    # Day 1: member 2 weighs the median of 100 and 300; day 2: the only known cap, 110.
    assert got[1] == pytest.approx((100 * 0.01 + 300 * 0.03 + 200 * -0.01) / 600, abs=1e-15)
    assert got[2] == pytest.approx((110 * 0.02 + 110 * 0.04) / 220, abs=1e-15)
    # No cap at all: equal weights.
    eq = group_returns(r, np.array([0, 2]), None)
    assert eq[1] == pytest.approx(0.0, abs=1e-15)


def test_partly_capped_universe_weights_every_stock_and_says_how_many(real_universe) -> None:
    panel, master = real_universe
    names = {*TECH, *FINANCIALS, *ENERGY}
    shares = _share_counts()
    uncapped = {"AMD", "BAC", "COP"}
    sub = _subset(panel, names, caps={s: v for s, v in shares.items() if s not in uncapped})
    result = run_model(sub, master[master["symbol"].isin(names)], ModelParams(WINDOW, MIN_OBS))
    assert result.notes["caps_imputed"] == 3
    assert result.notes["caps_imputed_symbols"] == sorted(uncapped)
    rows = sub.index_of()
    r = result.metrics["return"]
    caps = _prev_caps(sub)
    # The published market factor, built here: known caps, and the day's median for the rest.
    has_r = np.isfinite(r)
    known = has_r & np.isfinite(caps)
    med = np.array(
        [
            np.median(caps[known[:, t], t]) if known[:, t].any() else np.nan
            for t in range(r.shape[1])
        ]
    )
    w = np.where(known, caps, np.where(has_r, med[None, :], 0.0))
    market = _weighted_mean(held_returns(r), w)
    key = result.factor_keys.index("group:market:all")
    t = np.flatnonzero(np.isfinite(market))
    np.testing.assert_allclose(result.flat.returns[0, t], market[t], rtol=1e-12, atol=1e-15)
    assert result.flat.sources[0] == key
    # AMD's weight is not zero: its return moves the market factor on every day it trades.
    i = rows["AMD"]
    day = 3000
    assert w[i, day] > 0 and w[i, day] == med[day]


def test_ingest_and_build_say_how_many_stocks_the_caps_rule_touched(tmp_path) -> None:
    from eqrisk.build.pipeline import build_snapshot
    from eqrisk.data.ingest import ingest

    universe = pd.read_csv(shared_file("small_universe.csv"))
    stocks = universe[universe["kind"] == "stock"].copy()
    wide = pd.read_csv(shared_file("small_adjclose_2019_2026.csv.gz"))
    # A universe of stocks only (no ETF: every level is a group portfolio), five without a cap.
    prices = tmp_path / "stocks.csv"
    wide[["date", *stocks["symbol"]]].to_csv(prices, index=False)
    blank = sorted(stocks["symbol"].iloc[[0, 10, 20, 30, 40]])
    stocks.loc[stocks["symbol"].isin(blank), "market_cap_2026_08_22"] = np.nan
    master = tmp_path / "master.csv"
    stocks.to_csv(master, index=False)
    home = tmp_path / "home"
    report = ingest([prices], master, home=home)
    partial = [i for i in report.issues if i["code"] == "PARTIAL_CAPS"]
    assert partial and partial[0]["count"] == 5 and partial[0]["examples"] == blank
    manifest = build_snapshot(home, ModelParams(WINDOW, MIN_OBS))
    assert manifest["model"]["caps_imputed"] == 5
    assert manifest["model"]["caps_imputed_symbols"] == blank
    assert manifest["model"]["leave_one_out_rows"] > len(stocks)  # market and sector groups


# ---- Service A's residual of a member of a sector group (issue 39) ------------------------


def test_service_a_residual_of_a_small_sector_group_uses_the_group_without_the_stock(
    real_universe,
) -> None:
    """SPY is the market, Information Technology a cap-weighted group of three (no XLK). NVDA's
    b_sec is a coefficient on its group without itself, so its residual subtracts that series
    cleaned of the market (link beta g of the series on SPY, the previous session's): checked
    here against statsmodels fits and the group built by hand, session by session, and its
    variance equals that leave-one-out residual's (the whole group's is 0.93 of it here)."""
    panel, master = real_universe
    names = {"SPY", "AAPL", "MSFT", "NVDA"}
    sub = _subset(panel, names, caps=_share_counts())
    result = run_model(sub, master[master["symbol"].isin(names)], ModelParams(WINDOW, MIN_OBS))
    hier = result.hierarchy.set_index("symbol")
    assert hier.loc["NVDA", "market"] == "SPY"
    assert hier.loc["NVDA", "sector"] == "group:sector:Information Technology"
    rows = sub.index_of()
    r = result.metrics["return"]
    caps = _prev_caps(sub)
    members = np.array([rows[s] for s in ("AAPL", "MSFT", "NVDA")])
    held = held_returns(r[members])
    m = r[rows["SPY"]]
    i = rows["NVDA"]
    keep = members != i
    s_loo = _weighted_mean(held[keep], caps[members[keep]])

    def fit(y: np.ndarray, *xs: np.ndarray, t: int) -> np.ndarray:
        """OLS params on the window ending at t, on the sessions where all have a value."""
        window = slice(t - WINDOW + 1, t + 1)
        x = np.column_stack([v[window] for v in xs])
        ok = np.isfinite(y[window]) & np.isfinite(x).all(axis=1)
        assert ok.sum() >= MIN_OBS
        return np.asarray(sm.OLS(y[window][ok], sm.add_constant(x[ok])).fit().params)

    e = result.flat.resid_return[i]
    expected = {}
    for t in range(3000, 4100, 55):
        b_mkt = fit(r[i], m, t=t - 1)[1]
        b_sec = fit(r[i], m, s_loo, t=t - 1)[2]
        g = fit(s_loo, m, t=t - 1)[1]
        expected[t] = r[i, t] - b_mkt * m[t] - b_sec * (s_loo[t] - g * m[t])
        assert abs(e[t] - expected[t]) < 1e-10, (t, e[t], expected[t])
    # Over every session: the same series, so the same variance; the whole-group residual
    # (the stock inside its own factor) is visibly smaller.
    days = np.arange(3000, 4150)
    k = result.flat.names.index("Information_Technology")
    whole = r[i, days] - (
        result.flat.beta_mkt[i, days - 1] * m[days]
        + result.flat.beta_sec[i, days - 1] * result.flat.returns[k, days]
    )
    mine = e[days]
    ok = np.isfinite(mine) & np.isfinite(whole)
    assert ok.sum() > 1000
    ratio = np.var(whole[ok]) / np.var(mine[ok])
    assert ratio < 0.97, ratio  # 0.93 here
    sampled = np.array(list(expected))
    want = np.array(list(expected.values()))
    assert np.var(e[sampled]) == pytest.approx(np.var(want), rel=1e-9)

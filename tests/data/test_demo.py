"""The synthetic demo market: deterministic, realistic in shape, and with recoverable betas."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from eqrisk.data.calendar import sessions_between
from eqrisk.data.demo import DATA_SOURCE, DemoMarket, generate_demo, write_demo_files
from eqrisk.data.master import MAG7, Mappings, classify, etf_registry, sector_table
from eqrisk.data.panel import RAW_MASTER_COLUMNS, to_panel

START, END = "2014-01-02", "2026-10-30"
SUBSECTOR_ETFS = set(
    [
        "SMH",
        "IGV",
        "KRE",
        "KBE",
        "KIE",
        "IAI",
        "XBI",
        "XPH",
        "IHI",
        "XOP",
        "OIH",
        "XME",
        "GDX",
        "ITB",
        "XHB",
        "XRT",
        "ITA",
        "IYT",
        "JETS",
        "FDN",
    ]
)
MAG7_CLASS = {
    "AAPL": ("Apple Inc.", "Information Technology", "Technology Hardware, Storage & Peripherals"),
    "MSFT": ("Microsoft Corporation", "Information Technology", "Systems Software"),
    "GOOGL": ("Alphabet Inc.", "Communication Services", "Interactive Media & Services"),
    "AMZN": ("Amazon.com, Inc.", "Consumer Discretionary", "Broadline Retail"),
    "NVDA": ("NVIDIA Corporation", "Information Technology", "Semiconductors"),
    "META": ("Meta Platforms, Inc.", "Communication Services", "Interactive Media & Services"),
    "TSLA": ("Tesla, Inc.", "Consumer Discretionary", "Automobile Manufacturers"),
}
# Official GICS (2023) sector of every sub-industry the demo may use: an independent check that
# names are spelled as in the standard and sit in their real sector.
GICS_SECTOR_OF = {
    "Oil & Gas Exploration & Production": "Energy",
    "Oil & Gas Equipment & Services": "Energy",
    "Integrated Oil & Gas": "Energy",
    "Oil & Gas Refining & Marketing": "Energy",
    "Oil & Gas Storage & Transportation": "Energy",
    "Steel": "Materials",
    "Copper": "Materials",
    "Gold": "Materials",
    "Specialty Chemicals": "Materials",
    "Industrial Gases": "Materials",
    "Construction Materials": "Materials",
    "Paper & Plastic Packaging Products & Materials": "Materials",
    "Fertilizers & Agricultural Chemicals": "Materials",
    "Building Products": "Industrials",
    "Aerospace & Defense": "Industrials",
    "Rail Transportation": "Industrials",
    "Air Freight & Logistics": "Industrials",
    "Cargo Ground Transportation": "Industrials",
    "Passenger Airlines": "Industrials",
    "Industrial Machinery & Supplies & Components": "Industrials",
    "Electrical Components & Equipment": "Industrials",
    "Construction & Engineering": "Industrials",
    "Environmental & Facilities Services": "Industrials",
    "Homebuilding": "Consumer Discretionary",
    "Home Improvement Retail": "Consumer Discretionary",
    "Broadline Retail": "Consumer Discretionary",
    "Apparel Retail": "Consumer Discretionary",
    "Other Specialty Retail": "Consumer Discretionary",
    "Automotive Retail": "Consumer Discretionary",
    "Restaurants": "Consumer Discretionary",
    "Automobile Manufacturers": "Consumer Discretionary",
    "Automotive Parts & Equipment": "Consumer Discretionary",
    "Hotels, Resorts & Cruise Lines": "Consumer Discretionary",
    "Apparel, Accessories & Luxury Goods": "Consumer Discretionary",
    "Packaged Foods & Meats": "Consumer Staples",
    "Soft Drinks & Non-alcoholic Beverages": "Consumer Staples",
    "Household Products": "Consumer Staples",
    "Consumer Staples Merchandise Retail": "Consumer Staples",
    "Tobacco": "Consumer Staples",
    "Biotechnology": "Health Care",
    "Pharmaceuticals": "Health Care",
    "Health Care Equipment": "Health Care",
    "Health Care Supplies": "Health Care",
    "Managed Health Care": "Health Care",
    "Health Care Services": "Health Care",
    "Life Sciences Tools & Services": "Health Care",
    "Regional Banks": "Financials",
    "Diversified Banks": "Financials",
    "Property & Casualty Insurance": "Financials",
    "Life & Health Insurance": "Financials",
    "Insurance Brokers": "Financials",
    "Investment Banking & Brokerage": "Financials",
    "Asset Management & Custody Banks": "Financials",
    "Financial Exchanges & Data": "Financials",
    "Consumer Finance": "Financials",
    "Transaction & Payment Processing Services": "Financials",
    "Multi-Sector Holdings": "Financials",
    "Semiconductors": "Information Technology",
    "Semiconductor Materials & Equipment": "Information Technology",
    "Application Software": "Information Technology",
    "Systems Software": "Information Technology",
    "Internet Services & Infrastructure": "Information Technology",
    "Technology Hardware, Storage & Peripherals": "Information Technology",
    "IT Consulting & Other Services": "Information Technology",
    "Communications Equipment": "Information Technology",
    "Electronic Components": "Information Technology",
    "Interactive Media & Services": "Communication Services",
    "Integrated Telecommunication Services": "Communication Services",
    "Wireless Telecommunication Services": "Communication Services",
    "Movies & Entertainment": "Communication Services",
    "Cable & Satellite": "Communication Services",
    "Advertising": "Communication Services",
    "Electric Utilities": "Utilities",
    "Multi-Utilities": "Utilities",
    "Gas Utilities": "Utilities",
    "Water Utilities": "Utilities",
    "Retail REITs": "Real Estate",
    "Industrial REITs": "Real Estate",
    "Multi-Family Residential REITs": "Real Estate",
    "Health Care REITs": "Real Estate",
    "Telecom Tower REITs": "Real Estate",
    "Data Center REITs": "Real Estate",
}
NO_ETF_EXAMPLES = [
    "Electric Utilities",
    "Packaged Foods & Meats",
    "Integrated Oil & Gas",
    "Industrial Machinery & Supplies & Components",
    "Specialty Chemicals",
    "Managed Health Care",
    "Consumer Finance",
    "Restaurants",
    "Retail REITs",
    "Integrated Telecommunication Services",
    "Technology Hardware, Storage & Peripherals",
]


@pytest.fixture(scope="module")
def market() -> DemoMarket:
    return generate_demo(seed=7, start=START, end=END)


@pytest.fixture(scope="module")
def close(market: DemoMarket) -> pd.DataFrame:
    """Adjusted close, sessions x symbols (NaN where a symbol has no row)."""
    return market.prices.pivot(index="date", columns="symbol", values="close")


@pytest.fixture(scope="module")
def returns(close: pd.DataFrame) -> pd.DataFrame:
    """Simple returns between consecutive sessions (NaN across a gap: halts, before listing)."""
    return close.pct_change(fill_method=None)


@pytest.fixture(scope="module")
def stocks(market: DemoMarket) -> pd.DataFrame:
    return market.master[market.master["asset_type"] == "stock"].set_index("symbol")


# ---------------------------------------------------------------------------------------------


def test_deterministic_per_seed(market: DemoMarket) -> None:
    again = generate_demo(seed=7, start=START, end=END)
    pd.testing.assert_frame_equal(market.prices, again.prices)
    pd.testing.assert_frame_equal(market.master, again.master)
    pd.testing.assert_frame_equal(market.true_betas, again.true_betas)
    other = generate_demo(seed=8, start=START, end=END)
    spy = market.prices[market.prices["symbol"] == "SPY"]["close"].to_numpy()
    spy8 = other.prices[other.prices["symbol"] == "SPY"]["close"].to_numpy()
    assert len(spy) == len(spy8)
    assert not np.allclose(spy, spy8)
    assert not market.true_betas["hr_mkt"].equals(other.true_betas["hr_mkt"])
    assert DATA_SOURCE == "demo-synthetic"


def test_generation_is_fast() -> None:
    t0 = time.perf_counter()
    generate_demo(seed=11)
    assert time.perf_counter() - t0 < 3.0


def test_frames_have_the_documented_columns(market: DemoMarket) -> None:
    assert list(market.prices.columns) == [
        "date", "symbol", "close", "open", "high", "low", "close_raw", "volume",
    ]  # fmt: skip
    assert str(market.prices["date"].dtype).startswith("datetime64")
    assert list(market.master.columns) == RAW_MASTER_COLUMNS
    assert list(market.true_betas.columns) == [
        "symbol", "market_etf", "sector_etf", "subsector_etf",
        "hr_mkt", "hr_sec", "hr_sub", "idio_vol",
    ]  # fmt: skip
    assert not market.prices.duplicated(["symbol", "date"]).any()
    assert market.master["symbol"].is_unique
    numeric = market.prices[["close", "open", "high", "low", "close_raw", "volume"]]
    assert np.isfinite(numeric.to_numpy()).all()


def test_dates_are_exactly_the_nyse_sessions(market: DemoMarket, close: pd.DataFrame) -> None:
    sessions = sessions_between(START, END)
    assert pd.DatetimeIndex(close.index).equals(sessions)
    assert close["SPY"].notna().all()  # the market ETF trades every session
    assert (sessions[-1] - sessions[0]).days >= 12 * 365
    short = generate_demo(seed=3, start="2016-01-04", end="2021-12-31")
    dates = pd.DatetimeIndex(sorted(short.prices["date"].unique()))
    assert dates.equals(sessions_between("2016-01-04", "2021-12-31"))
    with pytest.raises(ValueError, match="at least 1000 sessions"):
        generate_demo(start="2020-01-02", end="2021-12-31")


def test_etfs_present_with_registry_names(market: DemoMarket) -> None:
    etfs = market.master[market.master["asset_type"] == "etf"].set_index("symbol")
    sector_etfs = set(sector_table()["etf"])
    assert len(sector_etfs) == 11
    assert set(Mappings.load().subsector_etf.values()) == SUBSECTOR_ETFS
    assert set(etfs.index) == {"SPY"} | sector_etfs | SUBSECTOR_ETFS
    registry = etf_registry().set_index("symbol")
    for sym, row in etfs.iterrows():
        assert row["name"] == registry.loc[sym, "name"]
        for col in ("gics_sector", "gics_sub_industry"):
            assert ("" if pd.isna(row[col]) else row[col]) == registry.loc[sym, col]
        assert np.isnan(row["shares"])
    # every ETF has the full history
    counts = market.prices.groupby("symbol").size()
    assert (counts[list(etfs.index)] == len(sessions_between(START, END))).all()


def test_universe_size_classification_and_tickers(market: DemoMarket, stocks: pd.DataFrame) -> None:
    assert len(stocks) >= 180
    assert set(market.true_betas["symbol"]) == set(stocks.index)
    registry = set(etf_registry()["symbol"])
    synthetic = stocks.drop(index=list(MAG7))
    assert synthetic.index.str.fullmatch(r"[A-Z]{3,4}").all()
    assert not (set(synthetic.index) & registry)
    assert synthetic["name"].is_unique
    assert synthetic["name"].str.fullmatch(r"[A-Z][a-z]+ [A-Z][A-Za-z &]+").all()
    for sub, sector in zip(stocks["gics_sub_industry"], stocks["gics_sector"], strict=True):
        assert GICS_SECTOR_OF[sub] == sector, sub
    # every sector >= 8 stocks, each with some stocks whose sub-industry has no subsector ETF
    mappings = Mappings.load()
    no_etf = ~stocks["gics_sub_industry"].isin(list(mappings.subsector_etf))
    assert set(stocks["gics_sector"]) == set(sector_table()["gics_sector"])
    assert (stocks.groupby("gics_sector").size() >= 8).all()
    assert set(stocks.loc[no_etf, "gics_sector"]) == set(sector_table()["gics_sector"])
    assert set(NO_ETF_EXAMPLES) <= set(stocks["gics_sub_industry"])
    assert not set(NO_ETF_EXAMPLES) & set(mappings.subsector_etf)
    # every subsector ETF has >= 4 stocks among the sub-industries it stands for
    per_etf = stocks["gics_sub_industry"].map(mappings.subsector_etf).value_counts()
    assert set(per_etf.index) == SUBSECTOR_ETFS
    assert (per_etf >= 4).all(), per_etf[per_etf < 4]


def test_true_betas_match_classify_and_ranges(market: DemoMarket) -> None:
    tb = market.true_betas.set_index("symbol")
    full = classify(market.master, Mappings.load()).set_index("symbol")
    stocks = full[full["asset_type"] == "stock"]
    assert set(stocks.index) == set(tb.index)
    assert (tb["market_etf"] == "SPY").all()
    assert (stocks.loc[tb.index, "sector_etf"] == tb["sector_etf"]).all()
    sub_classified = stocks.loc[tb.index, "subsector_etf"].fillna("NONE")
    assert (sub_classified == tb["subsector_etf"].fillna("NONE")).all()
    has_sub = tb["subsector_etf"].notna()
    assert has_sub.sum() >= 80 and (~has_sub).sum() >= 80
    assert tb.loc[~has_sub, "hr_sub"].isna().all() and tb.loc[has_sub, "hr_sub"].notna().all()
    assert tb["hr_mkt"].between(0.3, 1.5).all()
    assert tb["hr_sec"].between(-0.2, 1.2).all()
    assert tb.loc[has_sub, "hr_sub"].between(0.0, 1.0).all()
    assert tb["idio_vol"].between(0.01, 0.03).all()


def test_mag7_real_names_classes_and_the_largest_caps(
    market: DemoMarket, stocks: pd.DataFrame
) -> None:
    for sym, (name, sector, sub) in MAG7_CLASS.items():
        assert tuple(stocks.loc[sym, ["name", "gics_sector", "gics_sub_industry"]]) == (
            name, sector, sub,
        )  # fmt: skip
    last = market.prices.groupby("symbol").tail(1).set_index("symbol")
    cap = (stocks["shares"] * last.loc[stocks.index, "close_raw"]).sort_values(ascending=False)
    assert set(cap.index[:7]) == set(MAG7)
    assert cap.iloc[6] > 5e11 and cap.iloc[0] < 4.5e12
    assert cap.iloc[-1] > 4e9
    # plausible price levels: raw closes between $1 and $1000 on the last session
    assert last.loc[list(MAG7), "close_raw"].between(100, 1000).all()
    assert last.loc[stocks.index, "close_raw"].between(1, 1000).all()


def test_late_listings_delistings_and_halts(market: DemoMarket, close: pd.DataFrame) -> None:
    sessions = close.index
    first = close.apply(pd.Series.first_valid_index)
    last = close.apply(pd.Series.last_valid_index)
    late = first[first > sessions[0] + pd.Timedelta(days=730)]  # listed 2+ years after start
    assert len(late) >= 8
    assert not set(late.index) & set(MAG7)
    gone = last[last < sessions[-1]]
    assert len(gone) >= 2
    assert set(gone.index) <= set(market.true_betas["symbol"])
    assert set(gone.index) <= set(market.master["symbol"])
    # halts: isolated missing sessions strictly inside a symbol's listed life
    pos = pd.Series(np.arange(len(sessions)), index=sessions)
    halted = {}
    for sym in close.columns:
        lo, hi = pos[first[sym]], pos[last[sym]]
        gaps = np.flatnonzero(close[sym].iloc[lo : hi + 1].isna().to_numpy())
        if len(gaps):
            halted[sym] = gaps
    assert len(halted) >= 3
    for gaps in halted.values():
        assert 1 <= len(gaps) <= 3
        assert (np.diff(gaps) > 1).all()  # isolated, never two sessions in a row


def test_spy_has_fat_tails_and_a_plausible_vol(returns: pd.DataFrame) -> None:
    spy = returns["SPY"].dropna()
    assert spy.kurt() > 1.0  # pandas kurt() is the excess kurtosis
    assert 0.10 < spy.std() * np.sqrt(252) < 0.25
    # volatility clustering: |r| is autocorrelated (iid returns would give ~0 +- 0.02)
    a = spy.abs()
    assert a.autocorr(1) > 0.05
    values = returns.to_numpy()
    assert np.nanmin(values) > -0.9
    assert np.nanmax(np.abs(values)) < 0.5  # below ingest's default suspect-move flag


def test_ohlc_consistent_and_volume_positive(market: DemoMarket, returns: pd.DataFrame) -> None:
    p = market.prices
    lo = np.minimum(p["open"], p["close_raw"])
    hi = np.maximum(p["open"], p["close_raw"])
    assert (p["low"] > 0).all()
    assert (p["low"] <= lo).all() and (hi <= p["high"]).all()
    assert (p["volume"] > 0).all() and (p["volume"] == np.round(p["volume"])).all()
    # open = previous raw close x exp(small gap), away from split days
    raw = p.pivot(index="date", columns="symbol", values="close_raw")
    opens = p.pivot(index="date", columns="symbol", values="open")
    gap = np.log(opens / raw.shift(1)).drop(columns=["NVDA", "TSLA"])
    assert np.nanmax(np.abs(gap.to_numpy())) < 0.25
    assert np.nanmedian(np.abs(gap.to_numpy())) < 0.01
    # more volume on big-move days: volume relative to the symbol's median, by |return| bucket
    vol = p.pivot(index="date", columns="symbol", values="volume")
    rel = (vol / vol.median()).stack()
    size = (returns.abs() / returns.std()).stack()
    joined = pd.concat([rel.rename("v"), size.rename("s")], axis=1).dropna()
    big = joined.loc[joined["s"] > 2.5, "v"].median()
    calm = joined.loc[joined["s"] < 0.5, "v"].median()
    assert big > 1.5 * calm


def test_splits_jump_raw_but_not_adjusted(market: DemoMarket) -> None:
    p = market.prices.set_index(["symbol", "date"]).sort_index()
    for sym, splits in {"NVDA": [("2021-07-20", 4.0), ("2024-06-10", 10.0)],
                        "TSLA": [("2020-08-31", 5.0), ("2022-08-25", 3.0)]}.items():  # fmt: skip
        s = p.loc[sym]
        dates = s.index
        expected = np.ones(len(s))
        for day, r in splits:
            expected[dates < pd.Timestamp(day)] *= r
        # the raw close to 4 decimals, the adjusted one that close over the split factor to 6
        raw, adjusted = s["close_raw"].to_numpy(), s["close"].to_numpy()
        np.testing.assert_array_equal(raw, np.round(raw, 4))
        np.testing.assert_array_equal(adjusted, np.round(raw / expected, 6))
        for day, r in splits:
            k = dates.get_loc(pd.Timestamp(day))
            raw_move = s["close_raw"].iloc[k] / s["close_raw"].iloc[k - 1]
            adj_move = s["close"].iloc[k] / s["close"].iloc[k - 1]
            assert abs(adj_move - 1) < 0.3  # continuous
            # raw falls by the ratio (to the prices' decimals)
            assert raw_move == pytest.approx(adj_move / r, rel=1e-4)
            # the split-day open is near the split-adjusted previous close, not the old raw one
            assert abs(np.log(s["open"].iloc[k] * r / s["close_raw"].iloc[k - 1])) < 0.25
            # volume as traded: more shares change hands after the split
            pre = s["volume"].iloc[k - 60 : k].median()
            post = s["volume"].iloc[k : k + 60].median()
            assert post / pre > r / 3
    # no split anywhere else: raw close equals adjusted close exactly
    others = market.prices[~market.prices["symbol"].isin(["NVDA", "TSLA"])]
    assert (others["close_raw"] == others["close"]).all()


def test_ols_recovers_the_true_betas(market: DemoMarket, returns: pd.DataFrame) -> None:
    """OLS of each stock's full-sample return on (1, SPY, sector ETF[, subsector ETF]).

    The stock's return is alpha + betas . ETF returns + eps by construction, with eps i.i.d.
    (t(4), finite variance) and independent of the ETFs, so OLS is unbiased and its classical
    standard error sigma_eps * sqrt(diag((X'X)^-1)) is the right yardstick; t(4) noise only
    matters through its variance, and the CLT applies at >= 800 observations.
    Tolerance: 5 standard errors per coefficient. Over ~500 coefficients the chance that a
    single honest estimate lands outside is about 500 x 6e-7 = 3e-4. Typical standard errors
    are 0.03-0.10 (idio vol 1-3% a day, ~3200 sessions; more for late listings and for hr_mkt,
    which SPY shares with the sector ETF), so the bound is tight enough to catch a wrong
    structure: the test also checks the z-scores are calibrated (std near 1) and bounds the
    standard errors themselves.
    """
    tb = market.true_betas
    z_scores, ses, errors = [], [], []
    for row in tb.itertuples(index=False):
        regressors = ["SPY", row.sector_etf] + ([row.subsector_etf] if row.subsector_etf else [])
        data = returns[[row.symbol, *regressors]].dropna()
        y = data[row.symbol].to_numpy()
        x = np.column_stack([np.ones(len(data)), data[regressors].to_numpy()])
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        resid = y - x @ coef
        sigma2 = resid @ resid / (len(y) - x.shape[1])
        se = np.sqrt(sigma2 * np.diag(np.linalg.inv(x.T @ x)))[1:]
        truth = np.array([row.hr_mkt, row.hr_sec] + ([row.hr_sub] if row.subsector_etf else []))
        err = coef[1:] - truth
        assert np.all(np.abs(err) <= 5 * se), (row.symbol, coef[1:], truth, se)
        # the residual is the idiosyncratic noise: its std is idio_vol (the sample std of
        # fat-tailed noise over 800+ days wanders by up to ~8% (1 sd), hence 20%)
        assert np.sqrt(sigma2) == pytest.approx(row.idio_vol, rel=0.2)
        z_scores.extend(err / se)
        ses.extend(se)
        errors.extend(np.abs(err))
    z = np.array(z_scores)
    assert len(z) >= 2 * len(tb) + 80
    assert 0.8 < z.std() < 1.2
    assert abs(z.mean()) < 0.2
    assert np.median(ses) < 0.08 and max(ses) < 0.35
    assert np.median(errors) < 0.06


def test_write_demo_files_round_trip(market: DemoMarket, tmp_path: Path) -> None:
    paths = write_demo_files(market, tmp_path / "demo")
    assert set(paths) == {"prices", "master"}
    assert paths["prices"].name.endswith(".csv.gz") and paths["master"].suffix == ".csv"
    vendor = pd.read_csv(paths["prices"], parse_dates=["date"])
    assert list(vendor.columns) == [
        "date", "symbol", "open", "high", "low", "close", "adjusted_close", "volume",
    ]  # fmt: skip
    assert len(vendor) == len(market.prices)
    back = vendor.merge(market.prices, on=["date", "symbol"], suffixes=("", "_orig"))
    assert len(back) == len(market.prices)
    np.testing.assert_allclose(back["adjusted_close"], back["close_orig"], rtol=1e-9, atol=0)
    np.testing.assert_allclose(back["close"], back["close_raw"], rtol=1e-12, atol=0)
    for col in ("open", "high", "low", "volume"):
        np.testing.assert_allclose(back[col], back[f"{col}_orig"], rtol=1e-12, atol=0)
    master = pd.read_csv(paths["master"])
    assert list(master.columns) == RAW_MASTER_COLUMNS
    pd.testing.assert_series_equal(master["symbol"], market.master["symbol"], check_dtype=False)
    np.testing.assert_allclose(master["shares"], market.master["shares"].astype(float))
    # byte-identical on a rewrite (no timestamp in the gzip header)
    again = write_demo_files(market, tmp_path / "again")
    assert again["prices"].read_bytes() == paths["prices"].read_bytes()


def test_panel_of_the_demo(market: DemoMarket) -> None:
    """The store's panel accepts the frame: every date a session, caps from shares x raw close."""
    panel = to_panel(market.prices, market.master)
    assert panel.shape == (market.master.shape[0], len(sessions_between(START, END)))
    idx = panel.index_of()
    aapl = panel.market_cap[idx["AAPL"]]
    assert aapl[-1] == pytest.approx(15.0e9 * panel.close_raw[idx["AAPL"], -1])

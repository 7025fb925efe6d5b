"""The factor frames notebook tools take (`factor_returns`, `factor_loadings`), `eqrisk export
factors`, and the documented pyfolio/empyrical example: equal to `/facts`, `/betas`, the hedge
ratios and `/resids` for every factor and date."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest

from eqrisk.api.app import create_app
from eqrisk.client import AsyncClient
from eqrisk.settings import Settings
from helpers import REPO_ROOT, export_factors

from .conftest import FUNDED, MakeClient

START = "2025-06-02"


def _days(values: pd.Index | pd.Series) -> pd.DatetimeIndex:
    return pd.DatetimeIndex(pd.to_datetime(values)).astype("datetime64[ns]")


def test_factor_returns_equal_facts_for_every_factor(make: MakeClient) -> None:
    c = make()
    frame = c.factor_returns(START)
    names = c.factor_names()
    assert names[0] == "Mkt" and len(names) == len(set(names)) > 2
    assert list(frame.columns) == names and frame.index.name == "date"
    for name in names:
        rows = c.facts(name, START)
        assert (rows["fact"] == name).all()
        column = frame[name].dropna()
        assert list(_days(column.index)) == list(_days(rows["teo"]))
        np.testing.assert_array_equal(column.to_numpy(), rows["factor_return"].to_numpy())


def test_factor_loadings_equal_betas_and_hedge_ratios(make: MakeClient) -> None:
    c = make()
    tickers = ["AAPL", "NVDA", "ZAM", "ZENA", "SPY"]
    frame = c.factor_loadings(tickers, START)
    names = c.factor_names()
    styles = [r["fact"] for r in c.factor_list() if r["level"] == "style"]
    assert list(frame.columns) == names and frame.index.names == ["date", "ticker"]
    assert frame.index.is_monotonic_increasing and len(styles) >= 6
    flat = [n for n in names[1:] if n not in styles]
    for ticker in tickers:
        mine = frame.xs(ticker, level="ticker")
        mkt = c.betas(ticker, "Mkt", START)
        assert list(_days(mine["Mkt"].dropna().index)) == list(_days(mkt["teo"]))
        np.testing.assert_array_equal(mine["Mkt"].dropna(), mkt["factor_beta"])
        sectors = [n for n in flat if len(c.betas(ticker, n, START))]
        assert len(sectors) <= 1
        # A style loading where /betas has one (the stock in the layer), 0.0 elsewhere.
        for name in styles:
            own = c.betas(ticker, name, START)
            assert (ticker == "SPY") == own.empty
            if own.empty:
                assert (mine[name] == 0.0).all()
                continue
            values = mine.loc[_days(own["teo"]), name]
            np.testing.assert_array_equal(values, own["factor_beta"])
            rest = mine[name].drop(_days(own["teo"]))
            assert (rest == 0.0).all(), (ticker, name)
        for name in flat:
            if name in sectors:
                own = c.betas(ticker, name, START)
                values = mine.loc[_days(own["teo"]), name]
                np.testing.assert_array_equal(values, own["factor_beta"])
            else:
                assert (mine[name] == 0.0).all(), (ticker, name)
        if ticker == "SPY":
            assert not sectors  # an ETF loads on the market only
            continue
        assert sectors, ticker
        # The flat model's betas are the hedge ratios: Mkt = L1 market, sector = L2 sector.
        hr = c.ticker_returns(ticker, years=10).set_index("date")
        hr = hr.loc[hr.index >= pd.Timestamp(START)]
        both = mine.join(hr.set_axis(_days(hr.index)), how="inner")
        assert len(both) > 100
        np.testing.assert_allclose(both["Mkt"], both["l1_mkt_hr"], rtol=1e-12, equal_nan=True)
        np.testing.assert_allclose(both[sectors[0]], both["l2_sec_hr"], rtol=1e-12, equal_nan=True)


def test_async_client_builds_the_same_frames(home: Path, make: MakeClient) -> None:
    c = make()

    async def frames() -> tuple[pd.DataFrame, pd.DataFrame]:
        app = create_app(Settings(home=home, _env_file=None))
        async with AsyncClient(api_key=FUNDED, transport=httpx.ASGITransport(app)) as a:
            return await a.factor_returns(START), await a.factor_loadings(["MSFT", "ZENA"], START)

    returns, loadings = asyncio.run(frames())
    pd.testing.assert_frame_equal(returns, c.factor_returns(START))
    pd.testing.assert_frame_equal(loadings, c.factor_loadings(["MSFT", "ZENA"], START))


def test_export_factors_writes_the_client_frames_for_the_whole_universe(
    home: Path, make: MakeClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    returns, loadings = export_factors(home, tmp_path, monkeypatch)
    c = make()
    first = str(returns.index[0].date())
    universe = c.tickers()["ticker"].tolist()
    assert len(universe) > 100
    expected_returns = c.factor_returns(first)
    expected_loadings = c.factor_loadings(universe, first)
    for got, want in ((returns, expected_returns), (loadings, expected_loadings)):
        got = got.copy()
        if isinstance(got.index, pd.MultiIndex):
            got.index = got.index.set_levels(_days(got.index.levels[0]), level="date")
            want.index = want.index.set_levels(_days(want.index.levels[0]), level="date")
            got.index = got.index.set_levels(got.index.levels[1].astype(object), level="ticker")
            want.index = want.index.set_levels(want.index.levels[1].astype(object), level="ticker")
        else:
            got.index, want.index = (
                _days(got.index).rename("date"),
                _days(want.index).rename("date"),
            )
        pd.testing.assert_frame_equal(got, want, check_column_type=False)
    assert set(loadings.index.get_level_values("ticker")) == set(universe)


def test_the_documented_example_attributes_to_the_factors_and_leaves_the_residual(
    make: MakeClient,
) -> None:
    pytest.importorskip("empyrical")
    sys.path.insert(0, str(REPO_ROOT / "examples"))
    try:
        from factor_attribution import attribute
    finally:
        sys.path.remove(str(REPO_ROOT / "examples"))
    c = make()
    # One stock: what the factors leave is the route's residual return (the flat model's)
    # less the style factors' part: the previous session's style loadings x their returns.
    _, alone = attribute(c, {"NVDA": 1.0}, START)
    resid = c.resids("NVDA", START).set_index("teo")["residual_return"]
    joined = alone.join(resid.set_axis(_days(resid.index)), how="inner")
    assert len(joined) > 100 and len(joined) == len(alone)
    styles = [r["fact"] for r in c.factor_list() if r["level"] == "style"]
    held = c.factor_loadings(["NVDA"], START).xs("NVDA", level="ticker")[styles].shift(1)
    style_part = (held * c.factor_returns(START)[styles].reindex(held.index)).sum(axis=1)
    expected = joined["residual_return"] - style_part.set_axis(_days(style_part.index))
    np.testing.assert_allclose(
        joined["specific_returns"], expected.reindex(joined.index), atol=1e-15
    )
    # A book: the common return is the weighted betas of the previous session times the
    # factor returns, computed here with numpy.
    weights = {"NVDA": 0.5, "ZAM": 0.3, "ZENA": -0.2}
    exposures, book = attribute(c, weights, START)
    loadings = c.factor_loadings(list(weights), START)
    factors = c.factor_returns(START)
    dates = book.index
    for day in dates[:: max(1, len(dates) // 40)]:
        previous = {
            t: loadings.xs(t, level="ticker").loc[: day - pd.Timedelta(days=1)].iloc[-1]
            for t in weights
        }
        exposure = sum(w * previous[t].to_numpy() for t, w in weights.items())
        np.testing.assert_allclose(exposures.loc[day].to_numpy(), exposure, rtol=1e-12)
        common = float(np.dot(exposure, factors.loc[day].to_numpy()))
        assert book.loc[day, "common_returns"] == pytest.approx(common, rel=1e-10, abs=1e-15)
    np.testing.assert_allclose(
        book["common_returns"] + book["specific_returns"], book["total_returns"], atol=1e-15
    )


def test_factor_names_come_from_factor_list_and_match_the_snapshot(
    make: MakeClient, home: Path
) -> None:
    """`factor_names` reads `GET /factor_list` (no 400 scraped): the snapshot's factors, `Mkt`
    first, each sector factor with the ETF its stocks' sector level uses."""
    from eqrisk.snapshot.versions import SnapshotStore

    c = make()
    records = c.factor_list()
    names = c.factor_names()
    snap = SnapshotStore(home).current()
    styles = list(snap.manifest["risk"]["styles"]["names"])  # the second layer's, last
    assert names == ["Mkt", *[n for n in snap.factor_names if n != "Mkt"], *styles]
    assert [r["fact"] for r in records] == names
    table = snap.symbols
    stocks = table[table["asset_type"] == "stock"]
    for record in records:
        if record["fact"] in styles:
            assert (record["level"], record["etf"], record["sector"]) == ("style", None, None)
            continue
        if record["fact"] == "Mkt":
            assert (record["level"], record["etf"], record["sector"]) == ("L1", "SPY", None)
            continue
        members = stocks[stocks["sector_factor"] == record["fact"]]
        assert record["level"] == "L2" and len(members)
        assert record["etf"] == members["sector_etf"].mode().iloc[0]
        assert record["sector"] == members["gics_sector"].mode().iloc[0]

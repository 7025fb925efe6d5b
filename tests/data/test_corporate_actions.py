"""Issue 12, corporate actions: total returns from raw closes and their factors (checked against
returns computed here from the file's own columns), and unadjusted splits kept out of the model
(hedge ratios checked against statsmodels on the unsplit returns)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm

from eqrisk.build.pipeline import build_snapshot
from eqrisk.data.corporate_actions import parse_split_ratio
from eqrisk.data.ingest import ingest
from eqrisk.data.ingested import read_ingested
from eqrisk.data.return_cleaning import PriceRows, detect_events
from eqrisk.model.run import ModelParams
from eqrisk.snapshot.versions import Snapshot, snapshots_dir
from helpers import shared_file

# Stocks with splits (AAPL 7:1 and 4:1, AOS 3:2 and 2:1, AFL 2:1) and quarterly dividends.
SYMBOLS = ["AAPL", "AOS", "AFL", "NVDA", "SPY", "JPM"]


@pytest.fixture(scope="module")
def ohlcv() -> pd.DataFrame:
    frame = pd.read_csv(shared_file("ohlcv_long_2010_2020.csv.gz"))
    return frame[frame["symbol"].isin(SYMBOLS)].sort_values(["symbol", "date"], ignore_index=True)


def _returns(frame: pd.DataFrame, column: str) -> pd.Series:
    """Per symbol, consecutive-row simple returns of a column (frame sorted by symbol, date)."""
    return frame.groupby("symbol")[column].pct_change()


def _stored(home: Path) -> pd.DataFrame:
    prices, _, _ = read_ingested(home)
    prices["date"] = pd.to_datetime(prices["date"]).dt.strftime("%Y-%m-%d")
    return prices.sort_values(["symbol", "date"], ignore_index=True)


def test_raw_closes_with_split_and_dividend_factors_give_total_returns(ohlcv, tmp_path) -> None:
    raw_file = tmp_path / "raw.csv"
    cols = ["date", "symbol", "close", "volume", "dividend_amount", "split_coefficient"]
    ohlcv[cols].to_csv(raw_file, index=False)
    home = tmp_path / "home"
    report = ingest([raw_file], None, home=home)
    assert report.ok
    assert not [i for i in report.issues if i["code"] == "SPLIT_SUSPECTED"]
    stored = _stored(home)
    assert len(stored) == len(ohlcv)
    got = _returns(stored, "close").to_numpy()
    # Total returns written out from the file's own columns: (P_t + D_t) k_t / P_{t-1} - 1.
    p, k, d = ohlcv["close"], ohlcv["split_coefficient"], ohlcv["dividend_amount"]
    prev = ohlcv.groupby("symbol")["close"].shift(1)
    expected = ((p + d) * k / prev - 1.0).to_numpy()
    ok = np.isfinite(expected)
    assert ok.sum() > 15000
    np.testing.assert_allclose(got[ok], expected[ok], rtol=0, atol=1e-12)
    # The same as the file's own adjusted closes, up to the vendor's rounding.
    adjusted = _returns(ohlcv, "adjusted_close").to_numpy()
    diff = np.abs(got[ok] - adjusted[ok])
    assert np.quantile(diff, 0.999) < 1e-6 and diff.max() < 1e-4
    # The AAPL 7:1 split day is a normal day, not -85%.
    aapl = (stored["symbol"] == "AAPL") & (stored["date"] == "2014-06-09")
    assert abs(got[aapl.to_numpy()][0]) < 0.03
    # close_raw keeps the traded price.
    np.testing.assert_array_equal(stored["close_raw"].to_numpy(), ohlcv["close"].to_numpy())


def test_prices_raw_uses_the_factors_even_when_adjusted_closes_are_given(ohlcv, tmp_path) -> None:
    path = tmp_path / "full.csv"
    ohlcv.to_csv(path, index=False)
    raw_home, adj_home = tmp_path / "raw", tmp_path / "adj"
    ingest([path], None, home=raw_home, prices_basis="raw")
    ingest([path], None, home=adj_home)  # auto: the file's adjusted closes
    raw, adj = _stored(raw_home), _stored(adj_home)
    np.testing.assert_array_equal(adj["close"].to_numpy(), ohlcv["adjusted_close"].to_numpy())
    assert not np.array_equal(raw["close"].to_numpy(), adj["close"].to_numpy())
    d = np.abs(_returns(raw, "close") - _returns(adj, "close")).dropna()
    assert np.quantile(d, 0.999) < 1e-6


def test_corporate_actions_file_adjusts_raw_closes(ohlcv, tmp_path) -> None:
    prices = tmp_path / "raw.csv"
    ohlcv[["date", "symbol", "close"]].to_csv(prices, index=False)
    events = ohlcv[(ohlcv["split_coefficient"] != 1) | (ohlcv["dividend_amount"] > 0)]
    actions = tmp_path / "actions.csv"
    pd.DataFrame(
        {
            "Ticker": events["symbol"],
            "Ex-Date": events["date"],
            # Splits written as ratios, as a user's file would: 7:1, 3:2 ...
            "Split": [
                "" if k == 1 else f"{round(k * 2)}:2" if round(k * 2) % 2 else f"{round(k)}:1"
                for k in events["split_coefficient"]
            ],
            "Dividend": events["dividend_amount"],
        }
    ).to_csv(actions, index=False)
    home = tmp_path / "home"
    report = ingest([prices], None, home=home, actions=actions)
    applied = [i for i in report.issues if i["code"] == "ACTIONS_APPLIED"]
    assert applied and applied[0]["count"] == len(SYMBOLS)
    assert not [i for i in report.issues if i["code"] == "SPLIT_SUSPECTED"]
    got = _returns(_stored(home), "close").to_numpy()
    k = ohlcv["split_coefficient"].map(lambda v: round(v * 2) / 2)  # the ratios as written
    prev = ohlcv.groupby("symbol")["close"].shift(1)
    expected = ((ohlcv["close"] + ohlcv["dividend_amount"]) * k / prev - 1.0).to_numpy()
    ok = np.isfinite(expected)
    np.testing.assert_allclose(got[ok], expected[ok], rtol=0, atol=1e-12)


def test_split_ratio_spellings() -> None:
    assert parse_split_ratio("7:1") == 7.0
    assert parse_split_ratio("3:2") == 1.5
    assert parse_split_ratio("1-for-10") == pytest.approx(0.1)
    assert parse_split_ratio("4 for 1") == 4.0
    assert parse_split_ratio("") == 1.0
    assert parse_split_ratio("2.0") == 2.0
    with pytest.raises(ValueError, match="not a number"):
        parse_split_ratio("seven")


def _events(frame: pd.DataFrame, close: str) -> pd.DataFrame:
    rows = frame.assign(date=pd.to_datetime(frame["date"]), close=frame[close])
    return detect_events(PriceRows.of(rows.drop(columns="adjusted_close")))


def test_raw_closes_without_factors_find_the_real_splits(ohlcv) -> None:
    found = _events(ohlcv, "close")
    found = found[found["action"] == "drop"]
    got = set(zip(found["symbol"], found["date"], found["kind"], found["ratio"], strict=True))
    # Every split of these stocks, AOS's 3:2 of 2010 too (a fractional ratio needs a match
    # within 0.005), and nothing else.
    assert got == {
        ("AAPL", "2014-06-09", "split", 7.0),
        ("AAPL", "2020-08-31", "split", 4.0),
        ("AOS", "2010-11-16", "split", 1.5),
        ("AOS", "2013-05-16", "split", 2.0),
        ("AOS", "2016-10-06", "split", 2.0),
        ("AFL", "2018-03-19", "split", 2.0),
    }
    # None on the adjusted closes of the same stocks: real moves are never taken for splits.
    kept = _events(ohlcv, "adjusted_close")
    assert (kept["action"] == "keep").all()


def test_unadjusted_seven_for_one_split_is_kept_out_of_the_model(tmp_path) -> None:
    wide = pd.read_csv(shared_file("small_adjclose_2019_2026.csv.gz"))
    universe = pd.read_csv(shared_file("small_universe.csv"))
    long = wide.melt(id_vars="date", var_name="symbol", value_name="close").dropna()
    split_day = "2023-03-15"
    # A 7:1 split that nobody adjusted: NVDA's closes from split_day on divided by 7.
    hit = (long["symbol"] == "NVDA") & (long["date"] >= split_day)
    raw = long.assign(close=np.where(hit, long["close"] / 7.0, long["close"]))
    prices, master = tmp_path / "prices.csv", tmp_path / "master.csv"
    raw.to_csv(prices, index=False)
    universe.to_csv(master, index=False)

    home = tmp_path / "home"
    report = ingest([prices], master, home=home)
    splits = [i for i in report.issues if i["code"] == "SPLIT_SUSPECTED"]
    assert splits and splits[0]["count"] == 1
    assert splits[0]["examples"][0]["symbol"] == "NVDA"
    assert splits[0]["examples"][0]["date"] == split_day
    assert splits[0]["examples"][0]["ratio"] == 7.0
    table = pd.read_csv(Path(report.report_dir) / "return_decisions.csv")
    dropped = table[table["action"] == "drop"]
    assert dropped[["symbol", "date", "kind"]].values.tolist() == [["NVDA", split_day, "split"]]
    manifest = build_snapshot(home, ModelParams())
    assert manifest["model"]["returns_excluded"] == 1
    snap = Snapshot.open(snapshots_dir(home) / manifest["model_version"])
    sessions = snap.sessions.astype("datetime64[D]").astype(str)
    row = snap.row_of["NVDA"]
    t_split = int(np.flatnonzero(sessions == split_day)[0])
    assert np.isnan(snap.array("return")[row, t_split])

    # Independent: the regression of the true (unsplit) NVDA returns on SPY, XLK and SMH, the
    # split day left out, over the same window.
    true = wide.set_index("date")
    r = true[["NVDA", "SPY", "XLK", "SMH"]].pct_change()
    r.loc[split_day, "NVDA"] = np.nan
    r = r.reindex(sessions)
    for t in (t_split, t_split + 100, t_split + 251):
        window = r.iloc[t - 251 : t + 1].dropna()
        fit = sm.OLS(window["NVDA"], sm.add_constant(window[["SPY", "XLK", "SMH"]])).fit()
        got = [snap.array(k)[row, t] for k in ("l3_mkt_hr", "l3_sec_hr", "l3_sub_hr")]
        np.testing.assert_allclose(got, fit.params.to_numpy()[1:], rtol=0, atol=1e-8)

    # With --keep-split-moves the move stays (reported), and the hedge ratios are poisoned.
    kept_home = tmp_path / "kept"
    kept = ingest([prices], master, home=kept_home, keep_split_moves=True)
    assert [i["count"] for i in kept.issues if i["code"] == "SPLIT_SUSPECTED"] == [1]
    kept_manifest = build_snapshot(kept_home, ModelParams())
    kept_snap = Snapshot.open(snapshots_dir(kept_home) / kept_manifest["model_version"])
    assert kept_snap.array("return")[row, t_split] == pytest.approx(-6 / 7, abs=0.05)
    poisoned = kept_snap.array("l3_mkt_hr")[row, t_split + 100]
    clean = snap.array("l3_mkt_hr")[row, t_split + 100]
    assert abs(poisoned - clean) > 0.5

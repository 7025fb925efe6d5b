"""The daily merge: the data set's basis kept, history not re-judged, coverage per new session,
nothing new, the data set's name (eqrisk.data.daily through `ingest(merge=True)`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from eqrisk.data import ingested as store
from eqrisk.data import panel
from eqrisk.data.calendar import sessions_between
from eqrisk.data.daily import BasisConflict
from eqrisk.data.ingest import ingest
from eqrisk.data.ingest_report import IngestRefused
from helpers import SHARED_DATA

SYMBOLS = [f"S{k:02d}" for k in range(12)]


def _prices(sessions: int = 80, seed: int = 7) -> pd.DataFrame:
    """Long closes of 12 stocks: random walks of 1% daily vol (one sector)."""
    rng = np.random.default_rng(seed)
    days = sessions_between(pd.Timestamp("2021-01-04"), pd.Timestamp("2021-12-31"))[:sessions]
    steps = rng.normal(0, 0.01, (len(SYMBOLS), len(days)))
    closes = 50 * np.exp(np.cumsum(steps, axis=1))
    return pd.DataFrame(
        {
            "date": np.tile(days.strftime("%Y-%m-%d"), len(SYMBOLS)),
            "symbol": np.repeat(SYMBOLS, len(days)),
            "close": closes.ravel(),
        }
    )


def _master(path: Path) -> Path:
    rows = [f"{s},{s} Inc,stock,Energy,Oil & Gas Exploration & Production" for s in SYMBOLS]
    path.write_text("symbol,name,asset_type,gics_sector,gics_sub_industry\n" + "\n".join(rows))
    return path


def _write(frame: pd.DataFrame, path: Path) -> Path:
    frame.to_csv(path, index=False)
    return path


def _meta(home: Path) -> dict:
    return json.loads((store.ingested_dir(home) / "meta.json").read_text())


def _returns(home: Path) -> pd.Series:
    """The stored close-to-close returns with the data set's left-out returns nulled."""
    prices, _, meta = store.read_ingested(home)
    prices = prices.sort_values(["symbol", "date"])
    r = prices.groupby("symbol")["close"].pct_change()
    index = pd.MultiIndex.from_arrays([prices["symbol"], prices["date"].astype(str)])
    out = pd.Series(r.to_numpy(), index=index)
    for sym, day in meta["return_breaks"]:
        out[(sym, day)] = np.nan
    return out


def _files(home: Path) -> dict[str, bytes]:
    folder = store.ingested_dir(home)
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_merge_keeps_the_recorded_basis_and_refuses_another(tmp_path: Path) -> None:
    home = tmp_path / "home"
    frame = _prices()
    days = sorted(frame["date"].unique())
    first = _write(frame[frame["date"] <= days[59]], tmp_path / "first.csv")
    later = _write(frame[frame["date"] == days[60]], tmp_path / "later.csv")
    ingest([first], _master(tmp_path / "m.csv"), home=home, prices_basis="adjusted", max_move=0.3)
    recorded = _meta(home)["basis"]
    assert recorded == {"prices_basis": "adjusted", "max_move": 0.3, "date_format": None,
                        "keep_split_moves": False, "columns": {}}  # fmt: skip
    before = _files(home)

    with pytest.raises(BasisConflict) as refused:
        ingest([later], None, home=home, merge=True, prices_basis="raw")
    message = str(refused.value)
    assert "ingested with --prices adjusted" in message and "gives --prices raw" in message
    assert "eqrisk ingest FILES --prices raw --max-move 0.3 --replace" in message
    with pytest.raises(BasisConflict, match=r"--max-move 0\.3; this merge gives --max-move 0\.5"):
        ingest([later], None, home=home, merge=True, max_move=0.5)
    assert _files(home) == before

    # Not stating them, or stating the recorded ones, merges on the recorded basis.
    report = ingest([later], None, home=home, merge=True, prices_basis="adjusted")
    assert report.ok and report.sessions == 61
    meta = _meta(home)
    assert meta["basis"] == recorded and meta["prices_basis"] == "adjusted"
    assert meta["max_move"] == 0.3
    assert meta["data_source"] == "first" and meta["merged_files"] == [str(later)]


def test_a_merge_judges_only_the_new_rows_unless_asked(tmp_path: Path) -> None:
    """S03 halves on the last session of the first ingest (a split-shaped fall whose level is
    not seen yet: left out) and climbs back over the next four sessions (+15% x3, +31%: no
    split ratio). The merge keeps the stored verdict; --rejudge sees the level come back and
    keeps the fall. A split-shaped fall of S05 in the new rows is judged and left out."""
    home = tmp_path / "home"
    frame = _prices(sessions=90)
    days = sorted(frame["date"].unique())
    for k, scale in enumerate([0.5, 0.5 * 1.15, 0.5 * 1.15**2, 0.5 * 1.15**3]):
        at = (frame["symbol"] == "S03") & (frame["date"] == days[69 + k])
        frame.loc[at, "close"] *= scale
    fall = (frame["symbol"] == "S05") & (frame["date"] >= days[80])
    frame.loc[fall, "close"] *= 0.5
    first = _write(frame[frame["date"] <= days[69]], tmp_path / "first.csv")
    later = _write(frame[frame["date"] > days[69]], tmp_path / "later.csv")
    master = _master(tmp_path / "m.csv")
    ingest([first], master, home=home)
    assert _meta(home)["return_breaks"] == [["S03", days[69]]]
    before = _returns(home)

    ingest([later], None, home=home, merge=True)
    assert _meta(home)["return_breaks"] == [["S03", days[69]], ["S05", days[80]]]
    after = _returns(home)
    pd.testing.assert_series_equal(after.reindex(before.index), before)  # history unchanged
    # The climb into days[70] is a new return, judged and kept (a move).
    expected = frame.set_index(["symbol", "date"])["close"]
    assert after[("S03", days[70])] == pytest.approx(
        expected[("S03", days[70])] / expected[("S03", days[69])] - 1, rel=1e-12
    )

    again = tmp_path / "again"
    ingest([first], master, home=again)
    ingest([later], None, home=again, merge=True, rejudge=True)
    assert _meta(again)["return_breaks"] == [["S05", days[80]]]  # the fall that came back: kept


def test_coverage_per_new_session_refusal_and_partial(tmp_path: Path) -> None:
    home = tmp_path / "home"
    frame = _prices()
    days = sorted(frame["date"].unique())
    first = _write(frame[frame["date"] <= days[59]], tmp_path / "first.csv")
    ingest([first], _master(tmp_path / "m.csv"), home=home)
    full_day = frame["date"] == days[60]
    thin_day = (frame["date"] == days[61]) & frame["symbol"].isin(SYMBOLS[:5])
    daily = _write(frame[full_day | thin_day], tmp_path / "daily.csv")

    with pytest.raises(IngestRefused, match=rf"session {days[61]} has prices for 5 of the 12"):
        ingest([daily], None, home=home, merge=True, min_coverage=0.5)
    assert store.ingested_counts(home) == (12, 60)
    report = json.loads(
        max(
            (home / "reports").glob("ingest-*/report.json"), key=lambda p: p.stat().st_mtime
        ).read_text()
    )
    assert report["coverage"] == [
        {"date": days[60], "symbols": 12, "previous": 12, "share": 1.0},
        {"date": days[61], "symbols": 5, "previous": 12, "share": round(5 / 12, 4)},
    ]
    # 5/12 = 42% passes a lower setting, or --partial.
    ok = ingest([daily], None, home=home, merge=True, min_coverage=0.4)
    assert [c["symbols"] for c in ok.coverage] == [12, 5]
    assert store.ingested_counts(home) == (12, 62)


def test_a_merge_that_changes_nothing_writes_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    frame = _prices()
    days = sorted(frame["date"].unique())
    first = _write(frame, tmp_path / "first.csv")
    master = _master(tmp_path / "m.csv")
    ingest([first], master, home=home)
    stored = (store.ingested_dir(home) / "meta.json").read_text()
    last = _write(frame[frame["date"] == days[-1]], tmp_path / "last.csv")
    report = ingest([last], master, home=home, merge=True)
    assert report.nothing_new and report.coverage == [] and report.rows_flagged == 0
    assert (store.ingested_dir(home) / "meta.json").read_text() == stored
    # One changed close is something new.
    changed = frame[frame["date"] == days[-1]].copy()
    changed.loc[changed.index[0], "close"] *= 1.001
    report = ingest([_write(changed, tmp_path / "rev.csv")], None, home=home, merge=True)
    assert not report.nothing_new
    assert _meta(home)["merged_files"] == [str(tmp_path / "rev.csv")]


@pytest.mark.skipif(not (SHARED_DATA / "adjclose_wide_2010_2026.csv.gz").exists(),
                    reason="needs ../shared/data")  # fmt: skip
def test_real_data_merge_keeps_oxy_and_every_first_ingest_return(tmp_path: Path) -> None:
    """Adjusted closes of the real file (energy names, SPY, XLE, 2018-2020): ingested through
    2020-02-28 with --prices adjusted, then merged with March 2020. OXY's -52% on 2020-03-09
    stays a return and no return of the first ingest changes."""
    wide = pd.read_csv(SHARED_DATA / "adjclose_wide_2010_2026.csv.gz")
    gics = pd.read_csv(SHARED_DATA / "gics_constituents.csv")
    energy = gics.loc[gics["GICS Sector"] == "Energy", "Symbol"].tolist()
    cols = ["date", "SPY", "XLE", *[s for s in energy if s in wide.columns]]
    wide = wide.loc[wide["date"].between("2018-01-02", "2020-03-31"), cols]
    first = _write(wide[wide["date"] < "2020-03-02"], tmp_path / "first.csv")
    later = _write(wide[wide["date"] >= "2020-03-02"], tmp_path / "later.csv")
    home = tmp_path / "home"
    ingest([first], SHARED_DATA / "gics_constituents.csv", home=home, prices_basis="adjusted")
    before = _returns(home)
    report = ingest([later], None, home=home, merge=True)
    assert report.ok and len(report.coverage) == 22
    after = _returns(home)
    pd.testing.assert_series_equal(after.reindex(before.index), before)
    oxy = wide.set_index("date")["OXY"]
    assert after[("OXY", "2020-03-09")] == pytest.approx(
        oxy["2020-03-09"] / oxy["2020-03-06"] - 1, rel=1e-12
    )
    assert after[("OXY", "2020-03-09")] < -0.5
    assert ["OXY", "2020-03-09"] not in _meta(home)["return_breaks"]


def test_a_master_given_again_keeps_its_share_counts(tmp_path: Path) -> None:
    """A master with market caps and no share counts: the caps become shares at the price of
    the ingest that first read the file; the same file on later merges gives the same shares
    (so the master, and the caps' history, do not change), and a merge of known rows with it
    changes nothing."""
    home = tmp_path / "home"
    frame = _prices()
    days = sorted(frame["date"].unique())
    master = tmp_path / "m.csv"
    rows = [f"{s},{s} Inc,stock,Energy,,{1e9 * (k + 1):.0f}" for k, s in enumerate(SYMBOLS)]
    master.write_text("symbol,name,asset_type,gics_sector,gics_sub_industry,market_cap\n"
                      + "\n".join(rows))  # fmt: skip
    first = _write(frame[frame["date"] <= days[59]], tmp_path / "first.csv")
    ingest([first], master, home=home)
    close = frame.set_index(["symbol", "date"])["close"]
    expected = {s: 1e9 * (k + 1) / close[(s, days[59])] for k, s in enumerate(SYMBOLS)}
    shares = store.read_ingested(home)[1].set_index("symbol")["shares"]
    assert shares.to_dict() == pytest.approx(expected, rel=1e-12)

    later = _write(frame[frame["date"] == days[60]], tmp_path / "later.csv")
    assert not ingest([later], master, home=home, merge=True).nothing_new
    shares = store.read_ingested(home)[1].set_index("symbol")["shares"]
    assert shares.to_dict() == pytest.approx(expected, rel=1e-12)  # not re-derived on days[60]
    assert ingest([later], master, home=home, merge=True).nothing_new


def test_share_classes_count_one_company_cap(tmp_path: Path) -> None:
    """GOOG and GOOGL each given Alphabet's cap (shares = company cap / own price, as the S&P
    financials file gives them): with the project's map the two carry the company's cap once,
    in the panel and in the group portfolio's cap weights; without a map, twice."""
    from eqrisk.data.share_classes import read_share_classes
    from eqrisk.model.returns import group_portfolio

    rng = np.random.default_rng(5)
    days = sessions_between(pd.Timestamp("2023-01-03"), pd.Timestamp("2023-02-28"))
    base = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, len(days))))
    close = {
        "GOOGL": base,
        "GOOG": base * 1.004,
        "XOM": 80 * np.exp(np.cumsum(rng.normal(0, 0.01, len(days)))),
    }
    long = pd.concat(
        [pd.DataFrame({"date": days, "symbol": s, "close": c}) for s, c in close.items()]
    )
    company = 1.5e12
    master = pd.DataFrame({"symbol": ["GOOGL", "GOOG", "XOM"],
                           "shares": [company / base[-1], company / (base[-1] * 1.004), 4e9]})  # fmt: skip
    classes = read_share_classes()
    assert classes["GOOG"] == classes["GOOGL"] == "Alphabet"
    assert classes["BRK.A"] == classes["BRK.B"] and classes["FOX"] == classes["FOXA"]
    assert classes["NWS"] == classes["NWSA"]
    once = panel.to_panel(long, master)  # the project's map
    twice = panel.to_panel(long, master, {})
    at = once.index_of()
    cap_l = master["shares"][0] * close["GOOGL"]
    cap_c = master["shares"][1] * close["GOOG"]
    np.testing.assert_allclose(twice.market_cap[at["GOOGL"]], cap_l, rtol=1e-14)
    alphabet = once.market_cap[at["GOOGL"]] + once.market_cap[at["GOOG"]]
    np.testing.assert_allclose(alphabet, (cap_l + cap_c) / 2, rtol=1e-14)
    np.testing.assert_allclose(alphabet[-1], company, rtol=1e-14)
    np.testing.assert_array_equal(once.market_cap[at["XOM"]], 4e9 * close["XOM"])

    returns = np.diff(np.log(once.close), axis=1, prepend=np.nan)
    members = np.arange(3)
    weights = group_portfolio(returns, members, once.market_cap).weights
    w = weights[:, 1:]
    share = (w[at["GOOGL"]] + w[at["GOOG"]]) / w.sum(axis=0)
    cap_xom = 4e9 * close["XOM"]
    expected = (cap_l + cap_c) / 2 / ((cap_l + cap_c) / 2 + cap_xom)
    np.testing.assert_allclose(share, expected[:-1], rtol=1e-12)  # previous session's caps

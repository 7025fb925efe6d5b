"""Older GICS names keep their levels; groups are per ETF; every stock that lacks a level is in
the ingest report with why."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import numpy as np
import pandas as pd

from eqrisk.data.ingest import ingest
from eqrisk.data.ingest_report import IngestReport
from eqrisk.data.master import Mappings, classify, current_gics
from eqrisk.data.master_files import read_master
from eqrisk.data.panel import Panel
from eqrisk.model.layout import factor_layout
from eqrisk.model.returns import group_portfolio

# A 2017-style master: names GICS has retired since.
OLD_MASTER = """symbol,name,gics_sector,gics_sub_industry
GOOGL,Alphabet,Information Technology,Internet Software & Services
T,AT&T,Telecommunication Services,Integrated Telecommunication Services
VZ,Verizon,Telecommunication Services,Diversified Telecommunication Services
AMAT,Applied Materials,Information Technology,Semiconductor Equipment
AMZN,Amazon,Consumer Discretionary,Internet & Direct Marketing Retail
DAL,Delta,Industrials,Airlines
UNP,Union Pacific,Industrials,Railroads
XOM,Exxon,Energy,Integrated Oil & Gas
ODD,Odd Co,Widgets,Widget Makers
"""

# What each becomes: (sector, sub-industry, sector ETF, subsector ETF), from the GICS change
# notices (2018: Communication Services; 2023: sub-industry changes) and the project's tables.
EXPECTED = {
    "GOOGL": ("Information Technology", "Internet Services & Infrastructure", "XLK", "FDN"),
    "T": ("Communication Services", "Integrated Telecommunication Services", "XLC", None),
    "VZ": ("Communication Services", "Integrated Telecommunication Services", "XLC", None),
    "AMAT": ("Information Technology", "Semiconductor Materials & Equipment", "XLK", "SMH"),
    "AMZN": ("Consumer Discretionary", "Broadline Retail", "XLY", "XRT"),
    "DAL": ("Industrials", "Passenger Airlines", "XLI", "JETS"),
    "UNP": ("Industrials", "Rail Transportation", "XLI", "IYT"),
    "XOM": ("Energy", "Integrated Oil & Gas", "XLE", None),
    "ODD": ("Widgets", "Widget Makers", None, None),
}


def _issue(report: IngestReport, code: str) -> dict:
    found = [i for i in report.issues if i["code"] == code]
    assert len(found) == 1, [i["code"] for i in report.issues]
    return found[0]


def test_retired_names_are_read_as_their_current_names(tmp_path: Path) -> None:
    path = tmp_path / "master_2017.csv"
    path.write_text(OLD_MASTER)
    master = read_master(path)
    info = classify(master, Mappings.load())
    got = {
        r["symbol"]: (r["gics_sector"], r["gics_sub_industry"], r["sector_etf"], r["subsector_etf"])
        for r in info.to_dict("records")
    }
    assert got == EXPECTED
    # classify also renames a master stored before the table existed.
    raw = pd.read_csv(path, dtype=str).assign(asset_type="stock", shares=np.nan)
    again = classify(raw, Mappings.load()).set_index("symbol")
    assert again.loc["VZ", "sector_etf"] == "XLC" and again.loc["AMAT", "subsector_etf"] == "SMH"
    assert current_gics("sub_industry", "semiconductor equipment") == (
        "Semiconductor Materials & Equipment"
    )
    assert current_gics("sub_industry", "Semiconductors") == "Semiconductors"


def _prices(symbols: list[str], days: int = 30) -> str:
    sessions = pd.bdate_range("2019-02-04", periods=days)
    sessions = sessions[sessions != pd.Timestamp("2019-02-18")]  # Presidents' Day
    rng = np.random.default_rng(7)
    lines = ["date,symbol,close"]
    for s in symbols:
        close = 100 * np.cumprod(1 + 0.01 * rng.standard_normal(len(sessions)))
        lines += [f"{d:%Y-%m-%d},{s},{c:.4f}" for d, c in zip(sessions, close, strict=True)]
    return "\n".join(lines) + "\n"


def test_the_report_lists_every_stock_that_lacks_a_level_with_why(tmp_path: Path) -> None:
    master = tmp_path / "master_2017.csv"
    master.write_text(OLD_MASTER)
    prices = tmp_path / "prices.csv"
    symbols = [*EXPECTED, "NEW", "SPY", "XLK", "XLC", "XLY", "XLI", "XLE", "SMH", "FDN"]
    prices.write_text(_prices(symbols))
    report = ingest([prices], master, home=tmp_path / "home")
    renamed = _issue(report, "GICS_RENAMED")
    assert renamed["count"] == 7  # GOOGL, T (sector), VZ (both), AMAT, AMZN, DAL, UNP
    assert {
        "symbol": "VZ",
        "was": "Telecommunication Services",
        "now": "Communication Services",
    } in (renamed["examples"])
    levels = pd.read_csv(Path(report.report_dir) / "levels.csv", dtype=str, keep_default_na=False)
    got = dict(zip(levels["symbol"], zip(levels["level"], levels["why"], strict=True), strict=True))
    assert got == {
        "NEW": ("L2+L3", "no row in the security master"),
        "ODD": (
            "L2+L3",
            "sector 'Widgets' is no GICS sector (no ETF; see gics_renames.csv) and no other stock "
            "has it (no group)",
        ),
        "T": ("L3", "sub-industry 'Integrated Telecommunication Services' maps to no subsector "
              "ETF (subindustry_etfs.csv)"),
        "VZ": ("L3", "sub-industry 'Integrated Telecommunication Services' maps to no subsector "
               "ETF (subindustry_etfs.csv)"),
        "XOM": ("L3", "sub-industry 'Integrated Oil & Gas' maps to no subsector ETF "
                "(subindustry_etfs.csv)"),
        "AMZN": ("L3", "subsector ETF XRT not in the prices and only 1 stock(s) map to it (a "
                 "group needs 3)"),
        "DAL": ("L3", "subsector ETF JETS not in the prices and only 1 stock(s) map to it (a "
                "group needs 3)"),
        "UNP": ("L3", "subsector ETF IYT not in the prices and only 1 stock(s) map to it (a "
                "group needs 3)"),
    }  # fmt: skip
    assert _issue(report, "LEVEL_MISSING")["count"] == 7  # NEW: MISSING_FROM_MASTER
    # GOOGL (FDN) and AMAT (SMH) keep all three levels: absent from the list.


def _panel(symbols: list[str], n_t: int = 40) -> tuple[Panel, np.ndarray]:
    rng = np.random.default_rng(11)
    r = 0.01 * rng.standard_normal((len(symbols), n_t))
    close = 100 * np.cumprod(1 + r, axis=1)
    nan = np.full(close.shape, np.nan)
    panel = Panel(
        symbols=np.array(symbols, dtype=object),
        sessions=np.datetime64("2019-01-02", "D") + np.arange(n_t),
        close=close,
        open=nan,
        high=nan,
        low=nan,
        close_raw=nan,
        volume=nan,
        market_cap=nan.copy(),
    )
    return panel, r


def test_two_names_that_map_to_one_etf_share_one_group() -> None:
    # SMH is not in the data: its three stocks (two sub-industry names) form one group.
    master = pd.DataFrame(
        {
            "symbol": ["SPY", "XLK", "NVDA", "AMD", "AMAT"],
            "name": None,
            "asset_type": ["etf", "etf", "stock", "stock", "stock"],
            "gics_sector": [None, None, *["Information Technology"] * 3],
            "gics_sub_industry": [None, None, "Semiconductors", "Semiconductors",
                                  "Semiconductor Equipment"],
            "shares": np.nan,
        }
    )  # fmt: skip
    info = classify(master, Mappings.load())
    panel, r = _panel(list(info["symbol"]))
    layout = factor_layout(panel, info, r)
    row = panel.index_of()
    stocks = [row[s] for s in ("AMAT", "AMD", "NVDA")]
    keys = [layout.keys[j] for j in layout.fidx[stocks, 2]]
    assert keys == ["group:subsector:SMH"] * 3  # one group, named by its ETF (two names)
    group = layout.factors[layout.keys.index("group:subsector:SMH")]
    expected = group_portfolio(r, np.array(sorted(stocks)), None).full()
    np.testing.assert_allclose(group, expected, rtol=0, atol=1e-15)
    # Equal weights, no caps: the mean of the three members' (winsorised) returns.
    assert np.isfinite(group).all()
    # The sector level is the XLK ETF itself.
    assert [layout.keys[j] for j in layout.fidx[stocks, 1]] == ["XLK"] * 3


def test_the_kept_classification_follows_the_master_and_the_mappings() -> None:
    """`classify` keeps its last answer (the daily job's ingest and build ask for the same one):
    another master, other mappings or another market ETF are classified anew, and a caller's
    change to an answer does not reach the next one."""
    master = pd.read_csv(StringIO(OLD_MASTER), dtype=str)
    first = classify(master, Mappings.load())
    first.loc[0, "sector_etf"] = "CHANGED"
    again = classify(master, Mappings.load())
    assert again.loc[0, "sector_etf"] != "CHANGED"
    assert again.set_index("symbol").loc["GOOGL", "sector_etf"] == "XLK"
    other = Mappings(
        sector_etf={**Mappings.load().sector_etf, "Information Technology": "VGT"},
        subsector_etf=Mappings.load().subsector_etf,
    )
    assert classify(master, other).set_index("symbol").loc["GOOGL", "sector_etf"] == "VGT"
    renamed = master.assign(gics_sector=master["gics_sector"].replace("Energy", "Utilities"))
    assert classify(renamed, Mappings.load()).set_index("symbol").loc["XOM", "sector_etf"] == "XLU"
    by_qqq = classify(master, Mappings.load(), market_etf="QQQ")
    assert set(by_qqq["market_etf"]) == {"QQQ"}
    assert set(classify(master, Mappings.load())["market_etf"]) == {"SPY"}

"""Price feeds: `eqrisk fetch` and `eqrisk update --from` against a local server that answers as
Yahoo and Tiingo document (tests/feeds/fixture_server.py), run as a user runs them (real
processes). A split day, a dividend day, an unknown symbol, rate limits and a wrong key; the
version `update --from` builds equals the one `update` builds from the equivalent CSV, array
for array, and its returns are the total returns computed here from the raw prices."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from eqrisk.data.ingested import read_ingested
from eqrisk.data.providers.feed import FEED_COLUMNS
from eqrisk.snapshot.versions import Snapshot, current_version, snapshots_dir
from helpers import nan_equal, without_progress

from .fixture_server import ALWAYS_LIMITED, TIINGO_KEY, FixtureServer, Market

SYMBOLS = ["SPY", "XLK", "SMH", "NVDA", "AAPL", "MSFT"]
NEW_DAYS = [date(2026, 11, d) for d in (2, 3, 4, 5, 6)]
SPLIT = ("NVDA", date(2026, 11, 4), 2.0)  # 2-for-1
DIVIDEND = ("AAPL", date(2026, 11, 5), 0.26)


@pytest.fixture(scope="module")
def stored(demo_home: Path) -> pd.DataFrame:
    """The demo data set's last session (2026-10-30): raw and adjusted closes per symbol."""
    prices, _, _ = read_ingested(demo_home)
    last = prices.loc[prices["date"] == prices["date"].max()].set_index("symbol")
    assert str(prices["date"].max()) == "2026-10-30"
    return last.loc[SYMBOLS]


@pytest.fixture(scope="module")
def market(stored: pd.DataFrame) -> Market:
    """Five new sessions from the stored raw closes, with a split and a dividend."""
    rng = np.random.default_rng(26)
    days = [date(2026, 10, 30), *NEW_DAYS]
    close, volume = {}, {}
    for symbol in SYMBOLS:
        prices = [float(stored.loc[symbol, "close_raw"])]
        for day in NEW_DAYS:
            move = prices[-1] * (1 + rng.normal(0, 0.015))
            if (symbol, day) == SPLIT[:2]:
                move /= SPLIT[2]
            if (symbol, day) == DIVIDEND[:2]:
                move -= DIVIDEND[2]
            prices.append(round(move, 4))
        close[symbol] = prices
        volume[symbol] = [float(rng.integers(1_000_000, 9_000_000)) for _ in days]
    return Market(
        days=days,
        close=close,
        volume=volume,
        split={SPLIT[0]: {SPLIT[1]: SPLIT[2]}},
        dividend={DIVIDEND[0]: {DIVIDEND[1]: DIVIDEND[2]}},
    )


@pytest.fixture(scope="module")
def fixture_server(market: Market) -> Iterator[FixtureServer]:
    with FixtureServer(market).running() as server:
        yield server


def total_returns(market: Market, symbol: str) -> list[float]:
    """(P_t + D_t) k_t / P_{t-1} - 1 of each new session, from the truth."""
    rows = market.rows(symbol)
    return [
        (now["close"] + now["dividend"]) * now["split"] / before["close"] - 1
        for before, now in itertools.pairwise(rows)
    ]


def equivalent_csv(market: Market, stored: pd.DataFrame, path: Path) -> Path:
    """What a careful user would write for the same sessions: raw closes, factors, volume, and
    adjusted closes continuing the stored ones by the total returns."""
    records = []
    for symbol in SYMBOLS:
        adjusted = float(stored.loc[symbol, "close"])
        rows = market.rows(symbol)
        for row, r in zip(rows[1:], total_returns(market, symbol), strict=True):
            adjusted = adjusted * (1 + r)
            records.append(
                {
                    "date": row["day"].isoformat(),
                    "symbol": symbol,
                    "open": row["close"] * 0.99,  # the providers' fixture bars
                    "high": row["close"] * 1.01,
                    "low": row["close"] * 0.98,
                    "close": row["close"],
                    "volume": row["volume"],
                    "split_coefficient": row["split"],
                    "dividend_amount": row["dividend"],
                    "adjusted_close": adjusted,
                }
            )
    pd.DataFrame(records).to_csv(path, index=False)
    return path


def eqrisk(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "eqrisk.cli", *args],
        env={**os.environ, "EQRISK_HOME": str(home), **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


def feed_env(server: FixtureServer, key: str = TIINGO_KEY) -> dict[str, str]:
    urls = {"yahoo": server.base, "tiingo": server.base}
    return {"EQRISK_PROVIDER_URLS": json.dumps(urls), "EQRISK_TIINGO_API_KEY": key}


def home_like(demo_home: Path, target: Path) -> Path:
    """A copy of the demo home: the ingested set copied, the versions hard-linked (a build
    writes a new version folder and renames pointers: the links are never written)."""
    target.mkdir()
    shutil.copytree(demo_home / "ingested", target / "ingested")
    shutil.copytree(demo_home / "snapshots", target / "snapshots", copy_function=os.link)
    return target


def arrays_of(home: Path) -> tuple[Snapshot, dict[str, np.ndarray]]:
    snap = Snapshot.open(snapshots_dir(home) / str(current_version(home)))
    fields = sorted(snap._arrays)
    return snap, {f: np.asarray(snap.array(f)[:, :]) for f in fields}


@pytest.fixture(scope="module")
def from_csv(
    demo_home: Path, market: Market, stored: pd.DataFrame, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The reference: `eqrisk update` of the equivalent CSV."""
    home = home_like(demo_home, tmp_path_factory.mktemp("feeds") / "csv-home")
    csv = equivalent_csv(market, stored, home / "new_days.csv")
    proc = eqrisk(home, "update", str(csv), "--partial")  # 6 of the demo's symbols
    assert proc.returncode == 0, proc.stderr
    return home


@pytest.mark.parametrize("provider", ["yahoo", "tiingo"])
def test_update_from_a_provider_builds_the_version_of_the_equivalent_csv(
    provider: str,
    demo_home: Path,
    from_csv: Path,
    market: Market,
    fixture_server: FixtureServer,
    tmp_path: Path,
) -> None:
    home = home_like(demo_home, tmp_path / "home")
    proc = eqrisk(home, "update", "--from", provider, "--partial", **feed_env(fixture_server))
    assert proc.returncode == 0, proc.stderr
    # Every other symbol of the data set is unknown to the fixture: skipped, said in one line.
    assert "symbols " + provider + " does not know" in proc.stderr
    snap, arrays = arrays_of(home)
    ref_snap, ref_arrays = arrays_of(from_csv)
    assert list(snap.sessions) == list(ref_snap.sessions)
    assert str(snap.sessions[-1])[:10] == "2026-11-06"
    assert arrays.keys() == ref_arrays.keys() and len(arrays) > 10
    for name, values in arrays.items():
        assert nan_equal(values, ref_arrays[name]), name
    assert nan_equal(np.asarray(snap.factor_returns), np.asarray(ref_snap.factor_returns))
    pd.testing.assert_frame_equal(snap.symbols, ref_snap.symbols)
    # The model's returns of the new sessions are the total returns of the raw prices: no
    # false move on the split day, the dividend counted, none where the new rows meet the old.
    t = len(snap.sessions)
    for symbol in ("NVDA", "AAPL", "SPY"):
        got = arrays["return"][snap.row_of[symbol], t - len(NEW_DAYS) :]
        np.testing.assert_allclose(got, total_returns(market, symbol), rtol=1e-12)


def test_fetch_writes_the_ingest_layout_with_raw_prices_and_factors(
    demo_home: Path, market: Market, fixture_server: FixtureServer, tmp_path: Path
) -> None:
    out = tmp_path / "yahoo.csv"
    symbols = "NVDA,AAPL,MSFT,NOSUCH"
    fixture_server.limited.clear()  # MSFT's next answer is a 429 again
    proc = eqrisk(
        demo_home, "fetch", "--provider", "yahoo", "--since", "2026-11-02",
        "--until", "2026-11-06", "--symbols", symbols, "--out", str(out), "--json",
        **feed_env(fixture_server),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["unknown"] == ["NOSUCH"] and "NOSUCH" in proc.stderr
    assert summary["rate_limit_waits"] == 1  # MSFT's first answer was a 429
    assert (summary["rows"], summary["symbols"], summary["sessions"]) == (15, 3, 5)
    frame = pd.read_csv(out)
    assert tuple(frame.columns) == FEED_COLUMNS
    for symbol in ("NVDA", "AAPL", "MSFT"):
        mine = frame.loc[frame["symbol"] == symbol].reset_index(drop=True)
        truth = market.rows(symbol)[1:]
        assert list(mine["date"]) == [r["day"].isoformat() for r in truth]
        np.testing.assert_allclose(mine["close"], [r["close"] for r in truth], rtol=1e-12)
        np.testing.assert_allclose(mine["volume"], [r["volume"] for r in truth], rtol=1e-12)
        assert list(mine["split_coefficient"]) == [r["split"] for r in truth]
        np.testing.assert_allclose(mine["dividend_amount"], [r["dividend"] for r in truth])
    nvda = frame.loc[frame["symbol"] == "NVDA"].set_index("date")
    assert nvda.loc["2026-11-04", "split_coefficient"] == 2.0
    assert nvda.loc["2026-11-04", "close"] < 0.6 * nvda.loc["2026-11-03", "close"]
    aapl = frame.loc[frame["symbol"] == "AAPL"].set_index("date")
    assert aapl.loc["2026-11-05", "dividend_amount"] == pytest.approx(0.26)


def test_the_tiingo_key_is_a_header_and_reaches_no_log_or_file(
    demo_home: Path, fixture_server: FixtureServer, tmp_path: Path
) -> None:
    out = tmp_path / "tiingo.csv"
    before = len(fixture_server.requests)
    proc = eqrisk(
        demo_home, "fetch", "--provider", "tiingo", "--since", "2026-11-02",
        "--symbols", "NVDA,NOSUCH", "--out", str(out), **feed_env(fixture_server),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    sent = fixture_server.requests[before:]
    assert sent and all(r["headers"]["authorization"] == f"Token {TIINGO_KEY}" for r in sent)
    assert not any(TIINGO_KEY in r["path"] + r["query"] for r in sent)
    assert TIINGO_KEY not in proc.stdout + proc.stderr + out.read_text()
    shown = eqrisk(demo_home, "config", "--json", **feed_env(fixture_server))
    assert TIINGO_KEY not in shown.stdout and json.loads(shown.stdout)["tiingo_api_key"]

    wrong = eqrisk(
        demo_home, "fetch", "--provider", "tiingo", "--since", "2026-11-02",
        "--symbols", "NVDA", "--out", str(tmp_path / "no.csv"),
        **feed_env(fixture_server, key="wrong-key-0123"),
    )  # fmt: skip
    assert wrong.returncode == 3
    assert "EQRISK_TIINGO_API_KEY" in wrong.stderr and "wrong-key-0123" not in wrong.stderr
    assert len(without_progress(wrong.stderr).strip().splitlines()) <= 2
    assert "Traceback" not in wrong.stderr
    keyless = eqrisk(
        demo_home, "fetch", "--provider", "tiingo", "--symbols", "NVDA",
        "--since", "2026-11-02", **feed_env(fixture_server, key=""),
    )  # fmt: skip
    assert keyless.returncode == 3 and "set EQRISK_TIINGO_API_KEY" in keyless.stderr


def test_a_provider_that_stays_rate_limited_ends_the_fetch_with_advice(
    demo_home: Path, fixture_server: FixtureServer, tmp_path: Path
) -> None:
    proc = eqrisk(
        demo_home, "fetch", "--provider", "tiingo", "--since", "2026-11-02",
        "--symbols", ALWAYS_LIMITED, "--out", str(tmp_path / "x.csv"), **feed_env(fixture_server),
    )  # fmt: skip
    assert proc.returncode == 3
    assert "rate limited" in proc.stderr and "try again later" in proc.stderr
    assert not (tmp_path / "x.csv").exists()


def test_bad_provider_and_dates_are_usage_errors(demo_home: Path) -> None:
    unknown = eqrisk(demo_home, "fetch", "--provider", "bloomberg")
    assert unknown.returncode == 2 and "known providers: tiingo, yahoo" in unknown.stderr
    bad = eqrisk(demo_home, "fetch", "--provider", "yahoo", "--since", "2026-13-01")
    assert bad.returncode == 2 and "YYYY-MM-DD" in bad.stderr


def test_update_from_a_provider_into_a_day_first_data_set(
    demo_home: Path, from_csv: Path, fixture_server: FixtureServer, tmp_path: Path
) -> None:
    """A data set ingested with --date-format DD/MM/YYYY: every merge reads with it, so the
    fetched file is written day first (ISO dates would be refused as bad dates) and the
    version equals the one of the equivalent CSV."""
    home = home_like(demo_home, tmp_path / "home")
    meta_path = home / "ingested" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["basis"]["date_format"] = "DD/MM/YYYY"
    meta_path.write_text(json.dumps(meta))
    proc = eqrisk(home, "update", "--from", "yahoo", "--partial", **feed_env(fixture_server))
    assert proc.returncode == 0, proc.stderr
    fetched = sorted((home / "feeds").glob("yahoo-*.csv"))
    assert len(fetched) == 1
    days = pd.read_csv(fetched[0], dtype=str)["date"].unique().tolist()
    assert days == [pd.Timestamp(d).strftime("%d/%m/%Y") for d in NEW_DAYS]
    snap, arrays = arrays_of(home)
    ref_snap, ref_arrays = arrays_of(from_csv)
    assert list(snap.sessions) == list(ref_snap.sessions)
    for name, values in arrays.items():
        assert nan_equal(values, ref_arrays[name]), name

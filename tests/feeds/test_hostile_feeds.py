"""Feeds that distrust the network (issue 33): against the local fixture server, every malformed
answer, impossible value, dripped or huge body, redirect elsewhere or in a loop, and a closed
port ends the fetch in one line (a ProviderError; exit 3 from the commands), within the
deadline, reading a bounded amount, writing nothing and leaving the data set as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from eqrisk.data.ingest import ingest
from eqrisk.data.providers import Access, ProviderError, provider
from eqrisk.data.providers.feed import fetch
from helpers import free_port, tree_hash

from .fixture_server import (
    AWAY,
    DRIP,
    HOSTILE,
    HUGE,
    HUGE_BYTES,
    HUGE_STREAMED,
    LOOP,
    TIINGO_KEY,
    TIINGO_STRING,
    FixtureServer,
    Market,
)

DAYS = [date(2026, 11, d) for d in (2, 3, 4, 5, 6)]
MAX_BYTES = 1_000_000

# What each refusal names (the symbol is named by every one of the answers' checks).
EXPECTED = {
    "XHUGETS": "timestamp that is not a time",
    "XSTRTS": "timestamp that is not a time",
    "XTRUNC": "not JSON",
    "XHTML": "not JSON",
    "XSHAPE": "no indicators.quote",
    "XSPLIT00": "impossible split 0/0",
    "XLENGTH": "length mismatch",
    "XINF": "impossible close",
    "XE308": "impossible close",
    "XNEG": "impossible close",
    "XOUTSIDE": "days outside the asked",
}


@pytest.fixture(scope="module")
def server() -> Iterator[FixtureServer]:
    rng = np.random.default_rng(33)
    closes = {s: list(50 + np.cumsum(rng.normal(0, 1, len(DAYS)))) for s in ("AAA", "BBB")}
    volumes = {s: [1e6] * len(DAYS) for s in closes}
    with FixtureServer(Market(days=DAYS, close=closes, volume=volumes)).running() as running:
        yield running


def _fetch(server: FixtureServer, name: str, symbol: str, timeout: float = 5.0) -> None:
    access = Access(server.base, TIINGO_KEY, timeout=timeout, max_bytes=MAX_BYTES)
    fetch(provider(name), access, [symbol], DAYS[0], DAYS[-1], {}, fetch_timeout=30.0)


def _one_line(exc: pytest.ExceptionInfo[ProviderError]) -> str:
    message = str(exc.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_a_well_formed_answer_is_taken(server: FixtureServer) -> None:
    access = Access(server.base, timeout=5.0, max_bytes=MAX_BYTES)
    got = fetch(provider("yahoo"), access, ["AAA"], DAYS[0], DAYS[-1], {})
    assert got.frame["close"].round(6).tolist() == [round(c, 6) for c in server.market.close["AAA"]]


@pytest.mark.parametrize("symbol", sorted(HOSTILE))
def test_each_malformed_answer_is_refused_naming_the_symbol(
    server: FixtureServer, symbol: str
) -> None:
    with pytest.raises(ProviderError) as refused:
        _fetch(server, "yahoo", symbol)
    line = _one_line(refused)
    assert symbol in line and EXPECTED[symbol] in line and "refused" in line, line


def test_a_string_price_from_tiingo_is_refused(server: FixtureServer) -> None:
    with pytest.raises(ProviderError) as refused:
        _fetch(server, "tiingo", TIINGO_STRING)
    line = _one_line(refused)
    assert TIINGO_STRING in line and "close value that is not a number" in line, line


def test_a_dripped_body_is_cut_at_the_deadline(server: FixtureServer) -> None:
    # A byte a second: every read returns well within the 3 s timeout, so only the deadline of
    # the whole request ends it (a per-read timeout would read all 1,000 bytes, ~17 minutes).
    with pytest.raises(ProviderError) as refused:
        _fetch(server, "yahoo", DRIP, timeout=3.0)
    assert "within the deadline" in _one_line(refused)
    assert server.sent[DRIP] < 1000


@pytest.mark.parametrize("symbol", [HUGE, HUGE_STREAMED])
def test_a_huge_body_is_never_read_whole(server: FixtureServer, symbol: str) -> None:
    with pytest.raises(ProviderError) as refused:
        _fetch(server, "yahoo", symbol)
    assert f"{MAX_BYTES:,}" in _one_line(refused)
    # The server makes the body as it sends it: the client hung up long before its end.
    assert server.sent.get(symbol, 0) < HUGE_BYTES // 3


@pytest.mark.parametrize(("symbol", "said"), [(AWAY, "another host"), (LOOP, "redirects")])
def test_redirects_stay_on_the_providers_host(
    server: FixtureServer, symbol: str, said: str
) -> None:
    with pytest.raises(ProviderError) as refused:
        _fetch(server, "yahoo", symbol)
    assert said in _one_line(refused)


def _eqrisk(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "eqrisk.cli", *args],
        env={**os.environ, "EQRISK_HOME": str(home), "COLUMNS": "300", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_commands_end_in_one_line_and_exit_3(server: FixtureServer, tmp_path: Path) -> None:
    home = tmp_path / "home"
    rows = [
        {"date": d.isoformat(), "symbol": s, "close": c}
        for s, closes in (("AAA", [40.0, 41.0]), ("BBB", [30.0, 30.5]))
        for d, c in zip((date(2026, 10, 29), date(2026, 10, 30)), closes, strict=True)
    ]
    first = tmp_path / "first.csv"
    pd.DataFrame(rows).to_csv(first, index=False)
    assert ingest([first], None, home=home).ok
    before = tree_hash(home)
    closed = f"http://127.0.0.1:{free_port()}"
    cases = [
        ({"yahoo": closed}, ("update", "--from", "yahoo"), "cannot reach 127.0.0.1"),
        ({"yahoo": server.base}, ("fetch", "--provider", "yahoo", "--symbols", "XHTML"), "XHTML"),
    ]
    for urls, args, said in cases:
        proc = _eqrisk(
            home, *args, EQRISK_PROVIDER_URLS=json.dumps(urls), EQRISK_FEED_TIMEOUT_S="5"
        )
        lines = [line for line in proc.stderr.splitlines() if line.startswith("error")]
        assert proc.returncode == 3, proc.stderr
        assert len(lines) == 1 and said in lines[0] and "Traceback" not in proc.stderr, proc.stderr
        assert tree_hash(home) == before
        assert not (home / "feeds").exists()

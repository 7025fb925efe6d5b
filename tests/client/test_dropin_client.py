"""eqrisk's own client (sync and async) on the routes of the real Service B client beyond the
specification (issue 38): the routes' answers, read the same way by both clients, in process."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest

from eqrisk.api.app import create_app
from eqrisk.client import AsyncClient, Client
from eqrisk.settings import Settings

from .conftest import FUNDED


def test_sync_and_async_clients_read_the_new_routes(home: Path) -> None:
    app = create_app(Settings(home=home, _env_file=None))
    with Client(api_key=FUNDED, transport=httpx.ASGITransport(app)) as c:  # type: ignore[arg-type]
        decomposition = c.decompose("nvda")
        metrics = c.metrics("NVDA")["metrics"]
        correlation = c.factor_correlation(["NVDA", "NOPE"], ["credit", "gold"])
        grid = c.rankings("NVDA", window="1d")
        top = c.top_rankings("mkt_cap", "universe", "1d", limit=5)
    assert decomposition["exposure"]["market"]["er"] == metrics["l3_mkt_er"]
    assert decomposition["exposure"]["residual"]["er"] == metrics["l3_res_er"]
    # the demo data set holds no macro ETF: nulls with warnings, never another series
    first, second = correlation["results"]
    assert first["correlations"] == {"credit": None, "gold": None}
    assert any("HYG" in w for w in first["warnings"]) and second["status"] == 404
    assert len(grid) == 21 and set(grid["window"]) == {"1d"}
    assert list(top["rank_ordinal"]) == [1, 2, 3, 4, 5] and top.attrs["metric"] == "mkt_cap"

    async def run() -> tuple[Any, ...]:
        async with AsyncClient(api_key=FUNDED, transport=httpx.ASGITransport(app)) as a:
            return (
                await a.decompose("NVDA"),
                await a.rankings("NVDA", window="1d"),
                await a.top_rankings("mkt_cap", "universe", "1d", limit=5),
            )

    a_decomposition, a_grid, a_top = asyncio.run(run())
    assert a_decomposition["exposure"] == decomposition["exposure"]
    pd.testing.assert_frame_equal(a_grid, grid)
    pd.testing.assert_frame_equal(a_top, top)


# Each of the rest of the new routes: (method, args, kwargs) and the same request sent by hand.
# Each parameter the method is given changes the answer, so an equal answer shows it was sent.
ROUTES: list[tuple[str, tuple[Any, ...], dict[str, Any], str, str, dict[str, Any]]] = [
    (
        "latest_metrics",
        (["nvda", "AAPL"],),
        {},
        "GET",
        "/api/batch/latest-metrics",
        {"params": {"tickers": "NVDA,AAPL"}},
    ),
    (
        "returns_decomposition",
        ("NVDA", 2),
        {"include_lstar": True},
        "GET",
        "/api/returns-decomposition",
        {"params": {"ticker": "NVDA", "years": 2, "include_lstar": "true"}},
    ),
    (
        "lstar",
        ("NVDA", 2),
        {"threshold": 0.01},
        "GET",
        "/api/lstar",
        {"params": {"ticker": "NVDA", "years": 2, "threshold": 0.01}},
    ),
    (
        "batch_lstar",
        (["NVDA", "MSFT"], 2),
        {},
        "POST",
        "/api/batch/lstar",
        {"json": {"tickers": ["NVDA", "MSFT"], "years": 2}},
    ),
    (
        "macro_factors",
        (["credit", "gold"],),
        {"start": "2024-01-02"},
        "GET",
        "/api/macro-factors",
        {"params": {"factors": "credit,gold", "start": "2024-01-02"}},
    ),
    (
        "etf_factor_returns",
        ("sector", ["XLK", "XLF"]),
        {},
        "GET",
        "/api/etf/factor-returns",
        {"params": {"sleeve": "sector", "tickers": "XLK,XLF"}},
    ),
    (
        "risk_index",
        ({"NVDA": 600.0, "AAPL": 400.0},),
        {"time_series": True},
        "POST",
        "/api/portfolio/risk-index",
        {
            "json": {
                "positions": [{"ticker": "NVDA", "weight": 600}, {"ticker": "AAPL", "weight": 400}],
                "timeSeries": True,
            }
        },
    ),
    (
        "industry_panel",
        (),
        {"level": "sector", "min_peers": 3},
        "GET",
        "/api/industry-panel",
        {"params": {"level": "sector", "min_peers": 3}},
    ),
    (
        "universe_members",
        ("uni_mc_50",),
        {},
        "GET",
        "/api/universe/uni_mc_50/members",
        {},
    ),
]


def _answer(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "_metadata"}


def test_the_rest_of_the_new_routes_through_both_clients(home: Path) -> None:
    from fastapi.testclient import TestClient

    from eqrisk.client import EqriskError

    app = create_app(Settings(home=home, _env_file=None))
    by_hand = TestClient(app, headers={"Authorization": f"Bearer {FUNDED}"})
    want = {}
    for name, _, _, method, path, kw in ROUTES:
        response = by_hand.request(method, path, **kw)
        assert response.status_code == 200, (name, response.text)
        want[name] = _answer(response.json())
    screen_body = {"metric": "mkt_cap", "cohort": "sector", "window": "1d", "limit": 5, "decile": 1}
    screen_want = by_hand.post("/api/rankings/screen", json=screen_body).json()
    assert 0 < len(screen_want["rankings"]) <= 5

    with Client(api_key=FUNDED, transport=httpx.ASGITransport(app)) as c:  # type: ignore[arg-type]
        got = {name: _answer(getattr(c, name)(*a, **kw)) for name, a, kw, *_ in ROUTES}
        screen = c.screen_rankings("mkt_cap", "sector", "1d", limit=5, decile=1)
        lstar_csv = c.batch_lstar(["NVDA", "MSFT"], 2, format="csv")
        with pytest.raises(EqriskError) as refused:
            c.universe_members("../balance")
    assert refused.value.status in (400, 404)
    for name in want:
        assert got[name] == want[name], name
    assert screen.to_dict("records") == screen_want["rankings"]
    assert screen.attrs["cohort"] == "sector"
    # format=csv: a frame, the JSON's arrays stacked per ticker
    assert isinstance(lstar_csv, pd.DataFrame)
    for ticker, item in want["batch_lstar"]["results"].items():
        part = lstar_csv[lstar_csv["ticker"] == ticker]
        assert [str(d.date()) for d in part["date"]] == item["dates"]
        assert list(part["lstar"]) == item["lstar"]
    # a few values, beyond the equality: the parameters took effect
    assert [m["ticker"] for m in got["latest_metrics"]["data"]] == ["NVDA", "AAPL"]
    assert got["universe_members"]["universe"] == "uni_mc_50"
    assert len(got["universe_members"]["members"]) == 50
    assert got["macro_factors"]["factors_requested"] == ["credit", "gold"]
    assert got["macro_factors"]["start"] == "2024-01-02"

    async def run() -> tuple[dict[str, Any], pd.DataFrame]:
        async with AsyncClient(api_key=FUNDED, transport=httpx.ASGITransport(app)) as a:
            answers = {
                name: _answer(await getattr(a, name)(*args, **kw)) for name, args, kw, *_ in ROUTES
            }
            return answers, await a.screen_rankings("mkt_cap", "sector", "1d", limit=5, decile=1)

    a_got, a_screen = asyncio.run(run())
    assert a_got == got
    pd.testing.assert_frame_equal(a_screen, screen)

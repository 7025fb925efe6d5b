"""eqrisk's own client (sync and async) on the routes of the real Service B client beyond the
specification (issue 38): the routes' answers, read the same way by both clients, in process."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pandas as pd

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

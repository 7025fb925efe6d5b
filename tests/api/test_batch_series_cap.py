"""The batch's cap on series ticker-years (api/endpoints/batch_analyze.py): the price is per
ticker and does not grow with `years`, so a batch with a series may ask at most
SERIES_YEARS_PER_TICKER ticker-years per ticker charged. The same 400 from the route and from
/api/estimate, neither charged; /api/estimate tells the cap in `limits`; the Service B client's
default calls (years=1) pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from eqrisk.accounts.book import Accounts
from eqrisk.accounts.db import make_engine
from eqrisk.api.endpoints.batch_analyze import (
    MIN_CHARGED_TICKERS,
    SERIES_YEARS_PER_TICKER,
    BatchParams,
    series_ticker_years,
)
from eqrisk.api.params import validate_params
from helpers import bearer, client_for, new_key

MANY = [f"T{i:03d}" for i in range(100)]


@pytest.mark.parametrize(
    ("tickers", "metrics", "years", "fmt", "asked", "most"),
    [
        (100, ["returns"], 5, "json", 500, 500),  # the worst batch of returns allowed
        (100, ["returns"], 6, "json", 600, 500),
        (100, ["returns", "l3_decomposition"], 2, "json", 400, 500),
        (100, ["returns", "l3_decomposition"], 3, "json", 600, 500),
        (100, ["full_metrics", "hedge_ratios"], 13, "json", 0, 500),  # no series: no cap
        (100, ["full_metrics"], 6, "csv", 600, 500),  # csv and parquet are one series
        (1, ["returns"], 13, "json", 13, 25),  # charged the 5-ticker minimum
        (2, ["returns"], 13, "json", 26, 25),
        (5, ["returns", "hedge_ratios"], 5, "parquet", 25, 25),
        (10, ["returns", "hedge_ratios"], 1, "json", 10, 50),  # the Service B client's default
    ],
)
def test_the_ticker_years_a_batch_asks_and_may_ask(
    tickers: int, metrics: list[str], years: int, fmt: str, asked: int, most: int
) -> None:
    body: dict[str, Any] = {
        "tickers": MANY[:tickers],
        "metrics": metrics,
        "years": years,
        "format": fmt,
    }
    assert SERIES_YEARS_PER_TICKER == 5 and MIN_CHARGED_TICKERS == 5
    if asked <= most:
        assert series_ticker_years(BatchParams.model_validate(body)) == (asked, most)
        return
    with pytest.raises(ValidationError, match=f"= {asked} ticker-years; at most 5 per ticker"):
        BatchParams.model_validate(body)


@pytest.fixture()
def served(home: Path) -> tuple[TestClient, Accounts, str, str]:
    accounts = Accounts(make_engine(home))
    account_id, key = new_key(accounts)
    return client_for(home), accounts, account_id, key


def _charges(accounts: Accounts, account_id: str) -> int:
    return sum(1 for e in accounts.ledger(account_id) if e["kind"] == "charge")


def test_over_the_cap_is_the_same_free_400_from_the_route_and_the_estimate(served) -> None:
    client, accounts, account_id, key = served
    tickers = ["NVDA", "AAPL", "MSFT", "SPY", "XLK", "AMZN"]
    body = {"tickers": tickers, "metrics": ["returns", "hedge_ratios"], "years": 6}
    route = client.post("/api/batch/analyze", json=body, headers=bearer(key))
    estimate = client.post(
        "/api/estimate", json={"endpoint": "batch/analyze", "params": body}, headers=bearer(key)
    )
    for answer in (route, estimate):
        assert answer.status_code == 400
        problem = answer.json()
        assert problem["error"] == "INVALID_PARAMETER"
        assert "6 tickers x 6 years x 1 series = 36 ticker-years" in problem["detail"]
        assert (
            "at most 5 per ticker charged (30 for 6 tickers), so years at most 5"
            in (problem["detail"])
        )
    assert route.json()["detail"].split(": ", 1)[1] == estimate.json()["detail"].split(": ", 1)[1]
    assert _charges(accounts, account_id) == 0

    # At the cap: answered and charged per ticker; the estimate says what the route charges.
    body["years"] = 5
    quote = client.post(
        "/api/estimate", json={"endpoint": "batch/analyze", "params": body}, headers=bearer(key)
    ).json()
    assert quote["limits"] == {
        "tickers": 100,
        "series_years_per_ticker": 5,
        "series_min_charged_tickers": 5,
    }
    ok = client.post("/api/batch/analyze", json=body, headers=bearer(key))
    assert ok.status_code == 200 and ok.json()["summary"]["succeeded"] == 6
    assert float(ok.headers["x-api-cost-usd"]) == pytest.approx(6 * 0.002)
    assert quote["estimated_cost_usd"] == pytest.approx(6 * 0.002)
    assert _charges(accounts, account_id) == 1


def test_one_ticker_gets_its_whole_history(served) -> None:
    """A one-ticker batch is charged the 5-ticker minimum: 25 ticker-years, all 13 years."""
    client, _, _, key = served
    body = {"tickers": ["NVDA"], "metrics": ["returns"], "years": 13}
    ok = client.post("/api/batch/analyze", json=body, headers=bearer(key))
    assert ok.status_code == 200
    rows = client.get(
        "/api/ticker-returns", params={"ticker": "NVDA", "years": 13}, headers=bearer(key)
    ).json()["data"]
    assert ok.json()["results"]["NVDA"]["returns"]["dates"] == [r["date"] for r in rows]
    assert len(rows) > 12 * 250


def test_the_parameters_model_refuses_what_the_estimate_refuses() -> None:
    """The estimate reads `params` with the route's own model: one rule, one sentence."""
    body = {"tickers": MANY, "metrics": ["returns"], "years": 6}
    with pytest.raises(Exception, match="100 tickers x 6 years x 1 series = 600"):
        validate_params(BatchParams, body)

"""`POST /api/portfolio/risk`, `GET /api/factor-covariance` and `GET /api/specific-risk` on the
demo snapshot: Euler contributions add up to the volatility, a one-stock portfolio is that
stock's predicted volatility, the hedge leaves no exposure at its level, the route's volatility
and tracking error equal a dense sqrt(w' Sigma w) built from the served F, H and D, F is PSD,
and the charge equals /api/estimate and the ledger."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from eqrisk.accounts.book import Accounts
from eqrisk.accounts.db import make_engine
from eqrisk.accounts.pricing import PriceTable
from eqrisk.api.app import create_app
from eqrisk.settings import Settings
from helpers import TEST_KEY

AUTH = {"Authorization": f"Bearer {TEST_KEY}"}
BOOK = {"NVDA": 0.3, "AAPL": 0.25, "MSFT": 0.2, "CRVR": 0.15, "DST": -0.1, "XLK": 0.1}


@pytest.fixture(scope="module")
def client(demo_settings: Settings) -> TestClient:
    return TestClient(create_app(demo_settings))


def _post(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    resp = client.post("/api/portfolio/risk", json=body, headers=AUTH)
    assert resp.status_code == 200, resp.text
    doc: dict[str, Any] = resp.json()
    return doc


def _sigma(client: TestClient, date: str) -> tuple[list[str], np.ndarray]:
    """The dense covariance H F H' + D of every symbol, from the served F, H and D only."""
    f = client.get("/api/factor-covariance", params={"date": date}, headers=AUTH).json()
    keys = f["factors"]
    cov = np.array([[np.nan if v is None else v for v in row] for row in f["matrix"]])
    rows = client.get("/api/specific-risk", params={"date": date}, headers=AUTH).json()["data"]
    tickers = [r["ticker"] for r in rows]
    h = np.zeros((len(rows), len(keys)))
    d = np.zeros(len(rows))
    for i, r in enumerate(rows):
        for slot in ("market", "sector", "subsector"):
            if r[f"{slot}_factor"] is not None:
                h[i, keys.index(r[f"{slot}_factor"])] += r[f"{slot}_exposure"]
        for j, key in enumerate(keys):  # the second layer: a column per style factor
            h[i, j] += r.get(f"style_{key}", 0.0)
        d[i] = np.nan if r["specific_var"] is None else r["specific_var"]
    used = np.flatnonzero((np.abs(h) > 0).any(axis=0))
    sub = cov[np.ix_(used, used)]
    sigma = h[:, used] @ np.nan_to_num(sub) @ h[:, used].T + np.diag(np.nan_to_num(d))
    return tickers, sigma


def _dense_vol(tickers: list[str], sigma: np.ndarray, book: dict[str, float]) -> float:
    w = np.zeros(len(tickers))
    for t, x in book.items():
        w[tickers.index(t)] += x
    return float(np.sqrt(w @ sigma @ w))


def test_contributions_add_up_and_the_vol_is_the_dense_one(client: TestClient) -> None:
    doc = _post(client, {"positions": BOOK, "benchmark": "SPY"})
    p = doc["portfolio"]
    vol = p["vol_daily"]
    assert vol > 0 and doc["unused"] == []
    assert abs(sum(x["contribution"] for x in p["positions"]) - vol) <= 1e-12 * vol
    assert abs(sum(p["by_level"].values()) - vol) <= 1e-12 * vol
    by_factor = sum(x["contribution"] for x in p["factors"]) + p["by_level"]["specific"]
    assert abs(by_factor - vol) <= 1e-12 * vol
    assert abs(sum(x["share"] for x in p["positions"]) - 1.0) <= 1e-12
    assert p["vol_annual"] == pytest.approx(vol * np.sqrt(252), rel=1e-15)
    assert p["factor_vol_daily"] ** 2 + p["specific_vol_daily"] ** 2 == pytest.approx(vol**2)
    tickers, sigma = _sigma(client, doc["date"])
    assert vol == pytest.approx(_dense_vol(tickers, sigma, BOOK), rel=1e-12)
    # Tracking error against SPY held for the net value of the positions.
    active = dict(BOOK)
    active["SPY"] = active.get("SPY", 0.0) - sum(BOOK.values())
    te = doc["tracking_error"]["vol_daily"]
    assert te == pytest.approx(_dense_vol(tickers, sigma, active), rel=1e-12)
    # Marginals: the dense gradient Sigma w / vol.
    w = np.zeros(len(tickers))
    for t, x in BOOK.items():
        w[tickers.index(t)] = x
    grad = sigma @ w / np.sqrt(w @ sigma @ w)
    for row in p["positions"]:
        assert row["marginal"] == pytest.approx(grad[tickers.index(row["ticker"])], rel=1e-10)


def test_on_a_past_date_and_in_dollars(client: TestClient) -> None:
    dollars = {k: v * 1_000_000 for k, v in BOOK.items()}
    a = _post(client, {"positions": BOOK, "date": "2022-03-15"})
    b = _post(client, {"positions": dollars, "units": "dollars", "date": "2022-03-15"})
    assert a["date"] == b["date"] <= "2022-03-15"
    assert b["portfolio"]["vol_daily"] == pytest.approx(a["portfolio"]["vol_daily"] * 1e6)
    tickers, sigma = _sigma(client, a["date"])
    assert a["portfolio"]["vol_daily"] == pytest.approx(_dense_vol(tickers, sigma, BOOK), rel=1e-12)


def test_one_stock_is_its_predicted_vol(client: TestClient) -> None:
    for ticker in ("NVDA", "AAPL", "XLK"):
        # On the last session the snapshot holds: the stored forecast of that session.
        rows = client.get("/api/ticker-returns", params={"ticker": ticker}, headers=AUTH).json()
        last = rows["data"][-1]
        doc = _post(client, {"positions": {ticker: 1.0}, "date": last["date"]})
        assert last["date"] == doc["date"]
        assert doc["portfolio"]["vol_daily"] == pytest.approx(last["risk_total_vol"], rel=1e-12)
        assert doc["portfolio"]["specific_vol_daily"] == pytest.approx(
            last["risk_specific_vol"], rel=1e-12, abs=1e-15
        )
        # By default, the next session's: /api/specific-risk's row of that session.
        ahead = _post(client, {"positions": {ticker: 1.0}})
        assert ahead["date"] > last["date"]
        spec = client.get("/api/specific-risk", params={"date": ahead["date"]}, headers=AUTH)
        row = next(r for r in spec.json()["data"] if r["ticker"] == ticker)
        assert ahead["portfolio"]["vol_daily"] == pytest.approx(row["risk_total_vol"], rel=1e-12)


def test_the_default_forecast_is_for_the_session_after_the_last_close(
    client: TestClient,
) -> None:
    """The latest answer is the forecast made with data through the last close, for the next
    exchange session (not the forecast of the last session, a day old); a date on or after
    that session names it too."""
    rows = client.get("/api/ticker-returns", params={"ticker": "NVDA"}, headers=AUTH).json()
    last = pd.Timestamp(rows["data"][-1]["date"])
    doc = _post(client, {"positions": BOOK})
    nxt = pd.Timestamp(doc["date"])
    from eqrisk.data.calendar import sessions_between

    assert nxt == sessions_between(last + pd.Timedelta(days=1), last + pd.Timedelta(days=10))[0]
    later = _post(client, {"positions": BOOK, "date": str((nxt + pd.Timedelta(days=30)).date())})
    assert later["date"] == doc["date"] and later["portfolio"] == doc["portfolio"]
    before = _post(client, {"positions": BOOK, "date": str(last.date())})
    assert before["date"] == str(last.date())
    assert before["portfolio"]["vol_daily"] != doc["portfolio"]["vol_daily"]
    for route in ("/api/factor-covariance", "/api/specific-risk"):
        assert client.get(route, headers=AUTH).json()["date"] == doc["date"]


@pytest.mark.parametrize("level", ["L1", "L2", "L3"])
def test_the_hedge_leaves_no_exposure_at_its_level(client: TestClient, level: str) -> None:
    doc = _post(client, {"positions": BOOK, "level": level})
    legs = doc["hedge"]["legs"]
    assert legs and all(leg["tradable"] for leg in legs)  # the demo's factors are ETFs
    assert [leg["exposure_after"] for leg in legs] == [0.0] * len(legs)
    # The hedged book's vol, from the served F, H and D.
    hedged = dict(BOOK)
    for leg in legs:
        hedged[leg["etf"]] = hedged.get(leg["etf"], 0.0) + leg["notional"]
    tickers, sigma = _sigma(client, doc["date"])
    after = doc["hedge"]["vol_after_daily"]
    assert after == pytest.approx(_dense_vol(tickers, sigma, hedged), rel=1e-10)
    assert after < doc["portfolio"]["vol_daily"]
    split = doc["hedge"]["after"]
    assert abs(sum(split.values()) - after) <= 1e-12 * after
    if level == "L3":  # the model's level: what is left is the style and the specific risk
        p = doc["portfolio"]
        assert after**2 == pytest.approx(
            p["style_vol_daily"] ** 2 + p["specific_vol_daily"] ** 2, rel=1e-12
        )
        assert split["market"] == split["sector"] == split["subsector"] == 0.0
        assert split["style"] > 0.0 and split["specific"] > 0.0


def test_unused_tickers_say_why(client: TestClient) -> None:
    doc = _post(client, {"positions": {"NVDA": 1.0, "NOPE": 1.0, "AAPL": 0.0}})
    reasons = {u["ticker"]: u["reason"] for u in doc["unused"]}
    assert reasons == {"NOPE": "not in the model's universe", "AAPL": "position is zero"}
    resp = client.post("/api/portfolio/risk", json={"positions": {"NOPE": 1.0}}, headers=AUTH)
    assert resp.status_code == 404 and resp.json()["error"] == "NO_DATA"


def test_f_is_psd_and_served_alike_in_every_format(client: TestClient) -> None:
    f = client.get("/api/factor-covariance", headers=AUTH).json()
    cov = np.array([[np.nan if v is None else v for v in row] for row in f["matrix"]])
    ok = np.isfinite(np.diag(cov))
    sub = cov[np.ix_(ok, ok)]
    assert np.allclose(sub, sub.T) and np.linalg.eigvalsh(sub).min() > -1e-15
    resp = client.get("/api/factor-covariance", params={"format": "parquet"}, headers=AUTH)
    table = pq.read_table(io.BytesIO(resp.content)).to_pandas()
    assert table["factor"].tolist() == f["factors"]
    np.testing.assert_array_equal(table[f["factors"]].to_numpy(), cov)
    rows = client.get("/api/specific-risk", headers=AUTH).json()["data"]
    resp = client.get("/api/specific-risk", params={"format": "csv"}, headers=AUTH)
    csv = pd.read_csv(io.StringIO(resp.text))
    assert csv["ticker"].tolist() == [r["ticker"] for r in rows]
    want = np.array([np.nan if r["specific_var"] is None else r["specific_var"] for r in rows])
    np.testing.assert_array_equal(csv["specific_var"].to_numpy(), want)


def test_the_charge_is_the_estimate_and_the_ledger(
    client: TestClient, demo_settings: Settings
) -> None:
    body = {"positions": {**BOOK, "NOPE": 1.0}, "benchmark": "SPY"}
    est = client.post(
        "/api/estimate", json={"endpoint": "portfolio/risk", "params": body}, headers=AUTH
    ).json()
    accounts = Accounts(make_engine(Path(demo_settings.home)))
    record = accounts.authenticate(TEST_KEY)
    assert record is not None
    before = accounts.balance(record.account_id)
    resp = client.post("/api/portfolio/risk", json=body, headers=AUTH)
    charged = int(resp.headers["x-tokens-consumed"])
    price = PriceTable.load()["portfolio/risk"]
    assert charged == est["estimated_tokens"] == price.cost(len(BOOK))  # NOPE is not charged
    assert est["pricing_model"].startswith("per_position")
    assert before - accounts.balance(record.account_id) == charged
    last = [e for e in accounts.ledger(record.account_id) if e["kind"] == "charge"][-1]
    assert last["route"] == "portfolio/risk" and -last["tokens"] == charged


def test_specific_risk_reports_the_level_a_row_really_has(client: TestClient) -> None:
    """Issue 39: a stock without a subsector ETF (AAPL in the demo) is hedged down to its
    sector: level 2, not 3; a row hedged by the market alone (an ETF, an unclassified stock)
    is level 1. Every forecast row's level is its deepest factor slot."""
    rows = client.get("/api/specific-risk", headers=AUTH).json()["data"]
    by_ticker = {r["ticker"]: r for r in rows}
    assert by_ticker["AAPL"]["subsector_factor"] is None and by_ticker["AAPL"]["level"] == 2
    assert by_ticker["NVDA"]["subsector_factor"] is not None and by_ticker["NVDA"]["level"] == 3
    assert by_ticker["XLK"]["level"] == 1
    for r in rows:
        if r["level"] == 0:
            continue
        slots = [r[f"{slot}_factor"] is not None for slot in ("market", "sector", "subsector")]
        assert r["level"] == max(j + 1 for j, has in enumerate(slots) if has), r
    assert {r["level"] for r in rows} >= {1, 2, 3}


def test_each_position_says_the_level_of_the_model_it_was_given(client: TestClient) -> None:
    """Issue 39: every position tells the level of its exposures (the one /api/specific-risk
    reports): NVDA 3 (SMH), AAPL 2 (no subsector ETF in the demo), XLK 1 as a factor of the
    model itself; the benchmark's rows too. Every demo ETF is a factor: no note."""
    book = {"NVDA": 0.4, "AAPL": 0.3, "XLK": 0.2, "CRVR": 0.1}
    doc = _post(client, {"positions": book, "benchmark": "SPY"})
    pos = {x["ticker"]: x for x in doc["portfolio"]["positions"]}
    assert {t: x["model_level"] for t, x in pos.items()} == {
        "NVDA": 3,
        "AAPL": 2,
        "XLK": 1,
        "CRVR": pos["CRVR"]["model_level"],
    }
    assert pos["NVDA"]["model"] == "market, sector and subsector factors"
    assert pos["AAPL"]["model"] == "market and sector factors"
    assert pos["XLK"]["model"].startswith("a factor of the model itself")
    rows = client.get("/api/specific-risk", params={"date": doc["date"]}, headers=AUTH).json()
    level = {r["ticker"]: r["level"] for r in rows["data"]}
    assert all(x["model_level"] == level[t] for t, x in pos.items())
    active = {x["ticker"]: x["model_level"] for x in doc["tracking_error"]["positions"]}
    assert active["SPY"] == 1 and active["NVDA"] == 3
    assert doc["notes"] == []


def test_the_second_layer_is_served_and_its_exposures_agree_everywhere(
    client: TestClient,
) -> None:
    """The style factors: rows of F (level "style"), columns of /api/specific-risk, the rows of
    /api/style-exposures (JSON, CSV, Parquet alike), and factors of the portfolio's answer
    whose exposure is sum_i w_i h_i,s from those served exposures."""
    last = client.get("/api/ticker-returns", params={"ticker": "NVDA"}, headers=AUTH).json()
    date = last["data"][-1]["date"]
    f = client.get("/api/factor-covariance", params={"date": date}, headers=AUTH).json()
    served = [k for k, lv in zip(f["factors"], f["levels"], strict=True) if lv == "style"]
    resp = client.get("/api/style-exposures", params={"date": date}, headers=AUTH)
    assert resp.status_code == 200, resp.text
    doc = resp.json()
    styles = [x["factor"] for x in doc["factors"]]
    assert doc["date"] == date and styles[:2] == ["residual_market", "size"] and len(styles) >= 6
    # F carries the style factors with a forecast that session (in order), none as nulls
    assert served == [s for s in styles if s in served] and len(served) >= 4
    assert all(v is not None for k in served for v in f["matrix"][f["factors"].index(k)])
    assert 0.0 < doc["r2"] < 1.0 and doc["regression_stocks"] >= 30
    assert all(x["factor_return"] is not None for x in doc["factors"][:2])
    frame = pd.DataFrame(doc["data"]).set_index("ticker")
    assert len(frame) >= 30 and (frame["residual_market"] == 1.0).all()
    # Standardised over the layer: each style's values within the +-3 limit (plus tolerance).
    assert (frame[styles[1:]].abs() <= 3.05).all().all()
    for fmt, read in (("csv", lambda b: pd.read_csv(io.BytesIO(b))),
                      ("parquet", lambda b: pq.read_table(io.BytesIO(b)).to_pandas())):  # fmt: skip
        other = read(client.get("/api/style-exposures", params={"date": date, "format": fmt},
                                headers=AUTH).content).set_index("ticker")  # fmt: skip
        np.testing.assert_allclose(other[styles].to_numpy(), frame[styles].to_numpy(), rtol=1e-15)
    spec = client.get("/api/specific-risk", params={"date": date}, headers=AUTH).json()["data"]
    by_ticker = {r["ticker"]: r for r in spec}
    for ticker, row in frame.iterrows():
        spec_row = by_ticker[str(ticker)]
        assert [spec_row[f"style_{s}"] for s in served] == row[served].tolist()
        assert not [s for s in styles if s not in served and f"style_{s}" in spec_row]
    book = {"NVDA": 0.5, "AAPL": 0.3, "CRVR": 0.2}
    risk = _post(client, {"positions": book, "date": date})
    got = {x["factor"]: x for x in risk["portfolio"]["factors"] if x["level"] == "style"}
    assert list(got) == served  # the answer's style factors are F's
    for s in served:
        want = sum(w * by_ticker[t][f"style_{s}"] for t, w in book.items())
        assert got[s]["exposure"] == pytest.approx(want, rel=1e-12, abs=1e-15)
    style_sum = sum(x["contribution"] for x in got.values())
    assert risk["portfolio"]["by_level"]["style"] == pytest.approx(style_sum, rel=1e-12)

"""The real Service B's routes beyond the specification (issue 38, docs/decisions/
drop-in-routes.md), in process on the demo snapshot: shapes as SERVICE-B-WIRE §16-§22 records
them, values against an independent computation (/api/metrics, pandas), bad parameters 4xx."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

from eqrisk.api.app import create_app
from eqrisk.api.deps import served_snapshot
from eqrisk.settings import Settings
from eqrisk.snapshot.versions import Snapshot
from helpers import TEST_KEY, assert_problem

AUTH = {"Authorization": f"Bearer {TEST_KEY}"}
DEMO = {"Authorization": "Bearer eqrisk-demo"}


@pytest.fixture(scope="module")
def client(demo_settings: Settings) -> TestClient:
    return TestClient(create_app(demo_settings))


@pytest.fixture(scope="module")
def snap(client: TestClient) -> Snapshot:
    return served_snapshot(client.app.state.snapshots)  # type: ignore[attr-defined]


def get(client: TestClient, url: str, **params: Any) -> Any:
    resp = client.get(url, params=params, headers=AUTH)
    assert resp.status_code == 200, resp.text[:400]
    return resp.json()


def post(client: TestClient, url: str, body: Any) -> Any:
    resp = client.post(url, json=body, headers=AUTH)
    assert resp.status_code == 200, resp.text[:400]
    return resp.json()


# ------------------------------------------------------------------------------ decompose


@pytest.mark.parametrize("ticker", ["NVDA", "AAPL", "SPY"])
def test_decompose_is_metrics_l3_fields_in_four_layers(client: TestClient, ticker: str) -> None:
    doc = post(client, "/api/decompose", {"ticker": ticker.lower()})
    m = get(client, f"/api/metrics/{ticker}")
    values, meta = m["metrics"], m["meta"]
    assert doc["ticker"] == doc["symbol"] == ticker and doc["teo"] == m["teo"]
    ex = doc["exposure"]
    assert set(ex) == {"market", "sector", "subsector", "residual"}
    for layer, short in [("market", "mkt"), ("sector", "sec"), ("subsector", "sub")]:
        assert ex[layer]["er"] == values[f"l3_{short}_er"]
        assert ex[layer]["hr"] == values[f"l3_{short}_hr"]
    assert ex["residual"] == {"er": values["l3_res_er"], "hr": None, "hedge_etf": None}
    assert ex["market"]["hedge_etf"] == "SPY"
    assert ex["sector"]["hedge_etf"] == meta["sector_etf"]
    assert ex["subsector"]["hedge_etf"] == (meta["subsector_etf"] or meta["sector_etf"])
    expected: dict[str, float] = {}
    for layer in ("market", "sector", "subsector"):
        if ex[layer]["hedge_etf"] and ex[layer]["hr"] is not None:
            etf = ex[layer]["hedge_etf"]
            expected[etf] = expected.get(etf, 0.0) - ex[layer]["hr"]
    assert doc["hedge"] == pytest.approx(expected, abs=0)
    ers = [ex[k]["er"] for k in ex if ex[k]["er"] is not None]
    assert doc["_data_health"]["er_sum"] == pytest.approx(sum(ers), abs=1e-15)
    if ticker == "NVDA":
        assert doc["_data_health"]["er_sum"] == pytest.approx(1.0, abs=1e-9)


def test_decompose_refuses_a_bad_body(client: TestClient) -> None:
    assert_problem(client.post("/api/decompose", json={}, headers=AUTH), 400, "MISSING_PARAMETER")
    bad = client.post("/api/decompose", json={"ticker": "NVDA", "x": 1}, headers=AUTH)
    assert_problem(bad, 400, "INVALID_PARAMETER")
    unknown = client.post("/api/decompose", json={"ticker": "NOPE"}, headers=AUTH)
    assert_problem(unknown, 404, "TICKER_NOT_FOUND")


# ------------------------------------------------------------------------------ latest metrics


def test_latest_metrics_rows_equal_metrics(client: TestClient) -> None:
    doc = get(client, "/api/batch/latest-metrics", tickers="nvda, AAPL NOPE,nvda")
    assert [r["ticker"] for r in doc["data"]] == ["NVDA", "AAPL"]
    assert doc["unknown"] == ["NOPE"]
    for row in doc["data"]:
        m = get(client, f"/api/metrics/{row['ticker']}")
        assert row["date"] == m["teo"]
        assert set(row) == {"ticker", "date", *(f"l3_{a}_{b}" for a in ("mkt", "sec", "sub")
                                                 for b in ("hr", "er"))}  # fmt: skip
        for name, value in row.items():
            if name.startswith("l3_"):
                assert value == m["metrics"][name]


def test_latest_metrics_errors(client: TestClient) -> None:
    none = client.get("/api/batch/latest-metrics?tickers=NOPE,ZZZZ", headers=AUTH)
    assert_problem(none, 404, "TICKER_NOT_FOUND")
    empty = client.get("/api/batch/latest-metrics?tickers=,", headers=AUTH)
    assert_problem(empty, 400, "MISSING_PARAMETER")
    assert_problem(client.get("/api/batch/latest-metrics", headers=AUTH), 400, "MISSING_PARAMETER")


# ------------------------------------------------------------------------------ returns decomposition


def test_returns_decomposition_gross_is_factor_plus_residual(client: TestClient) -> None:
    doc = get(client, "/api/returns-decomposition", ticker="NVDA", years=2, include_lstar="true")
    series = get(client, "/api/ticker-returns", ticker="NVDA", years=2)["data"]
    frame = pd.DataFrame(series)
    assert doc["dates"] == list(frame["date"])
    gross = np.array(doc["gross_return"], dtype=float)
    np.testing.assert_array_equal(gross, frame["returns_gross"].to_numpy(dtype=float))
    checked = 0
    for k in (1, 2, 3):
        cfr = np.array(doc[f"l{k}_combined_factor_return"], dtype=float)
        rr = np.array(doc[f"l{k}_residual_return"], dtype=float)
        np.testing.assert_array_equal(cfr, frame[f"l{k}_cfr"].to_numpy(dtype=float))
        ok = np.isfinite(cfr) & np.isfinite(rr)
        assert np.abs(gross[ok] - (cfr[ok] + rr[ok])).max() < 1e-12
        checked += int(ok.sum())
    assert checked > 3 * 400
    spy = pd.DataFrame(get(client, "/api/ticker-returns", ticker="SPY", years=2)["data"])
    market = dict(zip(spy["date"], spy["returns_gross"], strict=True))
    assert doc["l1_factor_return"] == [market.get(d) for d in doc["dates"]]
    # L*: the level whose out-of-sample residual share (lk_hq) is least, its residual return
    levels = {"L1": 1, "L2": 2, "L3": 3}
    assert set(doc["lstar"]) <= {"L1", "L2", "L3", None}
    assert {"L1", "L2", "L3"} & set(doc["lstar"])
    for i, level in enumerate(doc["lstar"]):
        if level is not None:
            k = levels[level]
            assert doc["lstar_residual_return"][i] == doc[f"l{k}_residual_return"][i]


def test_returns_decomposition_errors(client: TestClient) -> None:
    url = "/api/returns-decomposition"
    assert_problem(
        client.get(f"{url}?ticker=NVDA&years=11", headers=AUTH), 400, "INVALID_PARAMETER"
    )
    assert_problem(
        client.get(f"{url}?ticker=NVDA&market_factor_etf=QQQ", headers=AUTH),
        400,
        "INVALID_PARAMETER",
    )
    assert_problem(client.get(f"{url}?ticker=NOPE", headers=AUTH), 404, "TICKER_NOT_FOUND")


# ------------------------------------------------------------------------------ rankings


def _cross_section(snap: Snapshot) -> pd.DataFrame:
    """The ranked cross-section, computed here with pandas from the snapshot arrays."""
    idx = snap.index
    t = idx.n_sessions - 1
    rows = []
    for sym in idx.symbols.values():
        if sym.asset_type != "stock" or not np.isfinite(snap.array("price_close")[sym.row, t]):
            continue
        ret = pd.Series(snap.array("return")[sym.row, t - 20 : t + 1])
        rows.append(
            {
                "ticker": sym.ticker,
                "sector": sym.sector_etf,
                "subsector": sym.subsector_etf,
                "mkt_cap": snap.array("market_cap")[sym.row, t],
                "gross_return": (1 + ret).prod(skipna=False) - 1,
                "er_l3": 1 - snap.array("l3_res_er")[sym.row, t],
            }
        )
    return pd.DataFrame(rows).set_index("ticker")


@pytest.mark.parametrize(
    ("metric", "window"), [("mkt_cap", "1d"), ("gross_return", "21d"), ("er_l3", "1d")]
)
@pytest.mark.parametrize("cohort", ["universe", "sector"])
def test_rankings_equal_pandas_rank_pct(
    client: TestClient, snap: Snapshot, metric: str, window: str, cohort: str
) -> None:
    frame = _cross_section(snap).dropna(subset=[metric])
    if cohort == "universe":
        pct = frame[metric].rank(method="max", pct=True) * 100
        size = pd.Series(len(frame), index=frame.index)
    else:
        grouped = frame.dropna(subset=["sector"]).groupby("sector")[metric]
        pct = grouped.rank(method="max", pct=True) * 100
        size = grouped.transform("size")
    top = get(client, "/api/rankings/top", metric=metric, cohort=cohort, window=window, limit=100)
    assert top["teo"] == str(snap.index.data_as_of)
    rows = top["rankings"]
    assert len(rows) == min(100, len(pct))
    assert [r["rank_percentile"] for r in rows] == sorted(
        (r["rank_percentile"] for r in rows), reverse=True
    )
    for r in rows:
        assert r["rank_percentile"] == pytest.approx(pct[r["ticker"]], abs=1e-9)
        assert r["cohort_size"] == size[r["ticker"]]
        assert r["rank_percentile"] == pytest.approx(
            (1 - (r["rank_ordinal"] - 1) / r["cohort_size"]) * 100, abs=1e-9
        )
    one = get(client, "/api/rankings/NVDA", metric=metric, cohort=cohort, window=window)
    (row,) = one["rankings"]
    assert row["rank_percentile"] == pytest.approx(pct["NVDA"], abs=1e-9)
    assert row["display_label"] == f"{window} · {cohort} · {metric}"


def test_rankings_grid_and_screen(client: TestClient, snap: Snapshot) -> None:
    grid = get(client, "/api/rankings/nvda")
    assert len(grid["rankings"]) == 84
    assert [(r["window"], r["cohort"], r["metric"]) for r in grid["rankings"][:8]] == [
        ("1d", "universe", m)
        for m in (
            "mkt_cap",
            "gross_return",
            "sector_residual",
            "subsector_residual",
            "er_l1",
            "er_l2",
            "er_l3",
        )
    ] + [("1d", "sector", "mkt_cap")]
    outside = [r for r in grid["rankings"] if r["window"] != "1d" and r["metric"] == "mkt_cap"]
    assert outside and all(r["rank_ordinal"] is None for r in outside)
    assert get(client, "/api/rankings/SPY")["rankings"] == []  # an ETF is not ranked
    body = {"metric": "mkt_cap", "cohort": "universe", "window": "1d", "min_percentile": 50}
    screen = post(client, "/api/rankings/screen", body)
    frame = _cross_section(snap)
    pct = frame["mkt_cap"].dropna().rank(method="max", pct=True) * 100
    assert screen["matched_count"] == int((pct >= 50).sum())
    best = pct[pct >= 50].sort_values(ascending=False, kind="stable")
    assert [r["ticker"] for r in screen["rankings"]] == list(best.index[:100])
    xlk = post(client, "/api/rankings/screen", {**body, "sector_filter": "xlk", "decile": 1})
    for r in xlk["rankings"]:
        assert snap.index.symbols[r["ticker"]].sector_etf == "XLK"
        assert r["rank_percentile"] > 90


def test_rankings_errors(client: TestClient) -> None:
    bad = client.get("/api/rankings/top?metric=nope&cohort=universe&window=1d", headers=AUTH)
    assert_problem(bad, 400, "INVALID_PARAMETER")
    limit = client.get(
        "/api/rankings/top?metric=mkt_cap&cohort=universe&window=1d&limit=101", headers=AUTH
    )
    assert_problem(limit, 400, "INVALID_PARAMETER")
    assert_problem(client.get("/api/rankings/NOPE", headers=AUTH), 404, "TICKER_NOT_FOUND")
    assert_problem(
        client.get("/api/rankings/NVDA?window=2d", headers=AUTH), 400, "INVALID_PARAMETER"
    )
    screen = client.post("/api/rankings/screen", json={"metric": "mkt_cap"}, headers=AUTH)
    assert_problem(screen, 400, "MISSING_PARAMETER")


def test_the_demo_key_sees_its_seven_tickers_only(client: TestClient) -> None:
    resp = client.get(
        "/api/rankings/top?metric=mkt_cap&cohort=universe&window=1d&limit=100", headers=DEMO
    )
    assert resp.status_code == 200
    from eqrisk.data.master import MAG7

    assert resp.json()["rankings"] and {r["ticker"] for r in resp.json()["rankings"]} <= set(MAG7)
    assert client.post("/api/decompose", json={"ticker": "NVDA"}, headers=DEMO).status_code == 200
    assert_problem(
        client.post("/api/decompose", json={"ticker": "CRVR"}, headers=DEMO), 403, "DEMO_RESTRICTED"
    )
    latest = client.get("/api/batch/latest-metrics?tickers=NVDA,CRVR", headers=DEMO)
    assert_problem(latest, 403, "DEMO_RESTRICTED")


# ------------------------------------------------------------------------------ L*


def _expected_level(hq: list[float], threshold: float | None) -> int:
    """The L* rule written out per session: the least residual share (the simplest level on
    a tie), or with a threshold one level deeper while it gains at least the threshold."""
    if hq[0] != hq[0]:
        return 0
    if threshold is None:
        best = 0
        for k in (1, 2):
            if hq[k] == hq[k] and hq[k] < hq[best]:
                best = k
        return best + 1
    level = 0
    for k in (1, 2):
        if level == k - 1 and hq[k] == hq[k] and hq[level] - hq[k] >= threshold:
            level = k
    return level + 1


@pytest.mark.parametrize("threshold", [None, 0.01])
def test_lstar_is_the_rule_applied_to_the_stored_hedge_quality(
    client: TestClient, threshold: float | None
) -> None:
    params: dict[str, Any] = {"ticker": "NVDA", "years": 3}
    if threshold is not None:
        params["threshold"] = threshold
    doc = get(client, "/api/lstar", **params)
    frame = pd.DataFrame(get(client, "/api/ticker-returns", ticker="NVDA", years=3)["data"])
    assert doc["dates"] == list(frame["date"]) and doc["threshold_used"] == threshold
    chosen = []
    for i, row in enumerate(frame.itertuples()):
        k = _expected_level([row.l1_hq, row.l2_hq, row.l3_hq], threshold)
        chosen.append(k)
        assert doc["lstar"][i] == (f"L{k}" if k else None)
        if k:
            assert doc["residual_return"][i] == getattr(row, f"l{k}_rr")
            assert doc["market_hr"][i] == getattr(row, f"l{k}_mkt_hr")
            assert doc["total_er"][i] == pytest.approx(1 - getattr(row, f"l{k}_res_er"), abs=1e-15)
    assert set(chosen) - {0}
    # AAPL has no subsector ETF: its L3 columns repeat L2, a tie, so L3 is never chosen.
    aapl = get(client, "/api/lstar", ticker="AAPL", years=3)["lstar"]
    assert "L3" not in aapl and {"L1", "L2"} & set(aapl)
    batch = post(client, "/api/batch/lstar", {"tickers": ["nvda", "NOPE"], "years": 3,
                                              **({"threshold": threshold} if threshold else {})})  # fmt: skip
    assert batch["results"]["NOPE"]["status"] == "error"
    entry = batch["results"]["NVDA"]
    assert entry["status"] == "success" and entry["lstar"] == doc["lstar"]
    csv = client.post(
        "/api/batch/lstar", json={"tickers": ["NVDA"], "years": 3, "format": "csv"}, headers=AUTH
    )
    table = pd.read_csv(io.StringIO(csv.text))
    if threshold is None:
        assert list(table["lstar"].fillna("")) == [x or "" for x in doc["lstar"]]
        np.testing.assert_array_equal(
            table["residual_return"].to_numpy(float), np.array(doc["residual_return"], float)
        )


# ------------------------------------------------------------------------------ risk index


def test_the_risk_index_volatility_is_the_forecast_not_a_weighted_average(
    client: TestClient,
) -> None:
    body = {
        "positions": [
            {"ticker": "nvda", "weight": 500000},
            {"ticker": "AAPL", "weight": 300000},
            {"ticker": "MSFT", "weight": 200000},
            {"ticker": "NOPE", "weight": 100000},
        ],
        "timeSeries": True,
    }
    doc = post(client, "/api/portfolio/risk-index", body)
    weights = {"NVDA": 0.5, "AAPL": 0.3, "MSFT": 0.2}  # NOPE dropped, the rest renormalised
    risk = post(client, "/api/portfolio/risk", {"positions": weights})["portfolio"]
    index = doc["portfolio_risk_index"]
    assert index["portfolio_volatility_23d"] == pytest.approx(risk["vol_annual"], rel=1e-12)
    split = index["variance_decomposition"]
    parts = ("market", "sector", "subsector", "style", "residual")  # style: the second layer
    assert sum(split[k] for k in parts) == pytest.approx(1.0, abs=1e-12)
    assert split["style"] == pytest.approx(risk["by_level"]["style"] / risk["vol_daily"])
    assert split["residual"] == pytest.approx(risk["by_level"]["specific"] / risk["vol_daily"])
    average = sum(
        w * get(client, f"/api/metrics/{t}")["metrics"]["vol_23d"] for t, w in weights.items()
    )
    assert index["weighted_average_vol_23d"] == pytest.approx(average, rel=1e-12)
    assert index["portfolio_volatility_23d"] < average  # diversification, which the average lacks
    assert doc["summary"] == {"total_positions": 4, "resolved": 3, "errors": 1}
    assert doc["errors"][0]["ticker"] == "NOPE"
    assert set(doc["per_ticker"]) == set(weights)
    assert doc["per_ticker"]["AAPL"]["weight"] == pytest.approx(0.3, abs=1e-15)
    last = doc["time_series"][-1]
    m = {t: get(client, f"/api/metrics/{t}")["metrics"] for t in weights}
    assert last["market_er"] == pytest.approx(
        sum(w * m[t]["l3_mkt_er"] for t, w in weights.items()), abs=1e-12
    )


def test_the_risk_index_without_positions_is_not_charged(client: TestClient) -> None:
    resp = client.post("/api/portfolio/risk-index", json={"positions": []}, headers=AUTH)
    assert resp.status_code == 200 and resp.json()["status"] == "syncing"
    assert resp.headers["x-tokens-consumed"] == "0"
    bad = client.post(
        "/api/portfolio/risk-index", json={"positions": [{"ticker": "NVDA", "weight": -1}]},
        headers=AUTH,
    )  # fmt: skip
    assert_problem(bad, 400, "INVALID_PARAMETER")


# ------------------------------------------------------------------------------ universes


def test_industry_panel_equals_pandas_groupby(client: TestClient, snap: Snapshot) -> None:
    doc = get(client, "/api/industry-panel", level="market", min_peers=2)
    t = snap.index.n_sessions - 1
    rows = []
    for sym in snap.index.symbols.values():
        if sym.asset_type == "stock" and sym.industry and sym.last == t:
            hr = snap.array("l1_mkt_hr")[sym.row, t]
            cap = snap.array("market_cap")[sym.row, t]
            rows.append({"industry": sym.industry, "hr": hr, "logcap": np.log(cap)})
    frame = pd.DataFrame(rows).dropna(subset=["hr"])
    grouped = frame.groupby("industry")
    want = pd.DataFrame(
        {
            "mean": grouped["hr"].mean(),
            "var": grouped["hr"].var(),
            "n": grouped.size(),
            "logcap": grouped["logcap"].sum(),
        }
    )
    want = want[want["n"] >= 2]
    got = {r["industry_code"]: r for r in doc["industries"]}
    assert set(got) == set(want.index) and got
    for code, row in want.iterrows():
        assert got[code]["level"] == "market" and got[code]["n_companies"] == row["n"]
        assert got[code]["beta_mean"] == pytest.approx(row["mean"], rel=1e-12)
        assert got[code]["beta_variance"] == pytest.approx(row["var"], rel=1e-9)
        assert got[code]["total_log_mcap_weight"] == pytest.approx(row["logcap"], rel=1e-12)


def test_universe_members_are_the_largest_caps(client: TestClient, snap: Snapshot) -> None:
    doc = get(client, "/api/universe/uni_mc_50/members")
    t = snap.index.n_sessions - 1
    caps = pd.Series(
        {
            s.ticker: snap.array("market_cap")[s.row, t]
            for s in snap.index.symbols.values()
            if s.asset_type == "stock" and s.last == t
        }
    ).dropna()
    assert doc["members"] == list(caps.sort_values(ascending=False, kind="stable").index[:50])
    assert doc["counts"]["active"] == min(50, len(caps))
    dv = get(client, "/api/universe/UNI_DV_50/members")
    assert len(dv["members"]) == min(50, len(caps)) and dv["universe"] == "uni_dv_50"
    bad = client.get("/api/universe/uni_xx_50/members", headers=AUTH)
    assert_problem(bad, 400, "INVALID_PARAMETER")

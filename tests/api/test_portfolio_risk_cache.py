"""The served risk model read once (`snapshot.risk_days`) and the honest answers of
`POST /api/portfolio/risk` on the demo snapshot: a 5,000-position book against a 5,000-position
benchmark answers what the previous, uncached code path answered (kept here) to 1e-12 and a dense
sqrt(w' Sigma w) built from the served F, H and D; each day's model and the version's rows are
built once however many requests read them; non-finite and overflowing books are free 400s; the
answer says which share of the book it used, and that it is partial below the threshold."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from eqrisk.api.app import create_app
from eqrisk.model.portfolio_risk import portfolio_risk
from eqrisk.settings import Settings
from eqrisk.snapshot import risk_days
from eqrisk.snapshot.risk_arrays import HEDGE_FIELDS, RiskRows, model_day
from eqrisk.snapshot.versions import Snapshot
from helpers import TEST_KEY

AUTH = {"Authorization": f"Bearer {TEST_KEY}"}


@pytest.fixture(scope="module")
def client(demo_settings: Settings) -> TestClient:
    return TestClient(create_app(demo_settings))


def _balance(client: TestClient) -> float:
    doc: dict[str, Any] = client.get("/api/balance", headers=AUTH).json()
    return float(doc["balance_tokens"])


def _old_answer(
    snap: Snapshot, t: int, positions: Mapping[str, float], benchmark: Mapping[str, float]
) -> dict[str, Any]:
    """The answer as the code before the cache computed it: the day's model rebuilt from the
    files on each use (`model_day` reading the symbols itself), the hedge by a loop."""
    arrays = {name: snap.array(name) for name in (*HEDGE_FIELDS, "risk_specific_var")}
    day = model_day(snap.path, snap.manifest, arrays, t)
    risk = portfolio_risk(day, positions, benchmark=benchmark)
    legs = portfolio_risk(model_day(snap.path, snap.manifest, arrays, t), positions).hedge
    hedged = dict(positions)
    for key, notional, ok in zip(legs.keys, legs.notional.tolist(), legs.tradable, strict=True):
        if ok and key in day.row_of:
            hedged[key] = hedged.get(key, 0.0) + notional
    bad = {u.ticker for u in risk.unusable}
    used = {k: v for k, v in hedged.items() if k not in bad}
    x = np.zeros(len(day.factor_keys))
    for ticker, w in used.items():
        r = day.row_of.get(ticker, -1)
        if r < 0 or not day.usable[r]:
            continue
        for j in range(3):
            if day.index[r, j] >= 0:
                x[day.index[r, j]] += day.values[r, j] * w
    where = {k: i for i, k in enumerate(day.factor_keys)}
    assert risk.active is not None
    return {
        "vol": risk.portfolio.vol,
        "te": risk.active.vol,
        "contributions": dict(
            zip(
                risk.portfolio.positions.tickers,
                risk.portfolio.positions.contribution.tolist(),
                strict=True,
            )
        ),
        "legs": dict(zip(legs.keys, legs.notional.tolist(), strict=True)),
        "after": portfolio_risk(day, used).portfolio.vol,
        "exposure_after": {k: float(x[where[k]]) for k in legs.keys},
    }


def _dense(client: TestClient, date: str) -> tuple[dict[str, int], np.ndarray]:
    """Sigma = H F H' + D of every symbol, from the served F, H and D only."""
    f = client.get("/api/factor-covariance", params={"date": date}, headers=AUTH).json()
    keys = f["factors"]
    cov = np.array([[np.nan if v is None else v for v in row] for row in f["matrix"]])
    rows = client.get("/api/specific-risk", params={"date": date}, headers=AUTH).json()["data"]
    h = np.zeros((len(rows), len(keys)))
    d = np.zeros(len(rows))
    for i, r in enumerate(rows):
        for slot in ("market", "sector", "subsector"):
            if r[f"{slot}_factor"] is not None:
                h[i, keys.index(r[f"{slot}_factor"])] += r[f"{slot}_exposure"]
        for j, key in enumerate(keys):  # the second layer's style exposures
            h[i, j] += r.get(f"style_{key}", 0.0)
        d[i] = np.nan_to_num(np.nan if r["specific_var"] is None else r["specific_var"])
    cols = np.flatnonzero((np.abs(h) > 0).any(axis=0))
    sigma = h[:, cols] @ np.nan_to_num(cov[np.ix_(cols, cols)]) @ h[:, cols].T + np.diag(d)
    return {r["ticker"]: i for i, r in enumerate(rows)}, sigma


def _books(day_symbols: list[str]) -> tuple[dict[str, float], dict[str, float]]:
    """5,000 positions and a 5,000-position benchmark: every demo symbol, the rest unknown."""
    rng = np.random.default_rng(32)
    names = [*day_symbols, *(f"ZZ{i:05d}" for i in range(5000 - len(day_symbols)))]
    book = dict(zip(names, rng.normal(0.0, 1e-3, 5000).tolist(), strict=True))
    bench = dict(zip(names[::-1], rng.uniform(0.0, 4e-4, 5000).tolist(), strict=True))
    return book, bench


def test_a_5000_position_book_equals_the_old_path_and_the_dense_one(
    client: TestClient, snap: Snapshot
) -> None:
    risk_days.clear()
    t = len(snap.sessions)  # the default: the session after the last close
    symbols = [str(s) for s in risk_days.risk_rows(snap).symbols.tolist()]
    assert len(symbols) < 5000
    book, bench = _books(symbols)
    resp = client.post(
        "/api/portfolio/risk", json={"positions": book, "benchmark": bench}, headers=AUTH
    )
    assert resp.status_code == 200, resp.text
    doc = resp.json()
    old = _old_answer(snap, t, book, bench)
    p = doc["portfolio"]
    assert p["vol_daily"] == pytest.approx(old["vol"], rel=1e-12, abs=0)
    assert doc["tracking_error"]["vol_daily"] == pytest.approx(old["te"], rel=1e-12, abs=0)
    got = {x["ticker"]: x["contribution"] for x in p["positions"]}
    assert got.keys() == old["contributions"].keys()
    for ticker, c in old["contributions"].items():
        assert got[ticker] == pytest.approx(c, rel=1e-12, abs=1e-15 * old["vol"])
    legs = doc["hedge"]["legs"]
    assert {x["etf"]: x["notional"] for x in legs} == pytest.approx(old["legs"], rel=1e-12)
    assert {x["etf"]: x["exposure_after"] for x in legs} == pytest.approx(
        old["exposure_after"], rel=1e-12, abs=1e-15
    )
    assert doc["hedge"]["vol_after_daily"] == pytest.approx(old["after"], rel=1e-12, abs=0)

    where, sigma = _dense(client, doc["date"])
    used = [x["ticker"] for x in p["positions"]]
    w = np.zeros(len(where))
    for ticker in used:
        w[where[ticker]] += book[ticker]
    assert p["vol_daily"] == pytest.approx(float(np.sqrt(w @ sigma @ w)), rel=1e-12)
    active = w.copy()
    bench_used = set(bench) - {u["ticker"] for u in doc["benchmark_unused"]}
    for ticker in bench_used:
        active[where[ticker]] -= bench[ticker]
    te = float(np.sqrt(active @ sigma @ active))
    assert doc["tracking_error"]["vol_daily"] == pytest.approx(te, rel=1e-12)

    gross = sum(abs(v) for v in book.values())
    assert doc["used_share"] == pytest.approx(sum(abs(book[k]) for k in used) / gross, rel=1e-12)
    assert doc["partial"] is True  # most of the 5,000 names are unknown
    assert len(doc["unused"]) == 5000 - len(used)


def test_each_days_model_is_built_once(
    client: TestClient, snap: Snapshot, monkeypatch: pytest.MonkeyPatch
) -> None:
    risk_days.clear()
    reads: list[str] = []
    real = RiskRows.read.__func__  # type: ignore[attr-defined]

    def counted(cls: type[RiskRows], folder: Any, manifest: Any) -> RiskRows:
        reads.append(str(folder))
        result: RiskRows = real(cls, folder, manifest)
        return result

    monkeypatch.setattr(RiskRows, "read", classmethod(counted))
    body = {"positions": {"NVDA": 0.5, "AAPL": 0.3, "MSFT": 0.2}, "benchmark": "SPY"}
    first = None
    for level in ("L3", "L2", "L2", "L3", "L1"):
        resp = client.post("/api/portfolio/risk", json={**body, "level": level}, headers=AUTH)
        assert resp.status_code == 200, resp.text
        if level == "L3":
            first = first or resp.json()["portfolio"]["vol_daily"]
            assert resp.json()["portfolio"]["vol_daily"] == first
    client.get("/api/specific-risk", headers=AUTH).raise_for_status()
    t = len(snap.sessions)  # the default: the session after the last close
    assert reads == [str(snap.path)]  # the symbols and factor slots: once for the version
    assert sorted(risk_days.cached_days()) == [(str(snap.path), t, lv) for lv in (1, 2, 3)]


@pytest.mark.parametrize(
    ("positions", "says"),
    [
        ({"NVDA": 1e300}, "finite number of magnitude at most 1e+15"),
        ({"NVDA": 6e14, "nvda": 6e14}, "1.2e+15"),
        ({"NVDA": -2e15, "AAPL": 0.5}, "NVDA"),
    ],
)
def test_an_overflowing_book_is_a_free_400(
    client: TestClient, positions: dict[str, float], says: str
) -> None:
    before = _balance(client)
    resp = client.post("/api/portfolio/risk", json={"positions": positions}, headers=AUTH)
    assert resp.status_code == 400, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    assert says in resp.json()["detail"]
    assert _balance(client) == before


def test_non_finite_numbers_are_refused_as_json(client: TestClient) -> None:
    for text in ('{"positions": {"NVDA": NaN}}', '{"positions": {"NVDA": 1e400}}'):
        resp = client.post(
            "/api/portfolio/risk",
            content=text,
            headers={**AUTH, "Content-Type": "application/json"},
        )
        assert resp.status_code == 400, resp.text


def test_the_answer_says_the_share_of_the_book_it_used(client: TestClient) -> None:
    body = {"positions": {"AAPL": 0.3, "NOSUCH1": 0.5, "NOSUCH2": -0.2}}
    doc = client.post("/api/portfolio/risk", json=body, headers=AUTH).json()
    assert doc["used_share"] == pytest.approx(0.3, rel=1e-12)
    assert doc["partial"] is True
    assert {u["ticker"] for u in doc["unused"]} == {"NOSUCH1", "NOSUCH2"}
    whole = client.post(
        "/api/portfolio/risk", json={"positions": {"AAPL": 0.6, "MSFT": -0.4}}, headers=AUTH
    ).json()
    assert whole["used_share"] == 1.0 and whole["partial"] is False


def test_the_demo_key_may_name_the_etfs_its_seven_imply(client: TestClient, snap: Snapshot) -> None:
    from eqrisk.data.master import MAG7

    demo = {"Authorization": "Bearer eqrisk-demo"}
    etfs = risk_days.implied_etfs(snap, MAG7)
    assert "SPY" in etfs and "XLK" in etfs
    # The ETFs are those the model ties the seven to, read here from the served H.
    rows = client.get("/api/specific-risk", headers=AUTH).json()["data"]
    tied = {
        r[f"{slot}_factor"]
        for r in rows
        if r["ticker"] in MAG7
        for slot in ("market", "sector", "subsector")
        if r[f"{slot}_factor"] and not r[f"{slot}_factor"].startswith("group:")
    }
    assert tied <= set(etfs)
    body = {"positions": {"NVDA": 0.5, "AAPL": 0.5}, "benchmark": "SPY"}
    ok = client.post("/api/portfolio/risk", json=body, headers=demo)
    assert ok.status_code == 200, ok.text
    assert {leg["etf"] for leg in ok.json()["hedge"]["legs"]} <= set(etfs)
    other = next(str(s) for s in risk_days.risk_rows(snap).symbols if str(s) not in {*MAG7, *etfs})
    refused = client.post(
        "/api/portfolio/risk", json={"positions": {"NVDA": 0.5, other: 0.5}}, headers=demo
    )
    assert refused.status_code == 403, refused.text
    assert other in refused.json()["detail"] and "SPY" in refused.json()["allowed_tickers"]


def test_the_estimate_tells_the_caps_and_a_larger_book_is_a_free_400(
    client: TestClient,
) -> None:
    body = {"positions": {"NVDA": 0.5}}
    est = client.post(
        "/api/estimate", json={"endpoint": "portfolio/risk", "params": body}, headers=AUTH
    ).json()
    assert est["limits"] == {
        "positions": 5000,
        "benchmark_positions": 5000,
        "abs_position": 1e15,
        "positions_sent_per_unit": 50,
    }
    batch = client.post(
        "/api/estimate",
        json={"endpoint": "batch/analyze", "params": {"tickers": ["NVDA"]}},
        headers=AUTH,
    ).json()
    assert batch["limits"] == {
        "tickers": 100,
        "series_years_per_ticker": 5,
        "series_min_charged_tickers": 5,
    }
    before = _balance(client)
    too_many = {f"ZZ{i:05d}": 1e-3 for i in range(5001)}
    for big in ({"positions": too_many}, {"positions": {"NVDA": 1.0}, "benchmark": too_many}):
        resp = client.post("/api/portfolio/risk", json=big, headers=AUTH)
        assert resp.status_code == 400, resp.text
        assert "5000" in resp.json()["detail"]
    assert _balance(client) == before


def test_a_book_of_unknown_tickers_is_charged_per_positions_sent(client: TestClient) -> None:
    """One unit per position used, and at least one per 50 positions sent (benchmark
    included): 4,999 unknown tickers and NVDA, against a benchmark of the same 5,000, cost 200
    units (0.08 USD), as the estimate says, not the 0.01 minimum."""
    book = {**{f"ZZ{i:05d}": 1e-3 for i in range(4999)}, "NVDA": 1e-3}
    body = {"positions": book, "benchmark": book}
    est = client.post(
        "/api/estimate", json={"endpoint": "portfolio/risk", "params": body}, headers=AUTH
    ).json()
    assert est["estimated_cost_usd"] == pytest.approx(0.08, rel=1e-12)
    assert "at least one unit per 50 positions sent" in est["note"]
    before = _balance(client)
    resp = client.post("/api/portfolio/risk", json=body, headers=AUTH)
    assert resp.status_code == 200, resp.text
    assert float(resp.headers["x-api-cost-usd"]) == pytest.approx(0.08, rel=1e-12)
    assert before - _balance(client) == est["estimated_tokens"]
    assert [p["ticker"] for p in resp.json()["portfolio"]["positions"]] == ["NVDA"]
    small = {"positions": {"NVDA": 0.5, "NOSUCH": 0.5}, "benchmark": "SPY"}
    resp = client.post("/api/portfolio/risk", json=small, headers=AUTH)
    assert float(resp.headers["x-api-cost-usd"]) == pytest.approx(0.01, rel=1e-12)


def test_an_upper_case_book_is_read_in_one_pass_and_others_add_up() -> None:
    """The positions' check keeps an upper-case, unpadded book as sent (the same dict, no
    per-ticker work: the usual 5,000-position book); lower case, padding and the same ticker
    twice go the long way and add up."""
    from eqrisk.api.endpoints.portfolio_risk import PortfolioRiskParams, as_sent

    book = {f"T{i:04d}": (i + 1) / 5000 for i in range(5000)}
    assert as_sent(list(book))  # the one-pass path (a newline join had made it unreachable)
    for other in (["NVDA", "aapl"], ["NVDA", " AAPL"], ["BRK B"], ["ﬁ"], ["ß"]):
        assert not as_sent(other), other
    assert PortfolioRiskParams._upper(book) is book
    assert PortfolioRiskParams._upper({"NVDA": 0.5, "BRK.B": 0.25}) == {"NVDA": 0.5, "BRK.B": 0.25}
    mixed = {"nvda": 0.5, " NVDA": 0.25, "AAPL\t": 0.125, "ﬁ": 1.0}
    assert PortfolioRiskParams._upper(mixed) == {"NVDA": 0.75, "AAPL": 0.125, "FI": 1.0}
    with pytest.raises(ValueError, match="is not a ticker"):
        PortfolioRiskParams._upper({"NVDA": 0.5, "  ": 0.5})

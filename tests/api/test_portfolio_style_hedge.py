"""`POST /api/portfolio/risk` with `style_neutral: true` on the demo snapshot: the answer without it
is unchanged; the demo holds none of the factor ETFs, so the style hedge has no legs and equals
the plain hedge; with demo stocks standing in for the ETFs, their loadings equal statsmodels OLS
of their stored specific returns on the stored style returns, and the volatility after equals a
dense sqrt(w' Sigma w) of the day's model with those loadings."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import statsmodels.api as sm
from fastapi.testclient import TestClient

from eqrisk.api.app import create_app
from eqrisk.api.risk_answers import risk_session
from eqrisk.model.style_hedge import LOADING_WINDOW, tradable_etfs, with_loadings
from eqrisk.settings import Settings
from eqrisk.snapshot.risk_days import risk_day
from eqrisk.snapshot.style_hedge import etf_loadings, style_neutral
from eqrisk.snapshot.style_series import style_returns
from eqrisk.snapshot.versions import Snapshot
from helpers import TEST_KEY

AUTH = {"Authorization": f"Bearer {TEST_KEY}"}
BOOK = {"NVDA": 0.3, "AAPL": 0.25, "MSFT": 0.2, "CRVR": 0.15, "DST": -0.1}


@pytest.fixture(scope="module")
def client(demo_settings: Settings) -> TestClient:
    return TestClient(create_app(demo_settings))


def _post(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    resp = client.post("/api/portfolio/risk", json=body, headers=AUTH)
    assert resp.status_code == 200, resp.text
    doc: dict[str, Any] = resp.json()
    return doc


def test_without_the_etfs_the_style_hedge_is_the_plain_one(client: TestClient) -> None:
    plain = _post(client, {"positions": BOOK})
    assert "style_neutral" not in plain["hedge"]
    asked = _post(client, {"positions": BOOK, "style_neutral": True})
    assert asked["portfolio"] == plain["portfolio"]
    style = asked["hedge"].pop("style_neutral")
    assert asked["hedge"] == plain["hedge"]
    assert style["legs"] == []
    assert style["etf_legs"] == plain["hedge"]["legs"]
    assert style["vol_after_daily"] == pytest.approx(plain["hedge"]["vol_after_daily"], rel=1e-12)
    x = {f["factor"]: f["exposure"] for f in plain["portfolio"]["factors"] if f["level"] == "style"}
    assert style["style_exposure_before"] == pytest.approx(x, rel=1e-12)
    assert style["style_exposure_after"] == pytest.approx(x, rel=1e-12)


def test_stocks_standing_in_for_the_etfs(snap: Snapshot) -> None:
    t = risk_session(snap, None)
    day = risk_day(snap, t)
    stand_in = [s for s in ("AMZN", "JPM", "XOM", "GOOGL", "META") if s in day.row_of][:3]
    assert len(stand_in) == 3
    etfs = etf_loadings(snap, t, stand_in)
    assert etfs.keys == stand_in
    lo = t - LOADING_WINDOW
    g = style_returns(snap, lo, t).T
    cols = np.isfinite(g).sum(axis=1) >= 126
    for i, key in enumerate(stand_in):
        y = np.asarray(snap.array("l3_rr")[snap.row_of[key], lo:t])
        days = np.isfinite(y) & np.isfinite(g[cols]).all(axis=0)
        fit = sm.OLS(y[days], g[cols][:, days].T).fit()
        np.testing.assert_allclose(etfs.loadings[i, cols], fit.params, rtol=1e-9, atol=1e-14)
        assert etfs.r2[i] == pytest.approx(fit.rsquared, rel=1e-9)
    answer = style_neutral(snap, t, BOOK, candidates=stand_in)
    assert answer.keys == stand_in and all(np.isfinite(answer.notional))
    # The dense check: the day with the stand-ins' loadings, the book + legs + ETF legs.
    aug = with_loadings(day, tradable_etfs(day, stand_in, etfs.loadings, etfs.r2))
    book = dict(BOOK)
    for key, n in zip(answer.keys, answer.notional, strict=True):
        book[key] = book.get(key, 0.0) + n
    for key, n, ok in zip(answer.hedge.keys, answer.hedge.notional, answer.hedge.tradable,
                          strict=True):  # fmt: skip
        if ok:
            book[key] = book.get(key, 0.0) + n
    n_sym = len(aug.symbols)
    h = np.zeros((n_sym, len(aug.factor_keys)))
    for j in range(3):
        has = aug.index[:, j] >= 0
        np.add.at(h, (np.flatnonzero(has), aug.index[has, j]), aug.values[has, j])
    assert aug.style is not None
    h[:, aug.n_etf :] = aug.style
    w = np.zeros(n_sym)
    for key, v in book.items():
        w[aug.row_of[key]] += v
    x = h.T @ w
    used = np.flatnonzero(x != 0.0)
    var = x[used] @ aug.cov[np.ix_(used, used)] @ x[used] + np.sum(w**2 * aug.specific_var)
    assert answer.hedge.vol_after == pytest.approx(float(np.sqrt(var)), rel=1e-10)
    # The ETF exposure left is zero; the style exposure left is x's style part.
    np.testing.assert_allclose(x[: aug.n_etf], 0.0, atol=1e-12)
    after = dict(zip(answer.factors, answer.exposure_after, strict=True))
    for name, value in after.items():
        assert value == pytest.approx(x[aug.factor_keys.index(name)], rel=1e-10, abs=1e-14)
    plain = style_neutral(snap, t, BOOK, candidates=())
    assert answer.hedge.vol_after < plain.hedge.vol_after

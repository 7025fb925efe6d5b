"""`eqrisk bench risk` runs end to end and compares like with like: the factor path's answer
is the dense covariance's to rounding, and the sample covariance's within its estimation error.
No timing is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from eqrisk.bench import risk
from eqrisk.model.portfolio_risk import portfolio_risk


def test_the_synthetic_day_is_the_model_its_returns_come_from() -> None:
    day, returns = risk.synthetic_day(400, seed=3)
    assert returns.shape == (400, risk.HISTORY)
    assert day.usable.all()
    assert day.style is not None and day.style.shape == (400, len(risk.STYLES))
    np.testing.assert_array_equal(day.cov, day.cov.T)  # both layers
    sigma = risk.dense_sigma(day, np.arange(400))
    # H F H' in BLAS is symmetric to rounding, of the largest entries' size
    np.testing.assert_allclose(sigma, sigma.T, rtol=1e-14, atol=1e-15 * np.abs(sigma).max())
    assert np.linalg.eigvalsh(sigma)[0] > 0
    w = np.full(400, 1 / 400)
    vol, contrib = risk.dense_risk(sigma, w)
    ours = portfolio_risk(day, dict(zip(day.symbols.tolist(), w.tolist(), strict=True)))
    assert ours.portfolio.vol == pytest.approx(vol, rel=1e-12)
    assert contrib.sum() == pytest.approx(vol, rel=1e-12)
    # Returns drawn from the model: their sample covariance agrees with it up to the error of
    # 252 observations (about sqrt(2 / 252) = 9% in variance).
    sample_vol = np.sqrt(w @ np.cov(returns) @ w)
    assert sample_vol == pytest.approx(vol, rel=0.15)


def test_bench_risk_quick_json_compares_every_way() -> None:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "eqrisk.cli", "bench", "risk", "--quick", "--json"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    for n in risk.QUICK.sizes:
        assert r[f"{n}_positions"] == n
        assert r[f"{n}_vol_rel_diff_dense"] < 1e-12
        assert r[f"{n}_contribution_max_diff_dense"] < 1e-15
        assert r[f"{n}_vol_rel_diff_sample_cov"] < 0.15
        assert r[f"{n}_route_contribution_max_diff"] == 0.0
        for way in ("eqrisk", "route", "dense", "dense_given", "sample_cov"):
            assert r[f"{n}_{way}_ms"] > 0
        ratio = r[f"{n}_dense_ms"] / r[f"{n}_eqrisk_ms"]
        assert r[f"{n}_dense_over_eqrisk"] == pytest.approx(ratio, rel=0.05, abs=0.06)


def test_the_route_over_http_serves_a_synthetic_market_of_known_stocks() -> None:
    """The HTTP part at a tiny size: a synthetic market built in a temporary home, books of
    stocks the model knows (none padded), both layers in the answer, the server's CPU read."""
    r = risk.over_http((20, 100), 3, say=lambda _: None, symbols=200, sessions=400)
    assert r["universe_stocks"] >= 100
    for n in (20, 100):
        assert r[f"{n}_known"] == n
        assert r[f"{n}_etf_factors"] >= 2 and r[f"{n}_style_factors"] >= 1
        assert r[f"{n}_server_cpu_ms"] >= 0 and len(r[f"{n}_server_cpu_ms_thirds"]) == 3
        assert 0 < r[f"{n}_wall_ms"] <= r[f"{n}_wall_median_ms"]

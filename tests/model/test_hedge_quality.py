"""Issue 12, hedge quality: the realised next-day hedged variance, checked against pandas on the
published residuals, and `eqrisk evaluate --json` on the real data set."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from eqrisk.data.panel import Panel
from eqrisk.model.quality import vasicek_market_beta
from eqrisk.model.run import ModelParams, run_model
from helpers import REPO_ROOT
from model.conftest import Cli


def test_hedge_quality_is_the_trailing_variance_ratio_of_next_day_residuals(
    real_universe: tuple[Panel, pd.DataFrame],
) -> None:
    panel, master = real_universe
    keep = np.isin(panel.symbols, ["SPY", "XLK", "SMH", "NVDA", "AAPL"])
    fields = {
        k: v[keep] for k, v in panel.__dict__.items() if isinstance(v, np.ndarray) and v.ndim == 2
    }
    sub = Panel(**{**panel.__dict__, **fields, "symbols": panel.symbols[keep]})
    result = run_model(sub, master[master["symbol"].isin(sub.symbols)], ModelParams(252, 126))
    m = result.metrics
    row = sub.index_of()
    for symbol in ("NVDA", "AAPL"):
        i = row[symbol]
        for level in (1, 2, 3):
            r = pd.Series(m["return"][i])
            # The residual of day t with the hedge of day t-1, written out here from the hedge
            # ratios and the ETF returns (not the model's lk_rr).
            hr = {1: ["l1_mkt_hr"], 2: ["l2_mkt_hr", "l2_sec_hr"], 3: ["l3_mkt_hr", "l3_sec_hr"]}
            etfs = ["SPY", "XLK"]
            if symbol == "NVDA" and level == 3:
                hr[3].append("l3_sub_hr")
                etfs = ["SPY", "XLK", "SMH"]
            hedge = sum(
                pd.Series(m[h][i]).shift(1) * pd.Series(m["return"][row[e]])
                for h, e in zip(hr[level], etfs, strict=False)
            )
            rr = r - hedge
            joint = r.notna() & rr.notna()
            v_e = rr.where(joint).rolling(252, min_periods=126).var()
            v_r = r.where(joint).rolling(252, min_periods=126).var()
            expected = (v_e / v_r).to_numpy()
            got = m[f"l{level}_hq"][i]
            ok = np.isfinite(expected)
            assert ok.sum() > 3000
            np.testing.assert_allclose(got[ok], expected[ok], rtol=1e-9, atol=1e-12)
            assert np.isnan(got[~ok]).all()
        # Hedging with more ETFs removes more of the next day's variance, on average.
        assert np.nanmean(m["l1_hq"][i]) > np.nanmean(m["l2_hq"][i])


def test_evaluate_reports_the_per_level_hedge_quality_of_the_real_data(real_cli: Cli) -> None:
    proc = real_cli("evaluate", "--json", "--no-risk")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    names = [e["estimator"] for e in report["estimators"]]
    assert names == ["equal", "vasicek_l1", "ewma_63", "ewma_126"]
    equal = report["estimators"][0]["levels"]["with_subsector"]
    assert equal["l1"]["stocks"] > 150
    # The figures for stocks with a subsector ETF: L1 0.665, L2 0.559, L3 0.464.
    for level, figure in (("l1", 0.665), ("l2", 0.559), ("l3", 0.464)):
        assert equal[level]["median"] == pytest.approx(figure, abs=0.03), level
    assert equal["l1"]["median"] > equal["l2"]["median"] > equal["l3"]["median"]
    for item in report["estimators"]:
        assert item["levels"]["with_sector"]["l1"]["stocks"] > 400
    # Shrinking market betas toward the sector mean: L1 only, a figure of the same order.
    vasicek = report["estimators"][1]["levels"]["with_subsector"]
    assert set(vasicek) == {"l1"}
    assert vasicek["l1"]["median"] == pytest.approx(equal["l1"]["median"], abs=0.03)
    # docs/decisions/model.md quotes what evaluate prints, to the third decimal (issue 39).
    ewma = report["estimators"][2]["levels"]["with_subsector"]
    printed = [equal[k]["median"] for k in ("l1", "l2", "l3")]
    printed += [equal[k]["pooled"] for k in ("l1", "l2", "l3")]
    printed += [ewma[k]["median"] for k in ("l1", "l2", "l3")]
    printed += [vasicek["l1"]["median"], vasicek["l1"]["pooled"]]
    doc = " ".join((REPO_ROOT / "docs" / "decisions" / "model.md").read_text().split())
    quoted = re.search(
        r"medians are L1 ([\d.]+), L2 ([\d.]+), L3 ([\d.]+) \(pooled ([\d.]+), ([\d.]+), "
        r"([\d.]+)\); EWMA 63 gives ([\d.]+), ([\d.]+), ([\d.]+):.*?leaves the median at "
        r"([\d.]+) \(pooled ([\d.]+)\)",
        doc,
    )
    assert quoted is not None
    assert [float(x) for x in quoted.groups()] == [round(x, 3) for x in printed], " ".join(
        f"{x:.3f}" for x in printed
    )


def test_vasicek_shrinkage_by_hand() -> None:
    # One session, a group of three stocks and one stock outside any group.
    beta = np.array([[0.8], [1.0], [1.6], [2.0]])
    er = np.array([[0.5], [0.4], [0.2], [0.3]])
    n = np.full((4, 1), 102.0)
    got = vasicek_market_beta(beta, er, n, np.array([0, 0, 0, -1]))
    b = beta[:3, 0]
    s2 = b**2 * (1 - er[:3, 0]) / (100 * er[:3, 0])
    mean = b.mean()
    tau2 = np.var(b, ddof=1) - s2.mean()
    expected = (tau2 * b + s2 * mean) / (tau2 + s2)
    np.testing.assert_allclose(got[:3, 0], expected, rtol=1e-14)
    assert got[3, 0] == 2.0  # no group: unchanged
    # The noisier estimate (low R²) moves most toward the mean.
    moves = np.abs(got[:3, 0] - b) / np.abs(mean - b)
    assert moves[2] > moves[1] and moves[2] > moves[0]

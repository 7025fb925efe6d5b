"""The model's published values on the demo build equal the answer keys in tests/resources
(statsmodels on the seeded demo market, made once by make_answer_keys.py): the equality tests
that need no ../shared/data, so they run on any clone."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from eqrisk.build.pipeline import build_snapshot
from eqrisk.model.run import ModelParams
from eqrisk.snapshot.versions import Snapshot, SnapshotStore
from helpers import REPO_ROOT

RESOURCES = REPO_ROOT / "tests" / "resources"
TOLERANCE = 1e-8
OLS_FIELDS = [
    "l1_mkt_hr", "l1_mkt_er", "l1_res_er",
    "l2_mkt_hr", "l2_sec_hr", "l2_res_er",
    "l3_mkt_hr", "l3_sec_hr", "l3_sub_hr", "l3_res_er",
]  # fmt: skip
HEDGE_FIELDS = ["l3_mkt_hr", "l3_sec_hr", "l3_sub_hr"]


def answer_key(name: str) -> pd.DataFrame:
    return pd.read_csv(RESOURCES / name, dtype={"symbol": str, "date": str})


@pytest.fixture(scope="module")
def demo_snapshot(demo_home: Path) -> Snapshot:
    """The demo home's published snapshot (window 252, min_obs 126, equal weights)."""
    return SnapshotStore(demo_home).current()


@pytest.fixture(scope="module")
def ewma_snapshot(demo_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Snapshot:
    """The same ingested demo data built and published with EWMA weights (halflife 60)."""
    home = tmp_path_factory.mktemp("ewma-home")
    shutil.copytree(demo_home / "ingested", home / "ingested")
    build_snapshot(home, ModelParams(252, 126, 60.0))
    return SnapshotStore(home).current()


def published(snap: Snapshot, key: pd.DataFrame, fields: list[str]) -> pd.DataFrame:
    """The snapshot's values of `fields` (and n_obs) at the key's stock x session cells."""
    sessions = {str(day)[:10]: t for t, day in enumerate(snap.sessions)}
    rows = [snap.row_of[symbol] for symbol in key["symbol"]]
    cols = [sessions[day] for day in key["date"]]
    got = {name: snap.array(name)[rows, cols] for name in ["n_obs", *fields]}
    return pd.DataFrame(got, index=key.index)


def assert_matches(got: pd.DataFrame, key: pd.DataFrame, fields: list[str]) -> None:
    """Equal within TOLERANCE where the key has a value; unpublished (NaN) where it has none."""
    np.testing.assert_array_equal(got["n_obs"].to_numpy(), key["n_obs"].to_numpy())
    for name in fields:
        expected, actual = key[name].to_numpy(float), got[name].to_numpy(float)
        labels = list(zip(key["symbol"], key["date"], strict=True))
        np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected), err_msg=name)
        np.testing.assert_allclose(
            actual, expected, rtol=0, atol=TOLERANCE, err_msg=f"{name} at {labels}"
        )


def test_the_answer_keys_cover_every_level_early_mid_and_late() -> None:
    ols, ewma = answer_key("demo_ols.csv"), answer_key("demo_ewma.csv")
    assert len(ols) == 21 and len(ewma) == 18
    assert set(ols["n_obs"]) == {126, 252}  # a first published window and full windows
    assert ols[OLS_FIELDS[:6]].notna().all().all()
    assert ols["l3_sub_hr"].isna().sum() == 3  # AAPL has no subsector ETF: l3 repeats l2
    assert ewma[HEDGE_FIELDS].notna().all().all()


def test_ols_hedge_ratios_and_risk_shares_equal_the_answer_key(demo_snapshot: Snapshot) -> None:
    key = answer_key("demo_ols.csv")
    assert_matches(published(demo_snapshot, key, OLS_FIELDS), key, OLS_FIELDS)


def test_ewma_hedge_ratios_equal_weighted_least_squares(ewma_snapshot: Snapshot) -> None:
    assert ewma_snapshot.manifest["method"]["halflife"] == 60.0
    key = answer_key("demo_ewma.csv")
    assert_matches(published(ewma_snapshot, key, HEDGE_FIELDS), key, HEDGE_FIELDS)


def test_nothing_is_published_the_session_before_the_first_full_count(
    demo_snapshot: Snapshot,
) -> None:
    """The key's first row per stock is the first session with min_obs joint returns."""
    key = answer_key("demo_ols.csv").groupby("symbol", sort=False).head(1)
    sessions = [str(day)[:10] for day in demo_snapshot.sessions]
    for symbol, day in zip(key["symbol"], key["date"], strict=True):
        t = sessions.index(day)
        row = demo_snapshot.row_of[symbol]
        assert np.isnan(demo_snapshot.array("l1_mkt_hr")[row, t - 1]), symbol
        assert np.isfinite(demo_snapshot.array("l1_mkt_hr")[row, t]), symbol

"""Fixtures of the model tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest

from eqrisk.data.panel import Panel
from helpers import shared_file
from model.risk_case import Case, make_case

Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="session")
def risk_case(real_universe: tuple[Panel, pd.DataFrame]) -> Case:
    """The risk model of a real-data slice (model/risk_case.py)."""
    return make_case(*real_universe)


@pytest.fixture(scope="session")
def real_cli(tmp_path_factory: pytest.TempPathFactory) -> Cli:
    """`eqrisk <args>` in a child process over a home with the real data set ingested (once),
    output captured, tables as wide as they need."""
    prices = shared_file("adjclose_wide_2010_2026.csv.gz")
    master = shared_file("gics_constituents.csv")
    env = {**os.environ, "EQRISK_HOME": str(tmp_path_factory.mktemp("real-home")), "COLUMNS": "200"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "eqrisk.cli", *args]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)

    ingest = run("ingest", str(prices), "--master", str(master), "--json")
    assert ingest.returncode == 0, ingest.stderr
    return run


@pytest.fixture(scope="session")
def cascade_panel() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stocks with every level count (none, market, +sector, +subsector), late listings,
    halts, missing factor days, a sector ETF and a subsector ETF that list late (sessions 200
    and 130: their stocks' lower levels start after the market level), and a subsector ETF
    collinear with its sector."""
    rng = np.random.default_rng(9)
    n, n_t = 40, 400
    m = rng.standard_t(4, n_t) * 0.01
    sec = 0.8 * m + rng.normal(0, 0.006, (3, n_t))
    sub = 0.4 * m + 0.5 * sec[[0, 1, 2, 0]] + rng.normal(0, 0.007, (4, n_t))
    sub[3] = sec[0]  # collinear: the "subsector" is the sector
    factors = np.vstack([m, sec, sub])
    factors[2, 150:155] = np.nan  # a sector ETF with missing days
    factors[3, :200] = np.nan  # a sector ETF listed late
    factors[5, :130] = np.nan  # a subsector ETF listed late
    fidx = np.full((n, 3), -1, dtype=np.int64)
    fidx[:, 0] = 0
    fidx[:, 1] = 1 + rng.integers(0, 3, n)
    fidx[:, 2] = 4 + rng.integers(0, 4, n)
    fidx[0] = -1  # no market: nothing published
    fidx[1:4, 1:] = -1  # market only
    fidx[4:8, 2] = -1  # market and sector
    fidx[8:10, 1:] = [1, 7]  # a subsector collinear with its sector
    returns = 0.9 * m + rng.normal(0, 0.012, (n, n_t))
    returns[10:13, :90] = np.nan  # listed late
    returns[13:16, 200:215] = np.nan  # halted
    returns[16, ::7] = np.nan  # sparse gaps
    return returns, factors, fidx

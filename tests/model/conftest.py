"""Fixtures of the model tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

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

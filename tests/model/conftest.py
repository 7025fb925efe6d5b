"""Fixtures of the model tests."""

from __future__ import annotations

import pandas as pd
import pytest

from eqrisk.data.panel import Panel
from model.risk_case import Case, make_case


@pytest.fixture(scope="session")
def risk_case(real_universe: tuple[Panel, pd.DataFrame]) -> Case:
    """The risk model of a real-data slice (model/risk_case.py)."""
    return make_case(*real_universe)

"""Fixtures of the API tests: a private home with the demo snapshot and its accounts."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from eqrisk.accounts.book import Accounts
from eqrisk.accounts.db import make_engine


@pytest.fixture()
def home(demo_home: Path, tmp_path: Path) -> Path:
    """A private home with the demo snapshot (accounts start empty)."""
    target = tmp_path / "home"
    shutil.copytree(demo_home / "snapshots", target / "snapshots")
    return target


@pytest.fixture()
def accounts(home: Path) -> Accounts:
    return Accounts(make_engine(home))

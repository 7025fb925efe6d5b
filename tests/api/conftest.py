"""Fixtures of the API tests: a private home with the demo snapshot and its accounts."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from eqrisk.accounts.book import Accounts
from eqrisk.accounts.db import make_engine
from eqrisk.snapshot.versions import Snapshot


@pytest.fixture()
def home(demo_home: Path, tmp_path: Path) -> Path:
    """A private home with the demo snapshot (accounts start empty)."""
    target = tmp_path / "home"
    shutil.copytree(demo_home / "snapshots", target / "snapshots")
    return target


@pytest.fixture()
def accounts(home: Path) -> Accounts:
    return Accounts(make_engine(home))


@pytest.fixture(scope="module")
def snap(client: TestClient) -> Snapshot:
    """The snapshot the module's `client` serves (its latest version)."""
    from eqrisk.api.deps import snapshot_at

    return snapshot_at(client.app.state, None)  # type: ignore[attr-defined]

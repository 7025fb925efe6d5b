"""Fixtures of the API tests: a private home with the demo snapshot and its accounts."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


@pytest.fixture(scope="module")
def stripe_base() -> Iterator[str]:
    """localstripe (a local server speaking Stripe's API) on a free port, for one module."""
    pytest.importorskip("stripe")
    from stripe_local import local_stripe

    with local_stripe() as base:
        yield base


@pytest.fixture()
def sdk(stripe_base: str) -> Any:
    """The official Stripe SDK, pointed at localstripe (Stripe's side of the tests)."""
    import stripe

    from stripe_local import SECRET_KEY

    return stripe.StripeClient(SECRET_KEY, base_addresses={"api": stripe_base})

"""Shared fixtures: the real data of ../shared/data, loaded once per session."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from eqrisk.data.master import Mappings, classify
from eqrisk.data.store import Panel, to_panel

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def shared_file(name: str) -> Path:
    path = SHARED_DATA / name
    if not path.exists():
        pytest.skip(f"real data file {path} is not available")
    return path


@pytest.fixture(scope="session")
def real_universe() -> tuple[Panel, pd.DataFrame]:
    """The full adjusted-close file (574 symbols, 2010-2026) with the GICS master, classified."""
    wide = pd.read_csv(shared_file("adjclose_wide_2010_2026.csv.gz"))
    long = wide.melt(id_vars="date", var_name="symbol", value_name="close").dropna()
    gics = pd.read_csv(shared_file("gics_constituents.csv"))
    master = pd.DataFrame(
        {
            "symbol": gics["Symbol"],
            "name": gics["Security"],
            "asset_type": "stock",
            "gics_sector": gics["GICS Sector"],
            "gics_sub_industry": gics["GICS Sub-Industry"],
        }
    )
    etfs = pd.DataFrame({"symbol": sorted(set(long["symbol"]) - set(master["symbol"]))})
    master = pd.concat([master, etfs], ignore_index=True)
    master = master[master["symbol"].isin(set(long["symbol"]))]
    return to_panel(long), classify(master, Mappings.load())


PG_ADMIN = os.environ.get("EQRISK_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@pytest.fixture(scope="session")
def pg_database_url() -> Iterator[str]:
    """A fresh database on the machine's real PostgreSQL for this test session, dropped after."""
    from sqlalchemy import create_engine, text

    name = f"eqrisk_test_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {name}"))
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"PostgreSQL is not reachable at {PG_ADMIN}: {exc}")
    yield PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))
    admin.dispose()


def nan_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Exact equality where NaN equals NaN."""
    return bool(np.array_equal(a, b, equal_nan=True))


@pytest.fixture(scope="session")
def demo_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home with the demo market ingested and built once (the README's path, in-process)."""
    from eqrisk.data.demo import DATA_SOURCE, generate_demo, write_demo_files
    from eqrisk.data.ingest import ingest
    from eqrisk.model.risk import ModelParams
    from eqrisk.snapshot.build import build_snapshot

    home = tmp_path_factory.mktemp("demo-home")
    files = write_demo_files(generate_demo(), home / "demo")
    report = ingest([files["prices"]], files["master"], home=home, data_source=DATA_SOURCE)
    assert report.ok, report.to_dict()
    build_snapshot(home, ModelParams())
    return home


TEST_KEY = "test-key-1-not-secret"


def register_key(home: Path, key: str = TEST_KEY, *, rate_limit: str = "1000000/minute") -> str:
    """A verified, well-funded account in `home`'s accounts database, with `key` imported as
    its key; returns the account id. Tests call the real gate with it."""
    from eqrisk.accounts.db import make_engine
    from eqrisk.accounts.service import Accounts

    accounts = Accounts(make_engine(home))
    account_id = accounts.create_account("tests")["account_id"]
    accounts.verify_card(account_id, provider="tests")
    accounts.credit(account_id, 10**12, "test credit")
    accounts.create_key(account_id, key=key, rate_limit=rate_limit)
    return account_id


@pytest.fixture(scope="session")
def demo_settings(demo_home: Path):
    from eqrisk.settings import Settings

    register_key(demo_home)
    return Settings(home=demo_home, _env_file=None)

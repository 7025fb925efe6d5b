"""Session fixtures: the real data of ../shared/data and the demo home, each made once per
session (helpers shared by several modules live in helpers.py)."""

from __future__ import annotations

import fcntl
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from eqrisk.data.master import Mappings, classify
from eqrisk.data.panel import Panel, to_panel
from helpers import TEST_KEY, gics_master, register_key, shared_file

TESTS = Path(__file__).parent


def _group(path: Path) -> str:
    """The worker group of a test module (pyproject runs the suite on two pytest-xdist workers,
    `--dist loadgroup`): its folder under tests/, so each folder runs in one process as a
    developer runs it; the modules that talk to the machine's one Redis share a group, since
    the counts they read (a key's or an address's limit) are shared state across processes."""
    text = path.read_text(encoding="utf-8")
    if "REDIS_URL" in text or "127.0.0.1:6379" in text:
        return "redis"
    rel = path.relative_to(TESTS)
    return rel.parts[0] if len(rel.parts) > 1 else "top"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    groups: dict[Path, str] = {}
    for item in items:
        path = Path(item.path)
        if path not in groups:
            groups[path] = _group(path)
        item.add_marker(pytest.mark.xdist_group(groups[path]))


@pytest.fixture(scope="session", autouse=True)
def _serving_kernels_compiled() -> None:
    """The kernels `eqrisk serve` compiles at startup (`api.app.create_app`'s warm-ups), in
    numba's on-disk cache before any test starts a server. On a fresh checkout the cache is
    empty: every server started at once would compile them for itself (about 20 s of CPU each),
    and several starting together on a 2-core machine (the PgBouncer tests start four workers,
    the MCP tests a server beside them) outlast their health check. One process compiles under
    a lock, the others then load the cache (a second or two)."""
    from eqrisk.api import records, writers
    from eqrisk.snapshot import row_kernel

    with open(Path(tempfile.gettempdir()) / "eqrisk-tests-kernels.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            writers.warm_up()
            records.warm_up()
            row_kernel.warm_up()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def real_universe() -> tuple[Panel, pd.DataFrame]:
    """The full adjusted-close file (574 symbols, 2010-2026) with the GICS master, classified."""
    wide = pd.read_csv(shared_file("adjclose_wide_2010_2026.csv.gz"))
    long = wide.melt(id_vars="date", var_name="symbol", value_name="close").dropna()
    master = gics_master(pd.read_csv(shared_file("gics_constituents.csv")))
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


@pytest.fixture(scope="session")
def demo_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home with the demo market ingested and built once (the README's path, in-process)."""
    from eqrisk.build.demo import build_demo

    home = tmp_path_factory.mktemp("demo-home")
    build_demo(home)
    return home


@pytest.fixture(scope="session")
def demo_settings(demo_home: Path):
    from eqrisk.settings import Settings

    register_key(demo_home, TEST_KEY)
    return Settings(home=demo_home, _env_file=None)


# ------------------------------------------------------------------------------ Stripe


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

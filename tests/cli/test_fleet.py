"""Issue 10, many servers and one version: `eqrisk serve` processes with homes of their own on
one shared snapshot store, accounts on the real PostgreSQL and limits on the real Redis. Builds
and rollbacks made anywhere switch every server without a restart; a key, its rate limit and
its balance are the same whichever server answers.

The market is small (12 symbols x 374 sessions, windows of 60 and 40) so builds take seconds;
every command runs as a real process, as an operator runs it.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from eqrisk.accounts.book import STARTING_CREDIT_TOKENS, Accounts
from eqrisk.accounts.db import make_engine
from eqrisk.accounts.pricing import DEFAULT_PRICES
from eqrisk.settings import Settings
from eqrisk.snapshot.versions import (
    SnapshotStore,
    current_version,
    list_versions,
    set_current,
    snapshots_dir,
)
from helpers import REDIS_URL, Server, bearer, eqrisk_cli, new_key, small_market_home


def eqrisk(home: Path, store: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """One CLI command on a host whose home is `home` and whose snapshot store is `store`."""
    return eqrisk_cli(home, *args, EQRISK_SNAPSHOTS=str(store))


@pytest.fixture()
def builder(tmp_path: Path) -> Path:
    """The build host's home, with a small market ingested (its snapshots go elsewhere)."""
    return small_market_home(tmp_path, seed=10)


def built_version(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    return str(json.loads(proc.stdout)["model_version"])


def versions_served(servers: list[Server], key: str) -> set[str]:
    return {
        httpx.get(f"{s.base}/api/metrics/S01", headers=bearer(key), timeout=30).headers[
            "x-model-version"
        ]
        for s in servers
    }


def test_servers_on_one_store_switch_together_and_share_keys_limits_and_balances(
    builder: Path, tmp_path: Path, pg_database_url: str
) -> None:
    redis = pytest.importorskip("redis")
    try:
        redis.Redis.from_url(REDIS_URL).ping()
    except redis.RedisError as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"Redis is not reachable at {REDIS_URL}: {exc}")
    mount = tmp_path / "mnt"  # what every host mounts; the store is its `snapshots` folder
    store = mount / "snapshots"
    first = built_version(
        eqrisk(builder, store, "build", "--json", "--window", "60", "--min-obs", "30")
    )
    # The build host wrote to the shared store, nothing under its own home.
    assert not (builder / "snapshots").exists()
    assert (store / first / "manifest.json").is_file() and (store / ".build.lock").is_file()

    homes = [tmp_path / "host-1", tmp_path / "host-2"]
    for home in homes:
        home.mkdir()
    accounts = Accounts(make_engine(homes[0], pg_database_url))
    account_id, limited = new_key(accounts, rate_limit="5/minute")
    reader = accounts.create_key(account_id, rate_limit="1000/minute")["key"]
    env = {
        "EQRISK_SNAPSHOTS": str(store),
        "EQRISK_DATABASE_URL": pg_database_url,
        "EQRISK_REDIS_URL": REDIS_URL,
    }
    with Server(homes[0], **env) as one, Server(homes[1], **env) as two:
        servers = [one, two]
        assert versions_served(servers, reader) == {first}

        # A new build on the build host: both servers answer it, without a restart.
        second = built_version(
            eqrisk(builder, store, "build", "--json", "--window", "40", "--min-obs", "20")
        )
        assert second != first and list_versions(mount) == [first, second]
        assert versions_served(servers, reader) == {second}
        # A rollback from one server host's shell: both answer the old version again.
        proc = eqrisk(homes[1], store, "snapshots", "use", first.split("-")[0], "--json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout) == {"current": first, "previous": second}
        assert versions_served(servers, reader) == {first}
        assert [s.proc.poll() for s in servers] == [None, None]  # the same processes all along

        # One key (made in PostgreSQL) on both servers; its 5 a minute are counted in Redis.
        statuses, remaining = [], []
        for n in range(6):
            resp = httpx.get(
                f"{servers[n % 2].base}/api/metrics/S02", headers=bearer(limited), timeout=30
            )
            statuses.append(resp.status_code)
            remaining.append(resp.headers.get("x-ratelimit-remaining"))
        assert statuses == [200] * 5 + [429]
        assert remaining[:5] == ["4", "3", "2", "1", "0"]
        # The fifth call (on server one) charged; server two shows the same balance.
        spent = 5 * DEFAULT_PRICES["metrics"].tokens
        doc = httpx.get(f"{two.base}/api/balance", headers=bearer(reader), timeout=30).json()
        # Three calls per version check above went through the reader key, each charged too.
        reads = 3 * 2 * DEFAULT_PRICES["metrics"].tokens
        assert doc["balance_tokens"] == STARTING_CREDIT_TOKENS - spent - reads
        assert doc["balance_tokens"] == accounts.balance(account_id)
    for home in homes:  # the server hosts kept no snapshot of their own
        assert not (home / "snapshots").exists()


def test_the_store_setting_names_where_versions_live(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert Settings(home=home, _env_file=None).snapshots_dir == home / "snapshots"
    shared = tmp_path / "mnt" / "store"
    assert Settings(home=home, snapshots=shared, _env_file=None).snapshots_dir == shared
    # A home that is not the configured one keeps its versions under itself.
    assert snapshots_dir(home) == home / "snapshots"
    assert list_versions(home) == [] and current_version(home) is None
    proc = eqrisk(home, shared, "config", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["snapshots"] == str(shared)


def test_a_pointer_check_interval_bounds_how_often_servers_look(
    builder: Path, tmp_path: Path
) -> None:
    """With `snapshot_check_ms`, a server looks at CURRENT at most that often: a switch shows
    within the interval, not on the next request."""
    mount = tmp_path / "mnt"
    store = mount / "snapshots"
    first = built_version(
        eqrisk(builder, store, "build", "--json", "--window", "60", "--min-obs", "30")
    )
    second = built_version(
        eqrisk(builder, store, "build", "--json", "--window", "40", "--min-obs", "20")
    )
    home = tmp_path / "server-home"
    every = SnapshotStore(home, root=store)
    slow = SnapshotStore(home, root=store, check_ms=60_000)
    quick = SnapshotStore(home, root=store, check_ms=1)
    assert {s.current().version for s in (every, slow, quick)} == {second}
    set_current(mount, first)
    time.sleep(0.01)
    assert every.current().version == first
    assert quick.current().version == first
    assert slow.current().version == second  # looks again within the minute, not now

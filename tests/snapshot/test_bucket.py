"""Issue 37, snapshots on object storage: versions published to a local server speaking the S3
API (moto's, a child process), servers whose local caches start empty, a publish killed with
SIGKILL, ten daily versions pruned, `snapshots verify --bucket`.

The market is small (12 symbols x 380 sessions, a window of 60) so that ten builds take
seconds; every server and CLI command runs as a real process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest

from eqrisk.bench.s3 import LocalS3, local_s3
from eqrisk.build.pipeline import build_snapshot
from eqrisk.data.calendar import sessions_between
from eqrisk.data.ingest import ingest
from eqrisk.model.run import ModelParams
from eqrisk.snapshot.bucket import Bucket, BucketError, manifest_files
from eqrisk.snapshot.cache import Follower, pull
from eqrisk.snapshot.store import VersionStore
from helpers import TEST_KEY, Server, bearer, register_key

pytest.importorskip("obstore")
pytest.importorskip("moto")

SYMBOLS = ["SPY", "XLK"] + [f"S{i:02d}" for i in range(10)]
DAYS = 10  # daily versions
PARAMS = ModelParams(60, 30, None)


@pytest.fixture(scope="module")
def s3() -> Iterator[LocalS3]:
    with local_s3() as server:
        yield server


@pytest.fixture(scope="module")
def daily(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A build host's home and store holding ten daily versions (the first full, then one
    session a day, incremental)."""
    root = tmp_path_factory.mktemp("bucket-market")
    sessions = sessions_between(pd.Timestamp("2023-01-03"), pd.Timestamp("2024-07-15"))
    rng = np.random.default_rng(37)
    steps = rng.normal(0.0, 0.01, (len(sessions), len(SYMBOLS)))
    close = pd.DataFrame(100 * np.exp(np.cumsum(steps, axis=0)), index=sessions, columns=SYMBOLS)
    close.index.name = "date"
    master = pd.DataFrame({"symbol": SYMBOLS[2:], "asset_type": "stock"})
    master["gics_sector"] = "Information Technology"
    master["gics_sub_industry"] = "Application Software"
    master.to_csv(root / "master.csv", index=False)
    home = root / "builder"
    store = VersionStore(root / "store")
    close.iloc[: -(DAYS - 1)].to_csv(root / "base.csv")
    assert ingest([root / "base.csv"], root / "master.csv", home=home).ok
    names = [build_snapshot(home, PARAMS, keep=50, store=store)["model_version"]]
    for day in range(DAYS - 1, 0, -1):
        one = root / f"day-{day}.csv"
        close.iloc[len(close) - day : len(close) - day + 1].to_csv(one)
        assert ingest([one], None, home=home, merge=True).ok
        manifest = build_snapshot(home, PARAMS, keep=50, store=store)
        assert manifest["build"]["mode"] == "incremental", manifest["build"]
        names.append(manifest["model_version"])
    assert store.versions() == names
    return {"home": home, "store": store, "versions": names, "root": root}


def eqrisk(home: Path, store: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("EQRISK_")}
    return subprocess.run(
        [sys.executable, "-m", "eqrisk.cli", *args],
        env={**clean, "EQRISK_HOME": str(home), "EQRISK_SNAPSHOTS": str(store), **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def files_of(store: VersionStore, version: str) -> dict[str, bytes]:
    folder = store.path(version)
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def needed_chunks(bucket: Bucket) -> set[str]:
    return {d for v in bucket.versions() for d in manifest_files(bucket.manifest(v)).values()}


def chunks_in(bucket: Bucket) -> set[str]:
    return {str(m["path"]).removeprefix("chunks/") for m in bucket._list("chunks/")}


ROUTES_B = [
    "/api/metrics/S01",
    "/api/returns?ticker=S03&years=1",
    "/api/factor-covariance",
    "/api/etf-returns?ticker=XLK",
]
ROUTES_A = ["/daily?symbols=S04,S05&start_time=2023-06-01", "/factor_list"]


def answers(base: str) -> dict[str, tuple[int, bytes]]:
    found = {}
    for route in ROUTES_B:
        resp = httpx.get(base + route, headers=bearer(TEST_KEY), timeout=60)
        found[route] = (resp.status_code, resp.content)
    for route in ROUTES_A:
        resp = httpx.get(base + route, headers={"apikey": TEST_KEY}, timeout=60)
        found[route] = (resp.status_code, resp.content)
    return found


def served_version(base: str) -> str:
    resp = httpx.get(base + "/api/metrics/S01", headers=bearer(TEST_KEY), timeout=60)
    return resp.headers["x-model-version"]


def test_servers_with_empty_caches_serve_the_bucket_byte_for_byte_as_the_mount(
    daily: dict[str, Any], s3: LocalS3, tmp_path: Path
) -> None:
    mount: VersionStore = daily["store"]
    first, second = daily["versions"][-2], daily["versions"][-1]
    env = s3.env("servers")
    # The build host publishes the day before's version: `push` makes it the bucket's CURRENT.
    proc = eqrisk(daily["home"], mount.root, "snapshots", "push", first, "--json", **env)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    # Every file uploaded once: the bucket was empty ("shared": a file repeating another).
    assert doc["current"] == first and doc["files_uploaded"] > 0
    assert doc["files_uploaded"] + doc["files_shared"] == len(files_of(mount, first)) - 1
    mount.use(first)

    homes = [tmp_path / name for name in ("ref", "host-1", "host-2")]
    for home in homes:
        home.mkdir()
        register_key(home, TEST_KEY)
    caches = [tmp_path / "cache-1", tmp_path / "cache-2"]
    follow = {**env, "EQRISK_SNAPSHOT_BUCKET_POLL_S": "0.1"}
    with (
        Server(homes[0], EQRISK_SNAPSHOTS=str(mount.root)) as ref,
        Server(homes[1], EQRISK_SNAPSHOTS=str(caches[0]), **follow) as one,
        Server(homes[2], EQRISK_SNAPSHOTS=str(caches[1]), **follow) as two,
    ):
        want = answers(ref.base)
        assert {r: status for r, (status, _) in want.items()} == dict.fromkeys(want, 200)
        assert answers(one.base) == want and answers(two.base) == want
        for cache in caches:  # each host filled its cache, which is a store like the mount
            local = VersionStore(cache)
            assert local.current() == first and files_of(local, first) == files_of(mount, first)

        # The next day: pushed and made current in the bucket; the servers follow it.
        proc = eqrisk(daily["home"], mount.root, "snapshots", "push", second, "--json", **env)
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        assert 0 < doc["files_uploaded"] < doc["files_shared"]  # a day shares most chunks
        mount.use(second)
        deadline = time.monotonic() + 60
        while {served_version(s.base) for s in (one, two)} != {second}:
            assert time.monotonic() < deadline, one.log() + two.log()
            time.sleep(0.1)
        want = answers(ref.base)
        assert answers(one.base) == want and answers(two.base) == want
        assert "now serving " + second in one.log_with("now serving " + second)
        assert [s.proc.poll() for s in (one, two)] == [None, None]
    for cache in caches:
        local = VersionStore(cache)
        assert local.versions() == [first, second]
        # The unchanged chunks of the two days are one file (hard links), as in a build's store.
        a, b = local.path(first), local.path(second)
        shared = [
            rel
            for rel in files_of(local, first)
            if (b / rel).exists() and (a / rel).stat().st_ino == (b / rel).stat().st_ino
        ]
        assert len(shared) >= doc["files_shared"] - 1


def test_a_publish_killed_half_way_leaves_no_visible_version(
    daily: dict[str, Any], s3: LocalS3, tmp_path: Path
) -> None:
    store: VersionStore = daily["store"]
    first, second = daily["versions"][:2]
    bucket = Bucket(s3.url("killed"), endpoint=s3.endpoint)
    bucket.push(store, first)
    bucket.set_current(first)
    before = chunks_in(bucket)
    # A publisher killed (SIGKILL) after its first upload of the next version.
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from eqrisk.snapshot.bucket import Bucket\n"
        "from eqrisk.snapshot.store import VersionStore\n"
        "def stop(line):\n"
        "    print(line, flush=True)\n"
        "    time.sleep(600)\n"
        f"Bucket({bucket.url!r}, endpoint={s3.endpoint!r}).push(\n"
        f"    VersionStore(Path({str(store.root)!r})), {second!r}, progress=stop)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("uploaded "), line
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()

    orphans = chunks_in(bucket) - before
    assert len(orphans) == 1  # uploaded, named by no manifest
    assert bucket.versions() == [first] and bucket.current() == first
    cache = VersionStore(tmp_path / "cache")
    pulled = Follower(bucket, cache, every_s=1, keep=2).sync()
    assert pulled is not None and pulled.version == first and cache.versions() == [first]
    assert bucket.verify().ok
    # Pruning removes the orphan (grace 0 here); the publish run again completes.
    assert bucket.prune(5, grace_s=0) == ([], 1)
    assert chunks_in(bucket) == before
    done = bucket.push(store, second)
    bucket.set_current(second)
    assert bucket.versions() == [first, second] and done.uploaded >= 1
    assert pull(bucket, cache).version == second
    assert files_of(cache, second) == files_of(store, second)


def test_prune_after_ten_daily_versions_keeps_every_chunk_a_kept_version_uses(
    daily: dict[str, Any], s3: LocalS3, tmp_path: Path
) -> None:
    store: VersionStore = daily["store"]
    names: list[str] = daily["versions"]
    bucket = Bucket(s3.url("daily"), endpoint=s3.endpoint)
    pinned = names[1]
    bucket.set_pinned([pinned])
    uploaded = []
    for i, name in enumerate(names):
        pushed = bucket.push(store, name)
        bucket.set_current(name)
        uploaded.append(pushed.uploaded)
        bucket.prune(3, grace_s=0)
        upto = names[: i + 1]
        assert bucket.versions() == [v for v in upto if v == pinned or v in upto[-3:]]
        # Every chunk a kept version names is there, and nothing else is.
        assert chunks_in(bucket) == needed_chunks(bucket)
    assert bucket.versions() == [pinned, *names[-3:]]
    total = len(manifest_files(bucket.manifest(names[-1])))
    assert uploaded[0] > 0 and max(uploaded[1:]) < total / 2  # a day uploads few chunks

    # Each kept version, pulled into an empty cache, is the build host's, byte for byte.
    cache = VersionStore(tmp_path / "cache")
    for name in bucket.versions():
        pull(bucket, cache, name, make_current=False)
        assert files_of(cache, name) == files_of(store, name)
        cache.open(name)  # opens as a version
    assert cache.verify().ok

    # `snapshots verify --bucket` reads every chunk; a damaged one is named with its versions.
    env = s3.env("daily")
    home = tmp_path / "verifier"
    home.mkdir()
    proc = eqrisk(home, tmp_path / "none", "snapshots", "verify", "--bucket", "--json", **env)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] and doc["versions"] == bucket.versions()
    assert doc["files_checked"] == len(needed_chunks(bucket))
    files = manifest_files(bucket.manifest(names[-1]))
    rel, digest = next((r, d) for r, d in sorted(files.items()) if r.endswith(".npy"))
    bucket._put(bucket.chunk_key(digest), b"damaged")
    proc = eqrisk(home, tmp_path / "none", "snapshots", "verify", "--bucket", "--json", **env)
    assert proc.returncode == 1, proc.stderr
    damaged = json.loads(proc.stdout)["damaged"]
    users = [v for v in bucket.versions() if digest in manifest_files(bucket.manifest(v)).values()]
    assert len(damaged) == 1 and damaged[0]["versions"] == users and rel in damaged[0]["files"]
    # A pull of a version using it refuses the chunk and leaves nothing half there.
    fresh = VersionStore(tmp_path / "fresh")
    with pytest.raises(BucketError, match="does not match its checksum"):
        pull(bucket, fresh, names[-1])
    assert fresh.versions() == [] and not list(fresh.root.glob(".building-*"))

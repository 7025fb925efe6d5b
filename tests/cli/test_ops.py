"""Operable (issue 8): no command loses data unless told to, versions can be rolled back and
pinned, and an unusable environment is one line with its exit code, never a traceback.

The data are a small seeded market (12 symbols x 374 sessions, window 60) so that builds take
seconds; the commands run as real processes, as an operator runs them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

from eqrisk.api.app import create_app
from eqrisk.build.pipeline import build_snapshot
from eqrisk.build.universe import UniverseShrank
from eqrisk.data.calendar import sessions_between
from eqrisk.data.ingest import ingest
from eqrisk.data.ingest_report import IngestRefused
from eqrisk.data.ingested import ingested_dir, read_ingested
from eqrisk.model.run import ModelParams
from eqrisk.settings import Settings
from eqrisk.snapshot.versions import (
    CURRENT,
    Snapshot,
    SnapshotError,
    SnapshotStore,
    current_version,
    list_versions,
    pinned_versions,
    set_current,
    snapshots_dir,
)
from helpers import TEST_KEY, free_port, register_key, without_progress

PARAMS = ModelParams(window=60, min_obs=30)
SYMBOLS = ["SPY", "XLK"] + [f"S{i:02d}" for i in range(10)]
ENV_PROBLEM = 3


def run(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "EQRISK_HOME": str(home), **env}
    for name in ("EQRISK_DATABASE_URL", "EQRISK_REDIS_URL"):
        if name not in env:
            full_env.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "eqrisk.cli", *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a failed command (no traceback, nothing else but the stage
    lines of what it did before, `without_progress`)."""
    text = without_progress(proc.stderr).strip()
    assert "Traceback" not in text, text
    assert text.count("\n") == 0, text
    assert text.startswith("error: "), text
    return text


def digest(folder: Path) -> str:
    """Names and bytes of every file under `folder`."""
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            h.update(str(path.relative_to(folder)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A wide price file (12 symbols x 374 sessions), its master, and smaller files."""
    folder = tmp_path_factory.mktemp("ops-files")
    sessions = sessions_between(pd.Timestamp("2023-01-03"), pd.Timestamp("2024-06-28"))
    rng = np.random.default_rng(8)
    steps = rng.normal(0.0, 0.01, (len(sessions), len(SYMBOLS)))
    close = pd.DataFrame(100 * np.exp(np.cumsum(steps, axis=0)), index=sessions, columns=SYMBOLS)
    close.index.name = "date"
    out = {"wide": folder / "wide.csv", "master": folder / "master.csv"}
    close.to_csv(out["wide"])
    # Two symbols over the last 100 sessions: the "wrong file" that shrinks everything.
    out["small"] = folder / "small.csv"
    close.iloc[-100:, :2].to_csv(out["small"])
    # A long file whose rows are mostly rejected (7 of 10 prices are not numbers).
    out["garbled"] = folder / "garbled.csv"
    lines = ["date,symbol,close"]
    for k, day in enumerate(sessions[:10]):
        price = "12.5" if k < 3 else "n/a"
        lines.append(f"{day.date()},S00,{price}")
    out["garbled"].write_text("\n".join(lines) + "\n")
    pd.DataFrame(
        {
            "symbol": SYMBOLS[2:],
            "name": SYMBOLS[2:],
            "asset_type": "stock",
            "gics_sector": "Information Technology",
            "gics_sub_industry": "Application Software",
        }
    ).to_csv(out["master"], index=False)
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, files: dict[str, Path]) -> Path:
    """A home with the wide file ingested and two versions built (v1 window 60, v2 window 40)."""
    home = tmp_path_factory.mktemp("ops-home")
    report = ingest([files["wide"]], files["master"], home=home)
    assert report.ok, report.to_dict()
    build_snapshot(home, PARAMS)
    build_snapshot(home, ModelParams(window=40, min_obs=20))
    return home


@pytest.fixture()
def home(built: Path, tmp_path: Path) -> Path:
    target = tmp_path / "home"
    shutil.copytree(built, target)
    return target


# --------------------------------------------------------------------------- data safety


def test_ingest_refuses_a_much_smaller_data_set_and_replace_overrides(
    home: Path, files: dict[str, Path]
) -> None:
    before = digest(ingested_dir(home))
    proc = run(home, "ingest", str(files["small"]))
    assert proc.returncode == 1
    line = one_line_error(proc)
    assert "refused to replace the ingested data set (12 symbols x 374 sessions)" in line
    assert "2 symbols against 12 and 100 sessions against 374" in line
    assert "--replace" in line and "nothing changed" in line
    assert digest(ingested_dir(home)) == before

    proc = run(home, "ingest", str(files["small"]), "--replace", "--json")
    assert proc.returncode == 0, proc.stderr
    prices, _, _ = read_ingested(home)
    assert sorted(prices["symbol"].unique()) == ["SPY", "XLK"]
    assert prices["date"].nunique() == 100


def test_ingest_refuses_mostly_rejected_rows_but_merge_adds(
    home: Path, files: dict[str, Path]
) -> None:
    before = digest(ingested_dir(home))
    with pytest.raises(IngestRefused, match=r"70% of the rows were rejected \(7 of 10"):
        ingest([files["garbled"]], None, home=home)
    assert digest(ingested_dir(home)) == before
    # A fresh home is protected the same way: nothing is ingested.
    fresh = home.parent / "fresh"
    proc = run(fresh, "ingest", str(files["garbled"]))
    assert proc.returncode == 1
    assert "rejected.csv" in one_line_error(proc)
    assert not ingested_dir(fresh).exists()
    # --merge is all or nothing too; with --skip-bad-rows it adds the good rows.
    with pytest.raises(IngestRefused, match=r"7 of 10 rows rejected"):
        ingest([files["garbled"]], None, home=home, merge=True)
    assert digest(ingested_dir(home)) == before
    report = ingest([files["garbled"]], None, home=home, merge=True, skip_bad_rows=True)
    assert report.rows_kept == 3 and report.symbols == 12
    # --replace --skip-bad-rows keeps the good rows of the file and nothing else.
    proc = run(fresh, "ingest", str(files["garbled"]), "--replace", "--json", "--skip-bad-rows")
    assert proc.returncode == 0, proc.stderr  # the good rows taken, as asked
    prices, _, _ = read_ingested(fresh)
    assert prices["close"].tolist() == [12.5, 12.5, 12.5]


def test_demo_refuses_to_replace_another_data_set(home: Path) -> None:
    before_data = digest(ingested_dir(home))
    before_snaps = digest(snapshots_dir(home))
    proc = run(home, "demo", "--no-serve")
    assert proc.returncode == 1
    line = one_line_error(proc)
    assert "an ingested data set from 'wide'" in line
    assert "a current snapshot v2-" in line
    assert "EQRISK_HOME=/tmp/eqrisk-demo eqrisk demo" in line
    assert digest(ingested_dir(home)) == before_data
    assert digest(snapshots_dir(home)) == before_snaps


def test_demo_goes_ahead_over_its_own_data(demo_home: Path, tmp_path: Path) -> None:
    from eqrisk.cli.demo import _demo_may_write
    from eqrisk.data.demo import DATA_SOURCE

    _demo_may_write(demo_home, DATA_SOURCE)  # its own data set and snapshot: no refusal
    _demo_may_write(tmp_path / "empty", DATA_SOURCE)  # nothing there: no refusal


def test_build_refuses_a_sharp_shrink_and_force_publishes(
    home: Path, files: dict[str, Path]
) -> None:
    ingest([files["small"]], None, home=home, replace=True)
    versions = list_versions(home)
    pointer = (snapshots_dir(home) / CURRENT).read_bytes()
    proc = run(home, "build", "--window", "60", "--min-obs", "30")
    assert proc.returncode == 1
    line = one_line_error(proc)
    assert "refused to publish 2 symbols x 100 sessions" in line
    assert f"over the current snapshot {versions[-1]} (12 x 374)" in line
    assert "--force" in line
    assert (snapshots_dir(home) / CURRENT).read_bytes() == pointer
    assert list_versions(home) == versions
    with pytest.raises(UniverseShrank):
        build_snapshot(home, PARAMS)

    proc = run(home, "build", "--window", "60", "--min-obs", "30", "--force", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["universe_size"] == 2 and summary["sessions"] == 100
    assert current_version(home) == summary["model_version"]


# --------------------------------------------------------------------------- versions


def test_snapshots_use_is_served_without_restart(home: Path) -> None:
    v1, v2 = list_versions(home)
    register_key(home)
    client = TestClient(create_app(Settings(home=home, _env_file=None)))
    auth = {"Authorization": f"Bearer {TEST_KEY}"}
    url = "/api/ticker-returns?ticker=S03&years=1"
    assert client.get("/api/health").json()["model_version"] == v2
    assert client.get(url, headers=auth).json()["_metadata"]["method"]["window"] == 40

    proc = run(home, "snapshots", "use", "v1", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"current": v1, "previous": v2}
    assert client.get("/api/health").json()["model_version"] == v1
    doc = client.get(url, headers=auth).json()
    assert doc["_metadata"]["model_version"] == v1
    assert doc["_metadata"]["method"]["window"] == 60

    listing = json.loads(run(home, "snapshots", "--json").stdout)
    assert listing["current"] == v1
    assert [(v["model_version"], v["current"]) for v in listing["versions"]] == [
        (v1, True),
        (v2, False),
    ]
    unknown = run(home, "snapshots", "use", "v9")
    assert unknown.returncode == 2
    assert "kept: " + v1 in one_line_error(unknown)


def test_a_pinned_version_survives_pruning(home: Path) -> None:
    v1, v2 = list_versions(home)
    proc = run(home, "snapshots", "pin", "v1", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"pinned": [v1]}
    third = build_snapshot(home, PARAMS, keep=1)["model_version"]
    fourth = build_snapshot(home, PARAMS, keep=1)["model_version"]
    assert list_versions(home) == [v1, fourth]  # v2 and the third pruned, v1 pinned
    assert v2 != third
    listing = json.loads(run(home, "snapshots", "--json").stdout)
    assert [(v["model_version"], v["pinned"]) for v in listing["versions"]] == [
        (v1, True),
        (fourth, False),
    ]
    proc = run(home, "snapshots", "unpin", v1)
    assert proc.returncode == 0, proc.stderr
    assert pinned_versions(home) == []
    fifth = build_snapshot(home, PARAMS, keep=1)["model_version"]
    assert list_versions(home) == [fifth]


def test_pruning_never_removes_the_version_made_current_by_use(home: Path) -> None:
    from eqrisk.snapshot.versions import _prune, use_version

    v1, v2 = list_versions(home)
    use_version(home, "1")
    assert _prune(home, keep=1) == []  # v1 is current, v2 is the newest
    assert list_versions(home) == [v1, v2]


def test_a_killed_dask_builds_staging_folder_is_removed_a_running_ones_kept(home: Path) -> None:
    """A Dask build's workers write into a staging folder of the store; a build killed midway
    leaves it behind. The next build removes it, but never the staging folder of a build that
    is still running (its owner holds the folder's lock)."""
    from eqrisk.snapshot.versions import STAGING_LOCK, snapshots_dir, staging_folder

    root = snapshots_dir(home)
    dead = root / ".staging-killed"
    (dead / "arrays").mkdir(parents=True)
    (dead / STAGING_LOCK).touch()  # its owner is gone: nobody holds the lock
    (dead / "arrays" / "debris.npy").write_bytes(b"x" * 1000)
    with staging_folder(root) as live:
        (live / "arrays").mkdir()
        build_snapshot(home, PARAMS, keep=3)
        assert not dead.exists()
        assert (live / "arrays").is_dir()  # a running build's folder survives
    assert not live.exists()  # and its owner removes it when it ends


def test_use_waits_for_a_build_that_holds_the_lock(home: Path) -> None:
    """`snapshots use` takes the build lock: while a build publishes (holds it), the switch
    waits, and it lands after the build, so the operator's choice is what is served."""
    import threading

    from eqrisk.snapshot.versions import (
        _build_lock,
        current_version,
        snapshots_dir,
        use_version,
    )

    v1, v2 = list_versions(home)
    done = threading.Event()
    with _build_lock(snapshots_dir(home)):
        worker = threading.Thread(target=lambda: (use_version(home, "1"), done.set()))
        worker.start()
        assert not done.wait(0.5)  # blocked on the lock
        assert current_version(home) == v2
    worker.join(timeout=30)
    assert done.is_set() and current_version(home) == v1


# --------------------------------------------------------------------------- damaged versions


def _truncate(path: Path) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size // 2)


def _a_chunk(folder: Path) -> Path:
    """The last chunk of the float64 fields (versions share chunks by hard link: truncating one
    damages every version that links it, as a disk fault would)."""
    files = (folder / "arrays" / "_rows").glob("*.npy")
    return sorted(f for f in files if not f.name.endswith(".runs.npy"))[-1]


def test_a_damaged_version_is_refused_when_opened(home: Path) -> None:
    v1, _ = list_versions(home)
    folder = snapshots_dir(home) / v1
    _truncate(_a_chunk(folder))
    with pytest.raises(SnapshotError, match=r"arrays/_rows/\d+\.\d+\.npy holds \d+ bytes"):
        Snapshot.open(folder)
    (folder / "factors.npy").unlink()
    with pytest.raises(SnapshotError, match=r"factors\.npy is missing"):
        Snapshot.open(folder)
    (folder / "manifest.json").write_text("{not json")
    with pytest.raises(SnapshotError, match=r"manifest\.json is corrupt"):
        Snapshot.open(folder)


def test_a_damaged_current_version_keeps_the_last_good_one_served(
    home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    v1, v2 = list_versions(home)
    client = TestClient(create_app(Settings(home=home, _env_file=None)))
    assert client.get("/api/health").json()["model_version"] == v2
    _truncate(_a_chunk(snapshots_dir(home) / v1))
    set_current(home, v1)  # as a careless copy would: the pointer names a damaged version
    with caplog.at_level(logging.ERROR, logger="eqrisk.snapshot"):
        answers = [client.get("/api/health") for _ in range(3)]
    assert [(r.status_code, r.json()["model_version"]) for r in answers] == [(200, v2)] * 3
    logged = [r.getMessage() for r in caplog.records if r.name == "eqrisk.snapshot"]
    assert len(logged) == 1 and f"still serving {v2}" in logged[0]

    # A server that starts on it has no good version yet: 503, with the way out.
    fresh = TestClient(create_app(Settings(home=home, _env_file=None)))
    resp = fresh.get("/api/health")
    assert resp.status_code == 503
    body = resp.json()
    assert body["error"] == "SERVICE_UNAVAILABLE"
    assert "arrays/_rows/" in body["detail"] and "eqrisk snapshots use" in body["detail"]
    # A metered route too (the gate prices it from the snapshot): 503, never a 500.
    register_key(home)
    metered = fresh.get(
        "/api/ticker-returns?ticker=S03&years=1", headers={"Authorization": f"Bearer {TEST_KEY}"}
    )
    assert metered.status_code == 503 and metered.json()["error"] == "SERVICE_UNAVAILABLE"
    # The operator cannot make it current again, and `serve` will not start on it.
    proc = run(home, "snapshots", "use", v1)
    assert proc.returncode == ENV_PROBLEM
    assert "is damaged" in one_line_error(proc) and "choose another version" in proc.stderr
    proc = run(home, "serve", "--port", str(free_port()))
    assert proc.returncode == ENV_PROBLEM and "is damaged" in one_line_error(proc)
    # Rolling forward repairs it without a restart.
    set_current(home, v2)
    assert fresh.get("/api/health").json()["model_version"] == v2
    assert SnapshotStore(home).current().version == v2


# --------------------------------------------------------------------------- operator errors


def test_serve_checks_the_port_before_its_banner(home: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run(home, "serve", "--port", str(port))
    assert proc.returncode == ENV_PROBLEM
    line = one_line_error(proc)
    assert f"cannot listen on 127.0.0.1:{port}" in line and "--port" in line


def test_unreachable_postgresql_and_redis_are_one_line(home: Path) -> None:
    port = free_port()
    proc = run(
        home,
        "serve",
        "--port",
        str(port),
        EQRISK_DATABASE_URL=f"postgresql://postgres@127.0.0.1:{free_port()}/test",
    )
    assert proc.returncode == ENV_PROBLEM
    line = one_line_error(proc)
    assert "the accounts database (postgresql://postgres@127.0.0.1:" in line
    assert "Connection refused" in line and "EQRISK_DATABASE_URL" in line
    proc = run(home, "accounts", "list", EQRISK_DATABASE_URL=f"postgresql://127.0.0.1:{port}/x")
    assert proc.returncode == ENV_PROBLEM and "not usable" in one_line_error(proc)

    proc = run(home, "serve", "--port", str(port), EQRISK_REDIS_URL=f"redis://127.0.0.1:{port}/0")
    assert proc.returncode == ENV_PROBLEM
    assert "Redis at EQRISK_REDIS_URL is not reachable" in one_line_error(proc)


def test_missing_home_and_a_file_as_home(tmp_path: Path, files: dict[str, Path]) -> None:
    missing = tmp_path / "no-such-home"
    proc = run(missing, "serve", "--port", str(free_port()))
    assert proc.returncode == ENV_PROBLEM
    assert f"EQRISK_HOME {missing} does not exist" in one_line_error(proc)
    assert not missing.exists()

    as_file = tmp_path / "a-file"
    as_file.write_text("not a directory")
    for args in (("ingest", str(files["wide"])), ("build",), ("serve",), ("accounts", "list")):
        proc = run(as_file, *args)
        assert proc.returncode == ENV_PROBLEM, (args, proc.stderr)
        line = one_line_error(proc)
        assert f"{as_file}" in line and "EQRISK_HOME" in line, (args, line)


def _in_namespace(setup: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`eqrisk ARGS` in a private mount namespace prepared by the shell commands `setup`
    (mounts vanish with the process; nothing is left on the machine)."""
    cli = " ".join([sys.executable, "-m", "eqrisk.cli", *args])
    env = {**os.environ, "EQRISK_HOME": str(home)}
    env.pop("EQRISK_DATABASE_URL", None)
    env.pop("EQRISK_REDIS_URL", None)
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", f"{setup} && exec {cli}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _namespaces_work(tmp_path: Path) -> bool:
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=16k tmpfs {tmp_path}"],
        capture_output=True,
    )
    return probe.returncode == 0


@pytest.fixture()
def namespaces(tmp_path: Path) -> None:
    if shutil.which("unshare") is None or not _namespaces_work(tmp_path):
        pytest.skip("needs root and mount namespaces (unshare -m) to mount read-only or tmpfs")


def test_read_only_home_is_one_line(namespaces: None, home: Path, files: dict[str, Path]) -> None:
    # Tests run as root, which chmod does not stop: a read-only bind mount of the home does.
    ro = f"mount --bind {home} {home} && mount -o remount,ro,bind {home}"
    before = digest(home)
    for args in (
        ("serve", "--port", str(free_port())),
        ("ingest", str(files["wide"]), "--master", str(files["master"])),
        ("build",),
        ("snapshots", "use", "v1"),
    ):
        proc = _in_namespace(ro, home, *args)
        assert proc.returncode == ENV_PROBLEM, (args, proc.stderr)
        line = one_line_error(proc)
        assert "the file system is read-only" in line and "EQRISK_HOME" in line, (args, line)
    assert digest(home) == before


def test_full_disk_is_one_line(namespaces: None, tmp_path: Path, files: dict[str, Path]) -> None:
    # A 64 KiB tmpfs: the ingested prices (about 48 KiB) and the report do not both fit.
    home = tmp_path / "disk" / "home"
    home.parent.mkdir()
    full = f"mount -t tmpfs -o size=64k tmpfs {home.parent}"
    proc = _in_namespace(full, home, "ingest", str(files["wide"]), "--master", str(files["master"]))
    assert proc.returncode == ENV_PROBLEM, proc.stderr
    line = one_line_error(proc)
    assert "no space left writing" in line and "No space left on device" in line


def test_full_disk_during_a_build_is_one_line_and_leaves_nothing_half_written(
    namespaces: None, built: Path, tmp_path: Path
) -> None:
    # The ingested data (about 52 KiB) fit in 256 KiB; the snapshot's arrays (about 1.4 MiB) do
    # not. After the failure the same shell lists what the build left behind.
    home = tmp_path / "disk" / "home"
    home.parent.mkdir()
    setup = (
        f"mount -t tmpfs -o size=256k tmpfs {home.parent} && mkdir {home} "
        f"&& cp -r {ingested_dir(built)} {home}/ingested"
    )
    cli = " ".join(
        [sys.executable, "-m", "eqrisk.cli", "build", "--window", "60", "--min-obs", "30"]
    )
    env = {**os.environ, "EQRISK_HOME": str(home)}
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"{setup} && {cli}; echo rc=$? >&2; ls -A {home}/snapshots"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    error, status = without_progress(proc.stderr).strip().splitlines()
    assert "Traceback" not in proc.stderr
    assert error.startswith("error: no space left writing") and "EQRISK_HOME" in error
    assert status == f"rc={ENV_PROBLEM}"
    assert proc.stdout.split() == [".build.lock"]  # no version, no CURRENT, no .building-*

"""`kill -9` of `eqrisk build` at seeded random points across the build (reading and model,
writing arrays, writing the history table, fsync and rename): the served version stays current,
byte-identical and answering, and the next build succeeds and removes the debris."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from conftest import TEST_KEY, register_key
from eqrisk.api.app import create_app
from eqrisk.settings import Settings
from eqrisk.snapshot.versions import current_version, list_versions, snapshots_dir

pytestmark = pytest.mark.reliability

SEED = int(os.environ.get("EQRISK_RELIABILITY_SEED", "20261123"))
TIMED_KILLS = 4  # one per equal slice of the first 90% of a build's duration
ANCHORED_KILLS = ("arrays", "rename")  # the short phases: first arrays written, fsync + rename


def _build(home: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        # --force: the same data every time, published anyway (else: "nothing new").
        [sys.executable, "-m", "eqrisk.cli", "build", "--force"],
        env={**os.environ, "EQRISK_HOME": str(home)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _phase(home: Path, before: set[str], old: str) -> str:
    """Where the build was, read from what it has written so far."""
    root = snapshots_dir(home)
    if current_version(home) != old:
        return "current switched"
    if set(list_versions(home)) - before:
        return "renamed"
    building = [p for p in root.glob(".building-*") if p.is_dir()]
    if not building:
        return "reading+model"
    folder = max(building, key=lambda p: p.stat().st_mtime)
    if (folder / "manifest.json").exists():
        return "fsync+rename"
    if (folder / "security_history").exists():
        return "history"
    if (folder / "symbols.parquet").exists() or (folder / "factors.npy").exists():
        return "symbols"
    return "arrays"


def _wait_for(predicate, proc: subprocess.Popen[bytes], timeout: float = 120) -> bool:
    """Poll `predicate` every millisecond until it holds (True) or the build ends (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.001)
    raise AssertionError("the build neither reached the point nor ended")


def _serves(home: Path, version: str) -> None:
    client = TestClient(create_app(Settings(home=home, _env_file=None)))
    health = client.get("/api/health")
    assert health.status_code == 200 and health.json()["model_version"] == version, health.text
    data = client.get("/api/metrics/NVDA", headers={"Authorization": f"Bearer {TEST_KEY}"})
    assert data.status_code == 200, data.text
    assert data.json()["_metadata"]["model_version"] == version


def test_killed_builds_leave_the_served_version_intact(served_home: Path, figures) -> None:
    home = served_home
    register_key(home)
    rng = random.Random(SEED)
    root = snapshots_dir(home)

    # A reference build: its duration places the timed kills, its version is the served one.
    started = time.monotonic()
    reference = _build(home)
    assert reference.wait(timeout=300) == 0, reference.stderr.read().decode()  # type: ignore[union-attr]
    duration = time.monotonic() - started

    phases: Counter[str] = Counter()
    completed = 0
    points = [
        ("timed", (i + rng.random()) / TIMED_KILLS * 0.9 * duration) for i in range(TIMED_KILLS)
    ]
    points += [(anchor, rng.uniform(0, 0.05)) for anchor in ANCHORED_KILLS]
    for kind, delay in points:
        old = current_version(home)
        assert old is not None
        hashes = _digest(snapshots_dir(home) / old)
        before = set(list_versions(home))
        proc = _build(home)
        if kind == "timed":
            until = time.monotonic() + delay
            while time.monotonic() < until and proc.poll() is None:
                time.sleep(0.002)
        else:
            marker = {"arrays": "arrays/*/*.npy", "rename": "manifest.json"}[kind]
            _wait_for(lambda m=marker: any(root.glob(f".building-*/{m}")), proc)
            time.sleep(delay)
        reached = proc.poll() is None
        if reached:
            phase = _phase(home, before, old)
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        if not reached:  # the build finished first: the new version is current and complete
            assert proc.returncode == 0, proc.stderr.read().decode()  # type: ignore[union-attr]
            completed += 1
            phases["completed"] += 1
            new = current_version(home)
            assert new != old and new in list_versions(home)
            _serves(home, new)
            continue
        assert proc.returncode == -signal.SIGKILL
        phases[phase] += 1
        if phase == "current switched":  # killed after publishing: the new version is whole
            new = current_version(home)
            assert (root / new / "manifest.json").exists()
            _serves(home, new)
            continue
        assert current_version(home) == old
        assert _digest(root / old) == hashes, f"version {old} changed after a kill at {phase}"
        _serves(home, old)

    debris = sorted(p.name for p in snapshots_dir(home).glob(".building-*"))
    final = _build(home)
    assert final.wait(timeout=300) == 0, final.stderr.read().decode()  # type: ignore[union-attr]
    left = sorted(
        p.name
        for p in snapshots_dir(home).iterdir()
        if p.name.startswith((".building-", ".current-"))
    )
    assert left == [], left
    newest = current_version(home)
    assert newest == list_versions(home)[-1]
    _serves(home, newest)
    assert len(list_versions(home)) <= 3

    figures(
        seed=SEED,
        build_s=round(duration, 1),
        kill_points=len(points),
        killed=len(points) - completed,
        phases=dict(sorted(phases.items())),
        debris_before_final_build=len(debris),
        debris_after=len(left),
    )

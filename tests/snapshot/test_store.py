"""The snapshot store (issue 25, part 6): its files follow the umask (servers and workers of
other users read them), and `eqrisk snapshots verify` checks every byte against the checksums
recorded at write time, naming a damaged file shared by hard links with every version."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import xxhash

from eqrisk.bench.incremental import _cut, synthetic_market
from eqrisk.build.pipeline import publish_panel
from eqrisk.model.run import ModelParams
from eqrisk.snapshot.store import VersionStore

PARAMS = ModelParams(window=60, min_obs=30)


def _two_versions(root: Path, mask: int) -> VersionStore:
    """A full build over 299 sessions, then an incremental one over 300, under `mask`."""
    panel, master = synthetic_market(24, 300, seed=11)
    store = VersionStore(root)
    old = os.umask(mask)
    try:
        publish_panel(store, _cut(panel, 299), master, PARAMS, full=True)
        publish_panel(store, panel, master, PARAMS)
    finally:
        os.umask(old)
    return store


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VersionStore]:
    yield _two_versions(tmp_path_factory.mktemp("store") / "snapshots", 0o022)


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.lstat().st_mode) for p in root.rglob("*")}


def test_under_umask_022_every_file_is_readable_by_others(shared: VersionStore) -> None:
    modes = _modes(shared.root)
    versions = shared.versions()
    assert len(versions) == 2
    files = [rel for rel in modes if (shared.root / rel).is_file()]
    assert "CURRENT" in files and any(rel.endswith("manifest.json") for rel in files)
    assert sum(rel.startswith(versions[1]) for rel in files) > 10
    for rel, mode in modes.items():
        if (shared.root / rel).is_dir():
            assert mode == 0o755, (rel, oct(mode))
        else:
            assert mode == 0o644, (rel, oct(mode))


def test_the_store_follows_a_private_umask_too(tmp_path: Path) -> None:
    store = _two_versions(tmp_path / "snapshots", 0o027)
    for rel, mode in _modes(store.root).items():
        if rel.startswith(".build.lock"):
            continue
        expected = 0o750 if (store.root / rel).is_dir() else 0o640
        assert mode == expected, (rel, oct(mode))


def test_the_manifest_records_each_files_checksum(shared: VersionStore) -> None:
    for version in shared.versions():
        folder = shared.path(version)
        recorded = json.loads((folder / "manifest.json").read_text())["checksums"]
        assert recorded["algorithm"] == "xxh3-128"
        on_disk = sorted(
            str(p.relative_to(folder))
            for p in folder.rglob("*")
            if p.is_file() and p.name != "manifest.json"
        )
        assert sorted(recorded["files"]) == on_disk
        for rel, digest in recorded["files"].items():
            assert xxhash.xxh3_128((folder / rel).read_bytes()).hexdigest() == digest, rel


def _verify(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EQRISK_")}
    (root.parent / "home").mkdir(exist_ok=True)  # snapshots commands need an existing home
    return subprocess.run(
        [sys.executable, "-m", "eqrisk.cli", "snapshots", "verify", *args],
        env={**env, "EQRISK_HOME": str(root.parent / "home"), "EQRISK_SNAPSHOTS": str(root)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_verify_names_a_damaged_shared_file_with_every_version(tmp_path: Path) -> None:
    store = _two_versions(tmp_path / "snapshots", 0o022)
    first, second = store.versions()
    report = store.verify()
    assert report.ok and report.versions == [first, second] and not report.unrecorded
    paths = [p for v in (first, second) for p in store.path(v).rglob("*") if p.is_file()]
    distinct = {(p.stat().st_dev, p.stat().st_ino) for p in paths if p.name != "manifest.json"}
    # Shared files are hashed once: the count is of distinct files, not of paths.
    assert report.files == len(distinct) < len(paths) - 2
    ok = _verify(store.root)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "all intact" in ok.stdout

    shared = sorted(p for p in store.path(first).glob("arrays/**/*.npy") if p.stat().st_nlink >= 2)[
        0
    ]
    rel = str(shared.relative_to(store.path(first)))
    assert (store.path(second) / rel).samefile(shared)
    data = bytearray(shared.read_bytes())
    data[len(data) // 2] ^= 0x01
    shared.write_bytes(bytes(data))  # in place: the inode both versions link

    proc = _verify(store.root, "--json")
    assert proc.returncode == 1
    found = json.loads(proc.stdout)
    assert found["ok"] is False
    assert found["damaged"] == [
        {
            "files": [rel],
            "problem": "does not match its checksum (xxh3-128)",
            "versions": [first, second],
        }
    ]
    text = _verify(store.root)
    assert text.returncode == 1
    assert f"damaged: {rel}" in text.stdout and f"{first}, {second}" in text.stdout


def test_a_version_is_named_by_its_full_name_or_its_ascii_number(shared: VersionStore) -> None:
    """`2`, `v2` and the full name resolve; digits of other scripts ('¹', '٢'), which
    str.isdigit() accepts and int() refuses, are an unknown version (a 404), never a crash
    (schemathesis sent `version=¹8` to /daily)."""
    from eqrisk.snapshot.version import UnknownVersion

    second = shared.versions()[-1]
    number = second.split("-")[0][1:]
    assert shared.resolve(number) == shared.resolve(f"v{number}") == shared.resolve(second)
    for name in ("¹8", "v¹", "٢", f"v{number}x"):
        with pytest.raises(UnknownVersion, match="kept: "):
            shared.resolve(name)


def _as_blake2b(folder: Path) -> dict[str, str]:
    """Rewrite a version's manifest as a version written before xxh3-128 records it: the
    blake2b-128 of each file (hashlib's, independent of `integrity`)."""
    manifest = json.loads((folder / "manifest.json").read_text())
    files = {
        rel: hashlib.blake2b((folder / rel).read_bytes(), digest_size=16).hexdigest()
        for rel in manifest["checksums"]["files"]
    }
    manifest["checksums"] = {"algorithm": "blake2b-128", "files": files}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return files


def test_an_old_blake2b_version_still_verifies_beside_a_new_xxh3_one(tmp_path: Path) -> None:
    """The first version records blake2b-128 (as versions before xxh3-128 did), the second,
    which shares most files with it by hard links, xxh3-128: both verify; one damaged byte in a
    shared file is found by either algorithm and named with both versions."""
    from eqrisk.snapshot import integrity

    store = _two_versions(tmp_path / "snapshots", 0o022)
    first, second = store.versions()
    old = _as_blake2b(store.path(first))
    new = json.loads((store.path(second) / "manifest.json").read_text())["checksums"]
    assert new["algorithm"] == "xxh3-128"
    common = sorted(set(old) & set(new["files"]))
    assert common and all(old[rel] != new["files"][rel] for rel in common)
    report = store.verify()
    assert report.ok and not report.unrecorded and report.versions == [first, second]
    # A shared file is hashed once per algorithm.
    inodes = {
        (v, (store.path(v) / rel).stat().st_ino)
        for v, files in ((first, old), (second, new["files"]))
        for rel in files
    }
    assert report.files == len(inodes)
    assert integrity.file_digest(store.path(first) / common[0], "blake2b-128") == old[common[0]]

    shared = next(
        store.path(first) / rel
        for rel in common
        if (store.path(first) / rel).samefile(store.path(second) / rel)
    )
    rel = str(shared.relative_to(store.path(first)))
    data = bytearray(shared.read_bytes())
    data[len(data) // 2] ^= 0x01
    shared.write_bytes(bytes(data))
    damaged = store.verify().damaged
    assert [d.describe() for d in damaged] == [
        {
            "files": [rel],
            "problem": "does not match its checksum (blake2b-128)",
            "versions": [first, second],
        }
    ]
    # The new version alone finds it by its own algorithm.
    alone = store.verify([second]).damaged
    assert [d.problem for d in alone] == ["does not match its checksum (xxh3-128)"]

"""Immutable, versioned model snapshots in the embedded store, and the atomic "current" pointer.

Layout under `<home>/snapshots/`:

    CURRENT                       name of the served version (replaced atomically)
    v3-20261121T120000Z/          one immutable version
        manifest.json             model_version, data_as_of, data_source, method, fields, ...
        sessions.npy              (T,) datetime64[D]
        arrays/<field>.npy        (n x T) float64, one per metric, memory-mapped by readers
        factors.npy               (K x T) Service A factor returns
        symbols.parquet           the spec's `symbols` table (+ row index and hierarchy)
        security_history.parquet  the spec's long table, daily and monthly periodicity
    .building-*/                  a build in progress; never read, removed when stale

A build writes a complete version folder under a temporary name, renames it into place and only
then replaces CURRENT; a build that fails or is killed leaves the served version untouched.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from eqrisk.snapshot import tables

VERSION_RE = re.compile(r"^v(\d+)-(\d{8}T\d{6}Z)$")
CURRENT = "CURRENT"


class SnapshotError(RuntimeError):
    """No usable snapshot (none built yet, or the pointer names a missing version)."""


def snapshots_dir(home: Path) -> Path:
    return home / "snapshots"


def list_versions(home: Path) -> list[str]:
    """Complete versions, oldest first."""
    root = snapshots_dir(home)
    if not root.is_dir():
        return []
    found = [p.name for p in root.iterdir() if p.is_dir() and VERSION_RE.match(p.name)]
    return sorted(found, key=lambda name: int(VERSION_RE.match(name).group(1)))  # type: ignore[union-attr]


def current_version(home: Path) -> str | None:
    try:
        name = (snapshots_dir(home) / CURRENT).read_text().strip()
    except FileNotFoundError:
        return None
    return name or None


@contextmanager
def _build_lock(root: Path) -> Iterator[None]:
    """One build at a time per home (a second waits), across processes."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".build.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _remove_stale_builds(root: Path) -> None:
    for path in root.glob(".building-*"):
        shutil.rmtree(path, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def set_current(home: Path, version: str) -> None:
    """Point CURRENT at `version` atomically (write a temp file, fsync, rename over)."""
    root = snapshots_dir(home)
    if not (root / version / "manifest.json").exists():
        raise SnapshotError(f"no complete snapshot {version!r} under {root}")
    fd, tmp = tempfile.mkstemp(prefix=".current-", dir=root)
    with os.fdopen(fd, "w") as fh:
        fh.write(version + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, root / CURRENT)
    _fsync_dir(root)


def write_snapshot(
    home: Path,
    content: tables.SnapshotContent,
    *,
    keep: int = 3,
    progress: Any = None,
) -> dict[str, Any]:
    """Write `content` as a new version, switch CURRENT to it, prune old versions.

    Returns the manifest. `keep` versions are kept (the current one always).
    """
    root = snapshots_dir(home)
    with _build_lock(root):
        _remove_stale_builds(root)
        existing = list_versions(home)
        number = 1 + max((int(VERSION_RE.match(v).group(1)) for v in existing), default=0)  # type: ignore[union-attr]
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        version = f"v{number}-{stamp}"
        tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
        try:
            manifest = tables.write_content(tmp, content, version=version, progress=progress)
            for path in tmp.rglob("*"):
                if path.is_file():
                    with open(path, "rb") as fh:
                        os.fsync(fh.fileno())
            tmp.rename(root / version)
            _fsync_dir(root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        set_current(home, version)
        for old in list_versions(home)[: max(0, len(list_versions(home)) - keep)]:
            if old != version:
                shutil.rmtree(root / old, ignore_errors=True)
    return manifest


@dataclass(frozen=True)
class Snapshot:
    """A read-only view of one version. Arrays are memory-mapped: serving N symbols holds no
    per-symbol history in Python objects."""

    path: Path
    manifest: dict[str, Any]

    @classmethod
    def open(cls, path: Path) -> Snapshot:
        try:
            manifest = json.loads((path / "manifest.json").read_text())
        except FileNotFoundError as exc:
            raise SnapshotError(f"{path} is not a complete snapshot") from exc
        return cls(path=path, manifest=manifest)

    @property
    def version(self) -> str:
        return str(self.manifest["model_version"])

    @cached_property
    def sessions(self) -> np.ndarray:
        return np.load(self.path / "sessions.npy")

    @cached_property
    def symbols(self) -> pd.DataFrame:
        """The `symbols` table indexed by ticker, with `row` (index into the arrays)."""
        frame = pq.read_table(self.path / "symbols.parquet").to_pandas()
        return frame.set_index("ticker", drop=False)

    @cached_property
    def row_of(self) -> dict[str, int]:
        return dict(zip(self.symbols["ticker"], self.symbols["row"].astype(int), strict=True))

    def array(self, field: str) -> np.ndarray:
        """The (n x T) array of one metric, memory-mapped read-only."""
        return self._arrays[field]

    @cached_property
    def _arrays(self) -> dict[str, np.ndarray]:
        return {
            name: np.load(self.path / "arrays" / f"{name}.npy", mmap_mode="r")
            for name in self.manifest["fields"]
        }

    @cached_property
    def factor_returns(self) -> np.ndarray:
        return np.load(self.path / "factors.npy", mmap_mode="r")

    @property
    def factor_names(self) -> list[str]:
        return list(self.manifest["factors"]["names"])

    def security_history(self, **filters: Any) -> pd.DataFrame:
        """The spec's long table, optionally filtered by column equality (pushed down)."""
        expr = [(k, "=", v) for k, v in filters.items()]
        table = pq.read_table(self.path / "security_history.parquet", filters=expr or None)
        return table.to_pandas()

    def metadata(self) -> dict[str, Any]:
        """The `_metadata` block every answer carries."""
        m = self.manifest
        return {
            "model_version": m["model_version"],
            "data_as_of": m["data_as_of"],
            "universe_size": m["universe_size"],
            "data_source": m["data_source"],
            "method": m["method"],
        }


class SnapshotStore:
    """Serves the current snapshot of a home, re-reading CURRENT when it changes (no restart)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self._pointer = snapshots_dir(home) / CURRENT
        self._stamp: tuple[int, int] | None = None
        self._snapshot: Snapshot | None = None

    def current(self) -> Snapshot:
        try:
            st = self._pointer.stat()
        except FileNotFoundError as exc:
            raise SnapshotError(
                f"no snapshot built under {snapshots_dir(self.home)}: run `eqrisk build` "
                "(or `eqrisk demo`)"
            ) from exc
        stamp = (st.st_mtime_ns, st.st_ino)
        if self._snapshot is None or stamp != self._stamp:
            version = current_version(self.home)
            if version is None:
                raise SnapshotError("the CURRENT pointer is empty")
            self._snapshot = Snapshot.open(snapshots_dir(self.home) / version)
            self._stamp = stamp
        return self._snapshot

"""Immutable, versioned model snapshots in the embedded store, and the atomic "current" pointer:
the names of `store` (the store object, `VersionStore`), `version` (one version, `Snapshot`)
and `served` (the served version, `ServedSnapshot`), and the functions of a home that came
before the store had its own object.

The store of a home is `<home>/snapshots/`. Nothing here reads the settings: the CLI and the
servers make the configured store (`VersionStore.from_settings`: the shared path the `snapshots`
setting names, EQRISK_SNAPSHOTS, else `<home>/snapshots`) and pass it in; every function below
takes a `VersionStore` or a home.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from eqrisk.snapshot import tables
from eqrisk.snapshot.served import ServedSnapshot, SnapshotStore
from eqrisk.snapshot.store import (
    CURRENT,
    PINNED,
    STAGING_LOCK,
    STAGING_PREFIX,
    VERSION_RE,
    Previous,
    VersionStore,
)
from eqrisk.snapshot.version import Snapshot, SnapshotError, UnknownVersion

__all__ = [
    "CURRENT",
    "PINNED",
    "STAGING_LOCK",
    "STAGING_PREFIX",
    "VERSION_RE",
    "Previous",
    "ServedSnapshot",
    "Snapshot",
    "SnapshotError",
    "SnapshotStore",
    "UnknownVersion",
    "VersionStore",
    "current_version",
    "list_versions",
    "pinned_versions",
    "resolve_version",
    "set_current",
    "set_pinned",
    "share_from",
    "snapshots_dir",
    "staging_folder",
    "store_of",
    "use_version",
    "write_snapshot",
]

Home = Path | VersionStore


def snapshots_dir(home: Path) -> Path:
    """The snapshot store of `home`: `<home>/snapshots` (the configured store, which the
    `snapshots` setting may put elsewhere, is `VersionStore.from_settings`)."""
    return home / "snapshots"


def store_of(home: Home) -> VersionStore:
    """The store of a home (see `snapshots_dir`); a store is itself."""
    if isinstance(home, VersionStore):
        return home
    return VersionStore(snapshots_dir(home))


def list_versions(home: Home) -> list[str]:
    """Complete versions, oldest first."""
    return store_of(home).versions()


def current_version(home: Home) -> str | None:
    return store_of(home).current()


@contextmanager
def _build_lock(root: Path) -> Iterator[None]:
    with VersionStore(root).lock():
        yield


@contextmanager
def staging_folder(root: Path) -> Iterator[Path]:
    """A staging folder of the store at `root` (`VersionStore.staging`)."""
    with VersionStore(root).staging() as folder:
        yield folder


def set_current(home: Home, version: str) -> None:
    store_of(home).set_current(version)


def resolve_version(home: Home, name: str) -> str:
    return store_of(home).resolve(name)


def use_version(home: Home, name: str) -> str:
    return store_of(home).use(name)


def pinned_versions(home: Home) -> list[str]:
    return store_of(home).pinned()


def set_pinned(home: Home, name: str, pinned: bool) -> str:
    return store_of(home).set_pinned(name, pinned)


def _prune(home: Home, keep: int) -> list[str]:
    return store_of(home).prune(keep)


def write_snapshot(
    home: Home,
    content: tables.SnapshotContent,
    *,
    keep: int = 3,
    progress: Any = None,
) -> dict[str, Any]:
    """Write `content` as a new version of the home's store (`VersionStore.write`)."""
    return store_of(home).write(content, keep=keep, progress=progress)


def share_from(home: Home) -> Path | None:
    """The version a new build shares chunks with (and an incremental build reuses)."""
    return store_of(home).share_from()

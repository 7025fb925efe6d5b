"""The served version: what the services read, re-read when CURRENT moves (no restart)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from eqrisk.snapshot.store import CURRENT, VersionStore
from eqrisk.snapshot.version import Snapshot, SnapshotError

log = logging.getLogger("eqrisk.snapshot")


class ServedSnapshot:
    """Serves the current snapshot of a store, re-reading CURRENT when it changes (no restart).

    When CURRENT moves to a version that is missing or damaged, the store keeps serving the
    last good version it had (and logs the problem once per pointer change); with no good
    version yet it raises SnapshotError (the services answer 503).
    """

    def __init__(
        self,
        home: Path,
        *,
        root: Path | None = None,
        check_ms: int = 0,
        store: VersionStore | None = None,
    ) -> None:
        """The store is `store`, else the one at `root`, else `<home>/snapshots`: the CLI and
        the servers pass the store the settings name (`VersionStore.from_settings`); nothing
        here reads the settings."""
        self.home = home
        if store is None:
            store = VersionStore(root if root is not None else home / "snapshots")
        self.store = store
        self.root = store.root
        self._pointer = self.root / CURRENT
        # A good version is re-checked against the pointer at most every `check_ms` (one stat;
        # 0 = on every call): a bound on the cost where a stat is a round trip (NFS, noac).
        self._check_s = check_ms / 1000.0
        self._next_check = 0.0
        self._stamp: tuple[int, int] | None = None
        self._snapshot: Snapshot | None = None
        self._bad: tuple[tuple[int, int], str] | None = None  # (pointer stamp, problem)

    def current(self) -> Snapshot:
        now = time.monotonic()
        if self._snapshot is not None and self._bad is None and now < self._next_check:
            return self._snapshot
        self._next_check = now + self._check_s
        try:
            st = self._pointer.stat()
        except FileNotFoundError as exc:
            if self._snapshot is not None:
                return self._kept((0, 0), f"{self._pointer} was removed")
            raise SnapshotError(
                f"no snapshot built under {self.root}: run `eqrisk build` (or `eqrisk demo`)"
            ) from exc
        stamp = (st.st_mtime_ns, st.st_ino)
        if self._snapshot is not None and stamp == self._stamp:
            return self._snapshot
        if self._bad is not None and self._bad[0] == stamp:
            return self._kept(stamp, self._bad[1])
        try:
            try:
                version = self._pointer.read_text().strip()
            except FileNotFoundError:
                version = ""  # replaced or removed between the stat and the read
            if not version:
                raise SnapshotError(f"the pointer {self._pointer} is empty")
            snapshot = Snapshot.open(self.root / version)
        except SnapshotError as exc:
            return self._kept(stamp, str(exc))
        self._snapshot, self._stamp, self._bad = snapshot, stamp, None
        return snapshot

    def _kept(self, stamp: tuple[int, int], problem: str) -> Snapshot:
        """The last good version while the pointer names a bad one (logged once per stamp)."""
        first = self._bad is None or self._bad[0] != stamp
        self._bad = (stamp, problem)
        if self._snapshot is None:
            raise SnapshotError(
                f"{problem}; point CURRENT at a good version with `eqrisk snapshots use VERSION` "
                "or run `eqrisk build`"
            )
        if first:
            log.error(
                "current snapshot unusable (%s); still serving %s: run `eqrisk snapshots use "
                "VERSION` or `eqrisk build`",
                problem,
                self._snapshot.version,
            )
        return self._snapshot


SnapshotStore = ServedSnapshot  # its name before the store had its own object

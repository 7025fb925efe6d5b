"""Immutable, versioned model snapshots in the embedded store, and the atomic "current" pointer.

Layout of the snapshot store, `<home>/snapshots/` or the shared path the `snapshots` setting
names (EQRISK_SNAPSHOTS: several servers with their own homes serve one store):

    CURRENT                       name of the served version (replaced atomically)
    PINNED                        versions pruning never removes, one a line (replaced atomically)
    v3-20261121T120000Z/          one immutable version
        manifest.json             model_version, data_as_of, data_source, method, fields, ...
        sessions.npy              (T,) datetime64[D]
        arrays/_rows/<b>.<c>.npy  symbol block b x time chunk c of every float64 metric (`chunks`):
                                  the runs that hold a number, and their index (<b>.<c>.runs.npy)
        arrays/<field>/<b>.<c>.npy  the same chunk of a metric stored narrower (counts: uint8)
        factors.npy               (K x T) Service A factor returns
        symbols.parquet           the spec's `symbols` table (+ row index and hierarchy)
        security_history/         the spec's long table's monthly rows (monthly-<year>.parquet);
                                  its daily rows are the arrays' (`Snapshot.security_history`)
    .building-*/                  a build in progress; never read, removed when stale

Versions share history: a chunk (array or Parquet file) equal to the one of the version served
when the build started is a hard link to it, so a new version costs disk only for what changed,
and removing a version (pruning) frees only the files no other version links. Versions written
before chunking (`arrays/<field>.npy`, one `security_history.parquet`), and chunked ones that
store the daily files too (layout `chunks-1`), are still read.

A build writes a complete version folder under a temporary name, renames it into place and only
then replaces CURRENT; a build that fails or is killed leaves the served version untouched.
Opening a version checks it cheaply (the manifest parses; every array file or chunk it lists is
there, whole, with the shape the manifest implies), so a damaged version is refused rather than
served.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from eqrisk.settings import get_settings
from eqrisk.snapshot import chunks, tables
from eqrisk.snapshot.index import SymbolIndex
from eqrisk.snapshot.risk_store import open_risk_arrays

VERSION_RE = re.compile(r"^v(\d+)-(\d{8}T\d{6}Z)$")
CURRENT = "CURRENT"
PINNED = "PINNED"
log = logging.getLogger("eqrisk.snapshot")


class SnapshotError(RuntimeError):
    """No usable snapshot (none built yet, or the pointer names a missing version)."""


class UnknownVersion(SnapshotError):
    """A version name that names no kept version."""


def snapshots_dir(home: Path) -> Path:
    """The snapshot store of `home`: the configured store (`snapshots`, EQRISK_SNAPSHOTS) when
    `home` is the configured home, else `<home>/snapshots`."""
    settings = get_settings()
    return settings.snapshots_dir if home == settings.home_dir else home / "snapshots"


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
    """One build at a time per store (a second waits), across processes and, on a mount with
    working flock (local, NFSv4), across hosts."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".build.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


STAGING_PREFIX = ".staging-"
STAGING_LOCK = ".owner.lock"


@contextmanager
def staging_folder(root: Path) -> Iterator[Path]:
    """A folder of the store where a Dask build's workers write its arrays before the version
    takes them over. Its owner holds a lock inside it for as long as it lives, so a later
    build tells a killed build's leftovers (lock free) from a running build's (held), even on
    another host; removed when the block ends, whatever happens."""
    root.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=root))
    try:
        with open(folder / STAGING_LOCK, "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _abandoned(folder: Path) -> bool:
    """True when no live build holds the staging folder's lock (its owner was killed)."""
    try:
        with open(folder / STAGING_LOCK, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fh, fcntl.LOCK_UN)
            return True
    except BlockingIOError:
        return False
    except OSError:
        return not (folder / STAGING_LOCK).exists()


def _remove_stale_builds(root: Path) -> None:
    """Debris of killed builds: unfinished version folders, pointer files never renamed, and
    the staging folders of Dask builds whose owner is gone (a running one's is left alone)."""
    for path in root.glob(".building-*"):
        shutil.rmtree(path, ignore_errors=True)
    for path in root.glob(".current-*"):
        path.unlink(missing_ok=True)
    for path in root.glob(f"{STAGING_PREFIX}*"):
        if path.is_dir() and _abandoned(path):
            shutil.rmtree(path, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomically(root: Path, name: str, text: str) -> None:
    """Replace `root/name` with `text`: readers see the old file or the new one, whole."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name.lower()}-", dir=root)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, root / name)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(root)


def set_current(home: Path, version: str) -> None:
    """Point CURRENT at `version` atomically (write a temp file, fsync, rename over)."""
    root = snapshots_dir(home)
    if not (root / version / "manifest.json").exists():
        raise SnapshotError(f"no complete snapshot {version!r} under {root}")
    _write_atomically(root, CURRENT, version + "\n")


def resolve_version(home: Path, name: str) -> str:
    """The kept version called `name`: its full name or its number (`v3` or `3`)."""
    versions = list_versions(home)
    if name in versions:
        return name
    number = name[1:] if name.startswith("v") else name
    found = [v for v in versions if number.isdigit() and v.split("-")[0] == f"v{int(number)}"]
    if len(found) == 1:
        return found[0]
    kept = ", ".join(versions) or "none"
    raise UnknownVersion(f"no snapshot version {name!r} under {snapshots_dir(home)}; kept: {kept}")


def use_version(home: Path, name: str) -> str:
    """Make the kept version `name` current after checking it opens; returns its full name.

    Under the build lock: a build that is publishing finishes first (its pruning never removes
    the version this makes current), and the build after this sees the new CURRENT."""
    with _build_lock(snapshots_dir(home)):
        version = resolve_version(home, name)
        try:
            Snapshot.open(snapshots_dir(home) / version)
        except SnapshotError as exc:
            raise SnapshotError(
                f"{exc}; it cannot be made current: choose another version (`eqrisk snapshots`) "
                "or run `eqrisk build`"
            ) from exc
        set_current(home, version)
    return version


def pinned_versions(home: Path) -> list[str]:
    """Versions pruning never removes (names listed in PINNED, kept or not)."""
    try:
        text = (snapshots_dir(home) / PINNED).read_text()
    except FileNotFoundError:
        return []
    return [line.strip() for line in text.splitlines() if line.strip()]


def set_pinned(home: Path, name: str, pinned: bool) -> str:
    """Pin or unpin the kept version `name` (under the build lock, so that a build's pruning
    sees either the old pin list or the new one); returns its full name."""
    root = snapshots_dir(home)
    with _build_lock(root):
        version = resolve_version(home, name) if pinned else _pinned_name(home, name)
        pins = [v for v in pinned_versions(home) if v != version]
        if pinned:
            pins.append(version)
        _write_atomically(root, PINNED, "".join(f"{v}\n" for v in sorted(pins)))
    return version


def _pinned_name(home: Path, name: str) -> str:
    """Unpinning accepts a pinned name even when its folder is gone."""
    return name if name in pinned_versions(home) else resolve_version(home, name)


def _prune(home: Path, keep: int) -> list[str]:
    """Remove the oldest versions beyond the `keep` newest, never a pinned or the current one."""
    root = snapshots_dir(home)
    protected = {*pinned_versions(home), current_version(home)}
    versions = list_versions(home)
    removed = [v for v in versions[: max(0, len(versions) - keep)] if v not in protected]
    for old in removed:
        shutil.rmtree(root / old, ignore_errors=True)
    return removed


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
        previous = _share_from(home)
        if content.reuse is not None and content.reuse.previous != previous:
            raise SnapshotError(
                f"another build published {previous.name if previous else 'nothing'} while this "
                f"one reused {content.reuse.previous.name}; nothing changed: run the build again"
            )
        tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
        try:
            manifest = tables.write_content(
                tmp, content, version=version, previous=previous, progress=progress
            )
            _fsync_tree(tmp)
            tmp.rename(root / version)
            _fsync_dir(root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        set_current(home, version)
        _prune(home, keep)
    return manifest


def share_from(home: Path) -> Path | None:
    """The version a new build shares chunks with (and an incremental build reuses)."""
    return _share_from(home)


def _share_from(home: Path) -> Path | None:
    """The version a new build shares chunks with: the current one, else the newest kept."""
    root = snapshots_dir(home)
    for name in (current_version(home), *reversed(list_versions(home))):
        if name and (root / name / "manifest.json").is_file():
            return root / name
    return None


def _fsync_tree(folder: Path) -> None:
    """Flush what a build wrote: new files (a hard link's data is on disk already) and every
    folder (the links and names in it)."""
    for path in folder.rglob("*"):
        if path.is_dir():
            _fsync_dir(path)
        elif path.is_file() and path.stat().st_nlink == 1:
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(folder)


@dataclass(frozen=True)
class Snapshot:
    """A read-only view of one version. Arrays are memory-mapped: serving N symbols holds no
    per-symbol history in Python objects."""

    path: Path
    manifest: dict[str, Any]

    @classmethod
    def open(cls, path: Path) -> Snapshot:
        """Open a version after a cheap check (headers and sizes, no data read): a damaged
        version raises SnapshotError here instead of failing a request later."""
        try:
            manifest = json.loads((path / "manifest.json").read_text())
        except FileNotFoundError as exc:
            raise SnapshotError(f"{path} is not a complete snapshot (no manifest.json)") from exc
        except (ValueError, UnicodeDecodeError) as exc:
            raise SnapshotError(f"{path}/manifest.json is corrupt: {exc}") from exc
        _check_files(path, manifest)
        return cls(path=path, manifest=manifest)

    @property
    def version(self) -> str:
        return str(self.manifest["model_version"])

    @cached_property
    def sessions(self) -> np.ndarray:
        sessions: np.ndarray = np.load(self.path / "sessions.npy")
        return sessions

    @cached_property
    def symbols(self) -> pd.DataFrame:
        """The `symbols` table indexed by ticker, with `row` (index into the arrays)."""
        frame = pq.read_table(self.path / "symbols.parquet").to_pandas()
        return frame.set_index("ticker", drop=False)

    @cached_property
    def row_of(self) -> dict[str, int]:
        return dict(zip(self.symbols["ticker"], self.symbols["row"].astype(int), strict=True))

    @property
    def chunked(self) -> bool:
        """Written in chunks shared between versions (else one file per array: older builds)."""
        return "arrays" in self.manifest

    def array(self, field: str) -> chunks.FieldArray:
        """The (n x T) float64 array of one metric, read-only, sliced like a dense array
        (`[row, lo:hi]`, `[:, t]`, `[rows, cols]`) over memory-mapped chunks."""
        return self._arrays[field]

    @cached_property
    def _arrays(self) -> dict[str, chunks.FieldArray]:
        if self.chunked:
            arrays = chunks.open_arrays(self.path, self.manifest["arrays"])
            return {**arrays, **open_risk_arrays(self.path, self.manifest)}
        return {
            name: np.load(self.path / "arrays" / f"{name}.npy", mmap_mode="r")
            for name in self.manifest["fields"]
        }

    @cached_property
    def factor_returns(self) -> np.ndarray:
        factors: np.ndarray = np.load(self.path / "factors.npy", mmap_mode="r")
        return factors

    @property
    def factor_names(self) -> list[str]:
        return list(self.manifest["factors"]["names"])

    @cached_property
    def index(self) -> SymbolIndex:
        """The version's lookups (tickers, sessions, factors), built on first use, kept with it."""
        return SymbolIndex(self)

    @property
    def stores_daily_history(self) -> bool:
        """Whether the long table's daily rows are files of this version (versions written
        before layout `chunks-2`); else they are generated from the arrays on read."""
        if not self.chunked:
            return True
        return any(Path(f).name.startswith("daily-") for f in self.manifest["security_history"])

    def security_history(self, **filters: Any) -> pd.DataFrame:
        """The spec's long table, optionally filtered by column equality (pushed down): the
        daily rows (generated from the arrays, or read where a version stores them), then the
        monthly rows (stored)."""
        expr: list[Any] = [(k, "=", v) for k, v in filters.items()]
        if not self.chunked:
            source = self.path / "security_history.parquet"
            return pq.read_table(source, filters=expr or None).to_pandas()
        files = [str(self.path / rel) for rel in self.manifest["security_history"]]
        parts = [] if self.stores_daily_history else [self._daily_history(filters, expr)]
        if files:
            parts.append(pq.ParquetDataset(files, filters=expr or None).read())
        if not parts:
            return tables.history_schema().empty_table().to_pandas()
        schema = tables.history_schema()
        return pa.concat_tables([part.cast(schema) for part in parts]).to_pandas()

    def _daily_history(self, filters: dict[str, Any], expr: list[Any]) -> pa.Table:
        """The daily rows of the long table from the arrays (a symbol filter reads that
        symbol's rows only), the other filters applied after."""
        names = self._symbol_names
        rows = None
        if "symbol" in filters:
            at = self.row_of.get(str(filters["symbol"]))
            rows = np.array([] if at is None else [at], dtype=np.int64)
        fields = {name: self.array(name) for name in tables.HISTORY_KEYS.values()}
        grid = chunks.ChunkGrid.of(self.manifest["arrays"]["grid"])
        found = [t for _c, t in tables.daily_tables(fields, names, self.sessions, grid, rows)]
        table = pa.concat_tables(found) if found else tables.history_schema().empty_table()
        if expr:
            table = table.filter(pq.filters_to_expression(expr))
        return table

    @cached_property
    def _symbol_names(self) -> list[str]:
        """Tickers in row order (the arrays' rows)."""
        frame = self.symbols.sort_values("row")
        return [str(t) for t in frame["ticker"]]

    def export_security_history(self, out: Path) -> list[Path]:
        """Write the spec's long table as a Parquet dataset into the folder `out` (the files a
        version held before `chunks-2`: `daily-<chunk>.parquet` from the arrays, and a copy of
        each `monthly-<year>.parquet`; an older version's files are copied as they are).
        Returns the files written."""
        out.mkdir(parents=True, exist_ok=True)
        written: list[Path] = []
        if not self.chunked:
            target = out / "security_history.parquet"
            shutil.copyfile(self.path / "security_history.parquet", target)
            return [target]
        if not self.stores_daily_history:
            fields = {name: self.array(name) for name in tables.HISTORY_KEYS.values()}
            grid = chunks.ChunkGrid.of(self.manifest["arrays"]["grid"])
            for c, table in tables.daily_tables(fields, self._symbol_names, self.sessions, grid):
                if table.num_rows:
                    target = out / tables.daily_file(c).name
                    target.write_bytes(tables.parquet_bytes(table))
                    written.append(target)
        for rel in self.manifest["security_history"]:
            target = out / Path(rel).name
            shutil.copyfile(self.path / rel, target)
            written.append(target)
        return written

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


def _npy_shape(path: Path) -> tuple[tuple[int, ...], np.dtype[Any] | None, str]:
    """(shape, dtype, problem) of a .npy file from its header and size; problem is '' when
    whole."""
    try:
        with open(path, "rb") as fh:
            major, _minor = np.lib.format.read_magic(fh)
            if major == 1:
                shape, _fortran, dtype = np.lib.format.read_array_header_1_0(fh)
            else:
                shape, _fortran, dtype = np.lib.format.read_array_header_2_0(fh)
            offset = fh.tell()
    except FileNotFoundError:
        return (), None, "is missing"
    except (ValueError, OSError) as exc:
        return (), None, f"has no valid header ({exc})"
    expected = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    size = path.stat().st_size
    if size != expected:
        return tuple(shape), dtype, f"holds {size} bytes where its header implies {expected}"
    return tuple(shape), dtype, ""


def _check_files(path: Path, manifest: dict[str, Any]) -> None:
    """Every file of a version present, whole and of the shape the manifest implies."""
    try:
        n, t = int(manifest["universe_size"]), int(manifest["sessions"])
        expected: dict[Path, tuple[tuple[int | None, ...], str | None]] = {
            Path("sessions.npy"): ((t,), None),
            Path("factors.npy"): ((len(manifest["factors"]["names"]), t), None),
        }
        if "arrays" in manifest:
            grid = chunks.ChunkGrid.of(manifest["arrays"]["grid"])
            if (grid.n, grid.t) != (n, t):
                raise ValueError(f"a chunk grid of {grid.n} x {grid.t} for {n} x {t}")
            for rel, cell, kind in chunks.expected_chunks(manifest["arrays"]):
                expected[rel] = (cell, kind)
            parquet_files = ["symbols.parquet", *manifest["security_history"]]
        else:
            expected.update(
                {Path("arrays") / f"{f}.npy": ((n, t), None) for f in manifest["fields"]}
            )
            parquet_files = ["symbols.parquet", "security_history.parquet"]
    except (KeyError, TypeError, ValueError) as exc:
        raise SnapshotError(f"{path}/manifest.json lacks {exc}: not a snapshot manifest") from exc
    for rel, (shape, code) in expected.items():
        found, dtype, problem = _npy_shape(path / rel)
        if not problem and not chunks.shape_fits(found, shape):
            problem = f"has shape {found} where the manifest implies {shape}"
        if not problem and code is not None and dtype != chunks.FILE_DTYPES.get(code):
            problem = f"holds {dtype} where the manifest implies {chunks.FILE_DTYPES.get(code)}"
        if problem:
            raise SnapshotError(f"snapshot {path.name} is damaged: {rel} {problem}")
    for name in parquet_files:
        try:
            with open(path / name, "rb") as fh:
                fh.seek(-4, os.SEEK_END)
                whole = fh.read(4) == b"PAR1"
        except FileNotFoundError:
            raise SnapshotError(f"snapshot {path.name} is damaged: {name} is missing") from None
        except OSError:
            whole = False
        if not whole:
            raise SnapshotError(f"snapshot {path.name} is damaged: {name} is truncated")


class SnapshotStore:
    """Serves the current snapshot of a home, re-reading CURRENT when it changes (no restart).

    When CURRENT moves to a version that is missing or damaged, the store keeps serving the
    last good version it had (and logs the problem once per pointer change); with no good
    version yet it raises SnapshotError (the services answer 503).
    """

    def __init__(self, home: Path, *, root: Path | None = None, check_ms: int = 0) -> None:
        self.home = home
        self.root = root if root is not None else snapshots_dir(home)
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

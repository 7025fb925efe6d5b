"""The snapshot store: one folder of immutable versions and the atomic pointers over them.

    CURRENT                       name of the served version (replaced atomically)
    PINNED                        versions pruning never removes, one a line (replaced atomically)
    v3-20261121T120000Z/          one immutable version (see `version.Snapshot`)
    .building-*/                  a build in progress; never read, removed when stale
    .staging-*/                   a Dask build's arrays, written by its workers

`VersionStore(root)` is the one object that knows this layout: the CLI and the servers make it
from the settings (`VersionStore.from_settings`) and pass it in; nothing below reads global
settings. A build writes a complete version folder under a temporary name, renames it into
place and only then replaces CURRENT; a build that fails or is killed leaves the served
version untouched.

Files and folders are created with the modes the process's umask gives (0644 and 0755 under
the usual 022), so that servers and workers running as other users read them; a store made
with `mode` gives its files that mode instead (its folders that mode plus search).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eqrisk.snapshot import integrity, tables
from eqrisk.snapshot.version import Snapshot, SnapshotError, UnknownVersion

if TYPE_CHECKING:
    from eqrisk.settings import Settings

VERSION_RE = re.compile(r"^v(\d+)-(\d{8}T\d{6}Z)$")
CURRENT = "CURRENT"
PINNED = "PINNED"
STAGING_PREFIX = ".staging-"
STAGING_LOCK = ".owner.lock"
BUILDING_PREFIX = ".building-"


def version_number(name: str) -> int:
    match = VERSION_RE.match(name)
    if match is None:
        raise ValueError(f"{name!r} is not a version name")
    return int(match.group(1))


def umask() -> int:
    """The process's umask (read by setting it and back: there is no other portable way)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode(mode: int | None = None) -> int:
    """The mode of a new store file: `mode` when set, else 0666 less the umask."""
    return mode if mode is not None else 0o666 & ~umask()


def folder_mode(mode: int | None = None) -> int:
    """The mode of a new store folder: `mode` plus search where it reads, else 0777 less the
    umask."""
    if mode is None:
        return 0o777 & ~umask()
    return mode | ((mode & 0o444) >> 2)


@dataclass(frozen=True)
class Previous:
    """The version a build starts from, opened once: its folder (None: the store is empty),
    the opened version (None when it does not open), and why not."""

    folder: Path | None
    snapshot: Snapshot | None
    problem: str | None
    current: str | None  # the name CURRENT held when it was opened


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    """Flush what a build wrote: new files (a hard link's data is on disk already) and every
    folder (the links and names in it)."""
    for here, dirs, names in os.walk(folder):  # strings: a version holds thousands of files
        for name in dirs:
            fsync_dir(Path(here, name))
        for name in names:
            path = os.path.join(here, name)
            try:
                st = os.stat(path)  # one stat: a regular file, and its links
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                with open(path, "rb") as fh:
                    os.fsync(fh.fileno())
    fsync_dir(folder)


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


class VersionStore:
    """The snapshot store at `root` (see the module's docstring)."""

    def __init__(self, root: Path, *, mode: int | None = None) -> None:
        self.root = Path(root).expanduser()
        self.mode = mode

    @classmethod
    def from_settings(cls, settings: Settings) -> VersionStore:
        """The store the settings name (`snapshots`, else `<home>/snapshots`)."""
        return cls(settings.snapshots_dir)

    def __repr__(self) -> str:
        return f"VersionStore({str(self.root)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VersionStore) and other.root == self.root

    def __hash__(self) -> int:
        return hash(self.root)

    # ---------------------------------------------------------------------------- reading

    def path(self, version: str) -> Path:
        return self.root / version

    def versions(self) -> list[str]:
        """Complete versions, oldest first."""
        if not self.root.is_dir():
            return []
        found = [p.name for p in self.root.iterdir() if p.is_dir() and VERSION_RE.match(p.name)]
        return sorted(found, key=version_number)

    def current(self) -> str | None:
        try:
            name = (self.root / CURRENT).read_text().strip()
        except FileNotFoundError:
            return None
        return name or None

    def open(self, version: str) -> Snapshot:
        return Snapshot.open(self.path(version))

    def open_current(self) -> Snapshot:
        version = self.current()
        if version is None:
            raise SnapshotError(f"no snapshot built under {self.root}: run `eqrisk build`")
        return self.open(version)

    def resolve(self, name: str) -> str:
        """The kept version called `name`: its full name or its number (`v3` or `3`)."""
        versions = self.versions()
        if name in versions:
            return name
        number = name[1:] if name.startswith("v") else name
        # ASCII digits only: str.isdigit() also accepts '¹' or '٣', which int() refuses
        ascii_number = number.isascii() and number.isdigit()
        found = [v for v in versions if ascii_number and v.split("-")[0] == f"v{int(number)}"]
        if len(found) == 1:
            return found[0]
        kept = ", ".join(versions) or "none"
        raise UnknownVersion(f"no snapshot version {name!r} under {self.root}; kept: {kept}")

    def pinned(self) -> list[str]:
        """Versions pruning never removes (names listed in PINNED, kept or not)."""
        try:
            text = (self.root / PINNED).read_text()
        except FileNotFoundError:
            return []
        return [line.strip() for line in text.splitlines() if line.strip()]

    def share_from(self) -> Path | None:
        """The version a new build shares chunks with: the current one, else the newest kept."""
        for name in (self.current(), *reversed(self.versions())):
            if name and (self.root / name / "manifest.json").is_file():
                return self.root / name
        return None

    def previous(self) -> Previous:
        """The version a build starts from (`share_from`), opened once for the whole build."""
        current = self.current()
        folder = self.share_from()
        if folder is None:
            return Previous(None, None, None, current)
        try:
            return Previous(folder, Snapshot.open(folder), None, current)
        except SnapshotError as exc:
            return Previous(folder, None, str(exc), current)

    # ---------------------------------------------------------------------------- writing

    def mkdir(self, path: Path) -> None:
        """A folder of the store (and its parents), with the store's folder mode."""
        path.mkdir(parents=True, exist_ok=True, mode=folder_mode(self.mode))
        if self.mode is not None:
            path.chmod(folder_mode(self.mode))

    def temp_folder(self, prefix: str) -> Path:
        """A new uniquely named folder of the store (mkdtemp's 0700 widened to the umask)."""
        self.mkdir(self.root)
        folder = Path(tempfile.mkdtemp(prefix=prefix, dir=self.root))
        folder.chmod(folder_mode(self.mode))
        return folder

    @contextmanager
    def lock(self) -> Iterator[None]:
        """One build at a time per store (a second waits), across processes and, on a mount
        with working flock (local, NFSv4), across hosts."""
        self.mkdir(self.root)
        with open(self.root / ".build.lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    @contextmanager
    def staging(self) -> Iterator[Path]:
        """A folder of the store where a Dask build's workers write its arrays before the
        version takes them over. Its owner holds a lock inside it for as long as it lives, so
        a later build tells a killed build's leftovers (lock free) from a running build's
        (held), even on another host; removed when the block ends, whatever happens."""
        self.mkdir(self.root)
        with open(self.root / ".build.lock", "a"):
            pass  # the store's lock file exists from the first build on, whatever fails next
        folder = self.temp_folder(STAGING_PREFIX)
        try:
            with open(folder / STAGING_LOCK, "w") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX)
                yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def remove_stale_builds(self) -> None:
        """Debris of killed builds: unfinished version folders, pointer files never renamed,
        and the staging folders of Dask builds whose owner is gone (a running one's is left
        alone)."""
        for path in self.root.glob(f"{BUILDING_PREFIX}*"):
            shutil.rmtree(path, ignore_errors=True)
        for path in self.root.glob(".current-*"):
            path.unlink(missing_ok=True)
        for path in self.root.glob(f"{STAGING_PREFIX}*"):
            if path.is_dir() and _abandoned(path):
                shutil.rmtree(path, ignore_errors=True)

    def write_atomically(self, name: str, text: str) -> None:
        """Replace `root/name` with `text`: readers see the old file or the new one, whole."""
        self.mkdir(self.root)
        fd, tmp = tempfile.mkstemp(prefix=f".{name.lower()}-", dir=self.root)
        try:
            os.fchmod(fd, file_mode(self.mode))  # mkstemp's 0600 is private to the writer
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.root / name)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        fsync_dir(self.root)

    def set_current(self, version: str) -> None:
        """Point CURRENT at `version` atomically (write a temp file, fsync, rename over)."""
        if not (self.root / version / "manifest.json").exists():
            raise SnapshotError(f"no complete snapshot {version!r} under {self.root}")
        self.write_atomically(CURRENT, version + "\n")

    def use(self, name: str) -> str:
        """Make the kept version `name` current after checking it opens; returns its name.

        Under the build lock: a build that is publishing finishes first (its pruning never
        removes the version this makes current), and the build after this sees the new
        CURRENT."""
        with self.lock():
            version = self.resolve(name)
            try:
                self.open(version)
            except SnapshotError as exc:
                raise SnapshotError(
                    f"{exc}; it cannot be made current: choose another version (`eqrisk "
                    "snapshots`) or run `eqrisk build`"
                ) from exc
            self.set_current(version)
        return version

    def set_pinned(self, name: str, pinned: bool) -> str:
        """Pin or unpin the kept version `name` (under the build lock, so that a build's
        pruning sees either the old pin list or the new one); returns its full name."""
        with self.lock():
            # Unpinning takes a pinned name even when its folder is gone.
            keep_name = not pinned and name in self.pinned()
            version = name if keep_name else self.resolve(name)
            pins = [v for v in self.pinned() if v != version]
            if pinned:
                pins.append(version)
            self.write_atomically(PINNED, "".join(f"{v}\n" for v in sorted(pins)))
        return version

    def prune(self, keep: int) -> list[str]:
        """Remove the oldest versions beyond the `keep` newest, never a pinned or the current
        one."""
        protected = {*self.pinned(), self.current()}
        versions = self.versions()
        removed = [v for v in versions[: max(0, len(versions) - keep)] if v not in protected]
        for old in removed:
            shutil.rmtree(self.root / old, ignore_errors=True)
        return removed

    def write(
        self,
        content: tables.SnapshotContent,
        *,
        keep: int = 3,
        progress: Callable[[str], None] | None = None,
    ) -> dict[str, Any]:
        """Write `content` as a new version, switch CURRENT to it, prune old versions.

        Returns the manifest. `keep` versions are kept (the current one always)."""
        with self.lock():
            self.remove_stale_builds()
            number = 1 + max((version_number(v) for v in self.versions()), default=0)
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
            version = f"v{number}-{stamp}"
            previous = self.share_from()
            if content.reuse is not None and content.reuse.previous != previous:
                raise SnapshotError(
                    f"another build published {previous.name if previous else 'nothing'} while "
                    f"this one reused {content.reuse.previous.name}; nothing changed: run the "
                    "build again"
                )
            tmp = self.temp_folder(BUILDING_PREFIX)
            try:
                manifest = tables.write_content(
                    tmp, content, version=version, previous=previous, progress=progress
                )
                manifest["checksums"] = integrity.record(tmp, previous)
                (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str))
                self.fix_modes(tmp)
                fsync_tree(tmp)
                tmp.rename(self.root / version)
                fsync_dir(self.root)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            self.set_current(version)
            self.prune(keep)
        return manifest

    def verify(self, versions: list[str] | None = None) -> integrity.Report:
        """Check every byte of the kept versions (or of `versions`) against the checksums
        their manifests record (`integrity.verify`)."""
        return integrity.verify(self.root, self.versions() if versions is None else versions)

    def fix_modes(self, folder: Path) -> None:
        """Give a new version's files and folders the store's modes (a file that a temporary
        name or another library created privately, one a Dask worker under another umask
        wrote)."""
        files, folders = file_mode(self.mode), folder_mode(self.mode)
        folder.chmod(folders)
        for here, dirs, names in os.walk(folder):  # strings, as `fsync_tree`
            for name in (*dirs, *names):
                path = os.path.join(here, name)
                st = os.lstat(path)
                wanted = folders if stat.S_ISDIR(st.st_mode) else files
                if stat.S_IMODE(st.st_mode) != wanted:
                    # Another user's file (a worker's) keeps the mode its umask gave.
                    with contextlib.suppress(PermissionError):
                        os.chmod(path, wanted)

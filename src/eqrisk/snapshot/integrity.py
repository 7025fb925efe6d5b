"""Checksums of a version's files, recorded in its manifest when it is written, and the check of
every byte of a store (`eqrisk snapshots verify`).

Versions share files by hard links, so one damaged file damages every version that links it:
a damaged file is reported once, with every version it belongs to. A file is hashed once per
check however many versions link it (by its inode), and a build hashes only the files it
wrote: a file linked from the previous version keeps the checksum recorded there.

New versions record xxh3-128 (`ALGORITHM`); versions written before it record blake2b-128 and
still verify: a manifest names its algorithm and is checked with it (`ALGORITHMS`).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import xxhash

MANIFEST = "manifest.json"
_BLOCK = 4 << 20


class Hasher(Protocol):
    """What `ALGORITHMS` make: hashlib's and xxhash's hash objects."""

    def update(self, data: bytes | bytearray | memoryview, /) -> None: ...

    def hexdigest(self) -> str: ...


def _blake2b() -> Hasher:
    return hashlib.blake2b(digest_size=16)


ALGORITHMS: dict[str, Callable[[], Hasher]] = {
    "xxh3-128": xxhash.xxh3_128,
    "blake2b-128": _blake2b,  # versions written before xxh3-128: still verified
}
ALGORITHM = "xxh3-128"  # what a new version records


def hasher(algorithm: str = ALGORITHM) -> Hasher:
    """A new hash object of `algorithm` (a name of `ALGORITHMS`)."""
    return ALGORITHMS[algorithm]()


def file_digest(path: Path, algorithm: str = ALGORITHM) -> str:
    """The hex digest of a file's bytes, read in blocks into one reused buffer."""
    h = hasher(algorithm)
    buffer = bytearray(_BLOCK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buffer):
            h.update(view[:n])
    return h.hexdigest()


# Digests of files this process wrote from memory (`save_array`), by (device, inode), with the
# size and modification time they were written with: `record` takes a file's from here when
# both still match (no read back), and drops it. Bounded: a process that writes without ever
# recording (a Dask worker) forgets them.
_WRITTEN: dict[tuple[int, int], tuple[int, int, str]] = {}
_WRITTEN_MAX = 1 << 18
_WRITTEN_LOCK = threading.Lock()


def save_array(path: Path, values: np.ndarray) -> None:
    """`np.save(path, values)`, the file's digest computed from the bytes in memory (its
    header read back, the array's own bytes hashed where they are) and remembered for
    `record`: a version's chunk files are not read again to be hashed."""
    np.save(path, values)
    if values.dtype.hasobject or not values.flags.c_contiguous:
        return  # written element by element or pickled: `record` reads the file
    st = path.stat()
    head = st.st_size - values.nbytes
    if head <= 0:
        return
    with open(path, "rb") as fh:
        header = fh.read(head)
    h = hasher()
    h.update(header)
    h.update(values.reshape(-1).view(np.uint8).data)
    with _WRITTEN_LOCK:
        if len(_WRITTEN) >= _WRITTEN_MAX:
            _WRITTEN.clear()
        _WRITTEN[(st.st_dev, st.st_ino)] = (st.st_size, st.st_mtime_ns, h.hexdigest())


def _remembered(path: Path, st: os.stat_result | None = None) -> str | None:
    """The digest `save_array` computed for this very file (same inode, size and
    modification time), forgotten once asked; None when it wrote no such file. `st`: the
    file's stat, when the caller has it."""
    st = path.stat() if st is None else st
    with _WRITTEN_LOCK:
        entry = _WRITTEN.pop((st.st_dev, st.st_ino), None)
    if entry is None or entry[:2] != (st.st_size, st.st_mtime_ns):
        return None
    return entry[2]


def _files(folder: Path) -> list[str]:
    """Every file of a version folder but its manifest, as sorted relative paths (one
    `os.walk` on strings: a version holds thousands of files)."""
    top = str(folder)
    out = []
    for here, _dirs, names in os.walk(top):
        rel = os.path.relpath(here, top)
        for name in names:
            if name == MANIFEST or not os.path.isfile(os.path.join(here, name)):
                continue
            out.append(name if rel == os.curdir else os.path.join(rel, name))
    return sorted(out)


def record(folder: Path, previous: Path | None = None) -> dict[str, Any]:
    """The manifest's `checksums` block of the version being written in `folder`: a file that
    is the very file (a hard link) of `previous` keeps the checksum `previous` records."""
    known: dict[str, str] = {}
    if previous is not None:
        try:
            old = json.loads((previous / MANIFEST).read_text()).get("checksums") or {}
        except (OSError, ValueError):
            old = {}
        if old.get("algorithm") == ALGORITHM:
            known = dict(old.get("files", {}))
    files: dict[str, str] = {}
    top = str(folder)
    for rel in _files(folder):
        path = os.path.join(top, rel)  # strings, one stat a file: a version holds thousands
        st = os.stat(path)
        digest = known.get(rel)
        if digest is not None and previous is not None:
            try:
                if os.path.samestat(st, os.stat(os.path.join(previous, rel))):
                    files[rel] = digest
                    continue
            except FileNotFoundError:
                pass
        files[rel] = _remembered(Path(path), st) or file_digest(Path(path))
    return {"algorithm": ALGORITHM, "files": files}


@dataclass
class Damage:
    """One damaged file (an inode, or a missing path) and every (version, path) that has it."""

    problem: str
    places: list[tuple[str, str]]

    @property
    def versions(self) -> list[str]:
        return sorted({v for v, _ in self.places}, key=_number)

    def describe(self) -> dict[str, Any]:
        paths = sorted({rel for _, rel in self.places})
        return {"files": paths, "problem": self.problem, "versions": self.versions}

    def line(self) -> str:
        paths = ", ".join(sorted({rel for _, rel in self.places}))
        shared = len(self.versions)
        where = f"in {shared} versions sharing it" if shared > 1 else "in"
        return f"{paths} {self.problem}, {where}: {', '.join(self.versions)}"


def _number(version: str) -> tuple[int, str]:
    head = version.split("-")[0]
    digits = head[1:]
    return (int(digits) if digits.isascii() and digits.isdigit() else 0, version)


@dataclass
class Report:
    """What `verify` found: versions checked, files and bytes hashed, versions that record no
    checksums (written before them), and the damaged files."""

    versions: list[str] = field(default_factory=list)
    files: int = 0
    bytes: int = 0
    unrecorded: list[str] = field(default_factory=list)
    damaged: list[Damage] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.damaged

    def describe(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "versions": self.versions,
            "files_checked": self.files,
            "bytes_checked": self.bytes,
            "without_checksums": self.unrecorded,
            "damaged": [d.describe() for d in self.damaged],
        }


def verify(root: Path, versions: list[str]) -> Report:
    """Check every file each of `versions` (folders of `root`) records a checksum for, with the
    algorithm its manifest names: a file (an inode) is hashed once per algorithm, so a file an
    old blake2b version shares with a new xxh3 one is read twice, once for each."""
    report = Report(versions=list(versions))
    digests: dict[tuple[int, int, str], str] = {}
    places: dict[tuple[int, int], list[tuple[str, str]]] = {}
    bad: dict[tuple[int, int], str] = {}
    missing: list[Damage] = []
    for version in versions:
        folder = root / version
        try:
            manifest = json.loads((folder / MANIFEST).read_text())
        except (OSError, ValueError) as exc:
            missing.append(Damage(f"is unreadable ({exc})", [(version, MANIFEST)]))
            continue
        block = manifest.get("checksums")
        if not isinstance(block, dict) or block.get("algorithm") not in ALGORITHMS:
            report.unrecorded.append(version)
            for rel in _files(folder):  # still tell which versions share a damaged file
                st = (folder / rel).stat()
                places.setdefault((st.st_dev, st.st_ino), []).append((version, rel))
            continue
        algorithm = str(block["algorithm"])
        for rel, expected in sorted(block["files"].items()):
            path = folder / rel
            try:
                st = path.stat()
            except FileNotFoundError:
                missing.append(Damage("is missing", [(version, rel)]))
                continue
            key = (st.st_dev, st.st_ino)
            places.setdefault(key, []).append((version, rel))
            found = _digest_once(path, st, algorithm, digests, report)
            if found != expected and key not in bad:
                bad[key] = (
                    f"cannot be read ({found[12:]})"
                    if found.startswith("unreadable")
                    else f"does not match its checksum ({algorithm})"
                )
    report.damaged = [Damage(problem, places[key]) for key, problem in bad.items()] + missing
    return report


def _digest_once(
    path: Path,
    st: os.stat_result,
    algorithm: str,
    digests: dict[tuple[int, int, str], str],
    report: Report,
) -> str:
    """The digest of the file (inode) `st` by `algorithm`, hashed the first time it is asked
    (counted in `report` then)."""
    key = (st.st_dev, st.st_ino, algorithm)
    if key not in digests:
        try:
            digests[key] = file_digest(path, algorithm)
        except OSError as exc:
            digests[key] = f"unreadable: {exc}"
        report.files += 1
        report.bytes += st.st_size
    return digests[key]

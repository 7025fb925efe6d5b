"""A host's local copy of the versions a bucket publishes (`bucket`): a store folder like any
other (`VersionStore`), filled from the bucket, that the servers read as they read a mount:
memory-mapped local files, so serving costs what it did.

`pull` copies one version in: a file some local version already has (same checksum) is hard
linked, as builds share unchanged chunks, and only the others are downloaded, each checked
against its checksum. The version is assembled under a temporary name and renamed into place,
then CURRENT moves: a pull killed half way leaves a `.building-*` folder that the next one
removes, never a version. `Follower` pulls whenever the bucket's CURRENT moves (`eqrisk serve`
runs one per host, in its main process).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eqrisk.snapshot import integrity
from eqrisk.snapshot.bucket import (
    Bucket,
    BucketError,
    local_digests,
    manifest_algorithm,
    manifest_files,
)
from eqrisk.snapshot.store import BUILDING_PREFIX, VersionStore, fsync_dir, fsync_tree

log = logging.getLogger("eqrisk.snapshot")


@dataclass
class Pulled:
    """What a pull did: the version, files downloaded (and bytes), files linked locally."""

    version: str
    downloaded: int = 0
    downloaded_bytes: int = 0
    linked: int = 0
    already: bool = False  # the version was here already
    current: bool = False
    pruned: tuple[str, ...] = ()

    def describe(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "files_downloaded": self.downloaded,
            "bytes_downloaded": self.downloaded_bytes,
            "files_linked": self.linked,
            "already_here": self.already,
            "current": self.current,
            "pruned": list(self.pruned),
        }


def _link(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            raise
        shutil.copyfile(source, target)


def _download(bucket: Bucket, digest: str, target: Path, algorithm: str) -> int:
    """One chunk into `target`, checked against its digest (by `algorithm`); returns its size."""
    h = integrity.hasher(algorithm)
    size = 0
    with open(target, "wb") as fh:
        for part in bucket.stream(bucket.chunk_key(digest)):
            h.update(part)
            fh.write(part)
            size += len(part)
    if h.hexdigest() != digest:
        raise BucketError(
            f"{bucket.url} chunk {digest} does not match its checksum: run `eqrisk snapshots "
            "verify --bucket`"
        )
    return size


def pull(
    bucket: Bucket,
    store: VersionStore,
    version: str | None = None,
    *,
    make_current: bool = True,
    keep: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> Pulled:
    """Copy `version` (default: the bucket's CURRENT) into the local `store`, make it current
    there (unless not `make_current`) and prune the local versions beyond `keep` (None: none
    pruned). Under the store's build lock: a host's processes pull one at a time, and the
    second finds the version there."""
    say = progress or (lambda _msg: None)
    name = version or bucket.current()
    if name is None:
        raise BucketError(f"{bucket.url} has no CURRENT version: publish one with `eqrisk "
                          "snapshots push`")  # fmt: skip
    with store.lock():
        store.remove_stale_builds()
        pulled = Pulled(name)
        if (store.path(name) / integrity.MANIFEST).is_file():
            pulled.already = True
        else:
            _assemble(bucket, store, name, pulled, say)
        if make_current and store.current() != name:
            store.set_current(name)
            pulled.current = True
        if keep is not None:
            pulled.pruned = tuple(store.prune(keep))
    return pulled


def _assemble(
    bucket: Bucket, store: VersionStore, name: str, pulled: Pulled, say: Callable[[str], None]
) -> None:
    raw = bucket.manifest_bytes(name)
    try:
        manifest = json.loads(raw)
        files = manifest_files(manifest)
        algorithm = manifest_algorithm(manifest)
    except ValueError as exc:
        raise BucketError(f"the manifest of {name} in {bucket.url} is damaged: {exc}") from None
    have = local_digests(store)
    tmp = store.temp_folder(BUILDING_PREFIX)
    try:
        for rel, digest in sorted(files.items()):
            target = tmp / rel
            store.mkdir(target.parent)
            source = have.get(digest)
            if source is not None:
                _link(source, target)
                pulled.linked += 1
                continue
            try:
                pulled.downloaded_bytes += _download(bucket, digest, target, algorithm)
            except FileNotFoundError:
                raise BucketError(
                    f"{bucket.url} lacks a chunk of {name} ({rel}): run `eqrisk snapshots verify "
                    "--bucket`"
                ) from None
            pulled.downloaded += 1
            have[digest] = target
            say(f"downloaded {rel} ({pulled.downloaded} files)")
        (tmp / integrity.MANIFEST).write_bytes(raw)  # last, as a build writes it
        store.fix_modes(tmp)
        fsync_tree(tmp)
        tmp.rename(store.path(name))
        fsync_dir(store.root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class Follower:
    """Keeps a local store on the bucket's CURRENT: `sync` pulls when it moved; `start` runs
    `sync` every `every_s` in a daemon thread (errors logged once each, the last good version
    still served)."""

    def __init__(
        self,
        bucket: Bucket,
        store: VersionStore,
        *,
        every_s: float,
        keep: int,
        say: Callable[[str], None] | None = None,
    ) -> None:
        """`say`: where the thread's lines go (default: the `eqrisk.snapshot` log, warnings
        and errors)."""
        self.say = say
        self.bucket = bucket
        self.store = store
        self.every_s = every_s
        self.keep = keep
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_problem: str | None = None

    def sync(self) -> Pulled | None:
        """Pull the bucket's CURRENT when the local store is not on it; None when it is."""
        name = self.bucket.current()
        if name is None or (
            self.store.current() == name and (self.store.path(name) / integrity.MANIFEST).is_file()
        ):
            return None
        return pull(self.bucket, self.store, name, keep=self.keep)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                pulled = self.sync()
            except Exception as exc:  # a network or disk problem: said once, tried again
                problem = f"{exc}; still serving {self.store.current()}"
                if problem != self._last_problem:
                    self._tell(f"snapshot cache: {problem}", error=True)
                self._last_problem = problem
                continue
            self._last_problem = None
            if pulled is not None:
                self._tell(
                    f"snapshot cache: now serving {pulled.version} ({pulled.downloaded} files "
                    f"downloaded, {pulled.downloaded_bytes / 1e6:.1f} MB; {pulled.linked} linked)"
                )

    def _tell(self, line: str, *, error: bool = False) -> None:
        if self.say is not None:
            self.say(line)
        elif error:
            log.error(line)
        else:
            log.warning(line)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="snapshot-cache", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

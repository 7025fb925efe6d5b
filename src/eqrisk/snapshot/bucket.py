"""Snapshot versions on an S3-compatible bucket: content-addressed chunk files shared between
versions, each version's manifest written last.

    <prefix>/chunks/<digest>          one file of some version, named by its checksum
    <prefix>/versions/<name>.json     a version's manifest: it is published once this exists
    <prefix>/CURRENT                  the name of the version the fleet serves
    <prefix>/PINNED                   versions pruning never removes, one a line

A version's manifest records the checksum of every file (`integrity`), so the digest is the
file's address: a file two versions share (an unchanged chunk) is one object. `push` uploads
the files the bucket lacks, then the manifest: a publish killed half way leaves chunks no
manifest names (invisible, removed by a later prune once older than its grace), never half a
version. One publisher per bucket (the build host): pruning removes unreferenced chunks, and a
second publisher's upload in flight could reference one (the grace covers a slow one).

The bucket is reached with obstore (the Rust object_store crate): credentials and region come
from the usual AWS_* variables; `endpoint` names a non-AWS server (MinIO, Ceph, moto).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

from eqrisk.snapshot import integrity
from eqrisk.snapshot.store import VERSION_RE, version_number
from eqrisk.snapshot.version import SnapshotError

if TYPE_CHECKING:
    from obstore.store import S3Store

    from eqrisk.settings import Settings
    from eqrisk.snapshot.store import VersionStore

CHUNKS = "chunks/"
VERSIONS = "versions/"
CURRENT = "CURRENT"
PINNED = "PINNED"
GRACE_S = 3600.0  # an unreferenced chunk younger than this may be a publish in flight
_STREAM = 8 << 20


class BucketError(SnapshotError):
    """The bucket cannot be reached or holds something unusable: one line says which."""


def _one_line(exc: BaseException) -> str:
    """obstore's errors carry a debug dump after their first line."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


@dataclass
class Pushed:
    """What a push did: the version, files uploaded (and their bytes), files the bucket had."""

    version: str
    uploaded: int = 0
    uploaded_bytes: int = 0
    shared: int = 0
    current: str | None = None
    pruned: list[str] = field(default_factory=list)
    chunks_removed: int = 0

    def describe(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "files_uploaded": self.uploaded,
            "bytes_uploaded": self.uploaded_bytes,
            "files_shared": self.shared,
            "current": self.current,
            "pruned": self.pruned,
            "chunks_removed": self.chunks_removed,
        }


def manifest_algorithm(manifest: dict[str, Any]) -> str:
    """The checksum algorithm a version's manifest records (one of `integrity.ALGORITHMS`:
    xxh3-128 since it replaced blake2b-128, which older versions record)."""
    block = manifest.get("checksums")
    if not isinstance(block, dict) or block.get("algorithm") not in integrity.ALGORITHMS:
        known = " or ".join(integrity.ALGORITHMS)
        raise BucketError(f"{manifest.get('model_version')} records no {known} checksums")
    return str(block["algorithm"])


def manifest_files(manifest: dict[str, Any]) -> dict[str, str]:
    """{relative path: digest} of a version's files, from its manifest's checksums (by the
    algorithm `manifest_algorithm` names). Digests of the two algorithms are 128 bits each:
    a chunk is addressed by either, never both."""
    manifest_algorithm(manifest)
    return {str(rel): str(d) for rel, d in manifest["checksums"]["files"].items()}


class Bucket:
    """The snapshot versions under one bucket URL (`s3://bucket/prefix`)."""

    def __init__(self, url: str, *, endpoint: str | None = None) -> None:
        from obstore.store import S3Store

        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise BucketError(f"{url!r} is not a bucket URL like s3://bucket/prefix")
        self.url = url
        options: dict[str, Any] = {}
        if endpoint is not None:
            options["endpoint"] = endpoint
        allow_http = endpoint is not None and endpoint.startswith("http://")
        prefix = parts.path.strip("/") or None
        self._store: S3Store = S3Store(
            parts.netloc,
            prefix=prefix,
            client_options={"allow_http": allow_http},
            **options,
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> Bucket | None:
        """The bucket the settings name (`snapshot_bucket`), None when none is set."""
        if not settings.snapshot_bucket:
            return None
        return cls(settings.snapshot_bucket, endpoint=settings.snapshot_bucket_endpoint)

    def __repr__(self) -> str:
        return f"Bucket({self.url!r})"

    # ---------------------------------------------------------------------------- objects

    def _get(self, key: str) -> bytes | None:
        import obstore

        try:
            return obstore.get(self._store, key).bytes().to_bytes()
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise BucketError(f"cannot read {key} from {self.url}: {_one_line(exc)}") from None

    def _put(self, key: str, data: bytes | Path) -> None:
        import obstore

        try:
            obstore.put(self._store, key, data)
        except Exception as exc:
            raise BucketError(f"cannot write {key} to {self.url}: {_one_line(exc)}") from None

    def _list(self, prefix: str) -> Iterator[dict[str, Any]]:
        import obstore

        try:
            for batch in obstore.list(self._store, prefix=prefix):
                yield from cast(list[dict[str, Any]], batch)
        except Exception as exc:
            raise BucketError(f"cannot list {self.url}/{prefix}: {_one_line(exc)}") from None

    def _delete(self, keys: list[str]) -> None:
        import obstore

        for start in range(0, len(keys), 500):
            try:
                obstore.delete(self._store, keys[start : start + 500])
            except Exception as exc:
                raise BucketError(f"cannot delete from {self.url}: {_one_line(exc)}") from None

    def stream(self, key: str) -> Iterator[bytes]:
        """The bytes of one object, a block at a time."""
        import obstore

        try:
            result = obstore.get(self._store, key)
            for part in result.stream(min_chunk_size=_STREAM):
                yield bytes(part)
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise BucketError(f"cannot read {key} from {self.url}: {_one_line(exc)}") from None

    # ---------------------------------------------------------------------------- reading

    def versions(self) -> list[str]:
        """Published versions (those whose manifest is there), oldest first."""
        names = []
        for meta in self._list(VERSIONS):
            name = str(meta["path"])[len(VERSIONS) :].removesuffix(".json")
            if VERSION_RE.match(name):
                names.append(name)
        return sorted(names, key=version_number)

    def manifest_bytes(self, version: str) -> bytes:
        data = self._get(f"{VERSIONS}{version}.json")
        if data is None:
            kept = ", ".join(self.versions()) or "none"
            raise BucketError(f"no version {version!r} in {self.url}; published: {kept}")
        return data

    def manifest(self, version: str) -> dict[str, Any]:
        try:
            found: dict[str, Any] = json.loads(self.manifest_bytes(version))
        except ValueError as exc:
            raise BucketError(
                f"the manifest of {version} in {self.url} is damaged: {exc}"
            ) from None
        return found

    def current(self) -> str | None:
        data = self._get(CURRENT)
        name = data.decode().strip() if data else ""
        return name or None

    def pinned(self) -> list[str]:
        data = self._get(PINNED)
        return [line.strip() for line in (data or b"").decode().splitlines() if line.strip()]

    def chunk_key(self, digest: str) -> str:
        return f"{CHUNKS}{digest}"

    # ---------------------------------------------------------------------------- writing

    def set_current(self, version: str) -> None:
        """Point the bucket's CURRENT at a published version (one PUT: atomic for readers)."""
        self.manifest_bytes(version)  # published, or BucketError
        self._put(CURRENT, (version + "\n").encode())

    def set_pinned(self, versions: list[str]) -> None:
        self._put(PINNED, "".join(f"{v}\n" for v in sorted(set(versions))).encode())

    def push(
        self,
        store: VersionStore,
        version: str,
        *,
        progress: Callable[[str], None] | None = None,
    ) -> Pushed:
        """Publish the local version `version` of `store`: the files the bucket lacks (each
        hashed first: a damaged local file is refused, never uploaded under its old name),
        then the manifest. Nothing is visible until the manifest is there."""
        say = progress or (lambda _msg: None)
        folder = store.path(version)
        try:
            raw = (folder / integrity.MANIFEST).read_bytes()
            manifest = json.loads(raw)
        except (OSError, ValueError) as exc:
            raise BucketError(f"cannot read the manifest of {version}: {exc}") from None
        if not isinstance(manifest.get("checksums"), dict):
            # Written before checksums: the bucket's copy records them.
            manifest["checksums"] = integrity.record(folder)
            raw = json.dumps(manifest, indent=2, default=str).encode()
        files = manifest_files(manifest)
        algorithm = manifest_algorithm(manifest)
        have = {str(m["path"])[len(CHUNKS) :] for m in self._list(CHUNKS)}
        pushed = Pushed(version)
        done: set[str] = set()
        for rel, digest in sorted(files.items()):
            if digest in have or digest in done:
                pushed.shared += 1
                continue
            path = folder / rel
            if integrity.file_digest(path, algorithm) != digest:
                raise BucketError(
                    f"{version}/{rel} does not match its checksum: run `eqrisk snapshots "
                    "verify`; nothing of it was published"
                )
            self._put(self.chunk_key(digest), path)
            done.add(digest)
            pushed.uploaded += 1
            pushed.uploaded_bytes += path.stat().st_size
            say(f"uploaded {rel} ({pushed.uploaded} files)")
        self._put(f"{VERSIONS}{version}.json", raw)  # last: the version is published now
        return pushed

    def prune(self, keep: int, *, grace_s: float = GRACE_S) -> tuple[list[str], int]:
        """Unpublish the oldest versions beyond the `keep` newest (never CURRENT's or a pinned
        one), then remove every chunk no remaining manifest names and older than `grace_s`.
        Returns (versions removed, chunks removed)."""
        versions = self.versions()
        protected = {self.current(), *self.pinned()}
        removed = [v for v in versions[: max(0, len(versions) - keep)] if v not in protected]
        self._delete([f"{VERSIONS}{v}.json" for v in removed])
        needed: set[str] = set()
        for version in self.versions():  # again: listed after the manifests went
            needed.update(manifest_files(self.manifest(version)).values())
        cutoff = datetime.now(UTC) - timedelta(seconds=grace_s)
        stale = [
            str(meta["path"])
            for meta in self._list(CHUNKS)
            if str(meta["path"])[len(CHUNKS) :] not in needed and meta["last_modified"] <= cutoff
        ]
        self._delete(stale)
        return removed, len(stale)

    # ---------------------------------------------------------------------------- checking

    def verify(self) -> integrity.Report:
        """Every chunk each published version names, read whole and hashed against its
        address (the checksum the manifests record): a damaged or missing chunk is named with
        every version that uses it."""
        versions = self.versions()
        report = integrity.Report(versions=list(versions))
        places: dict[str, list[tuple[str, str]]] = {}
        algorithms: dict[str, str] = {}
        for version in versions:
            try:
                manifest = self.manifest(version)
                files = manifest_files(manifest)
            except BucketError:
                report.unrecorded.append(version)
                continue
            for rel, digest in files.items():
                places.setdefault(digest, []).append((version, rel))
                algorithms[digest] = manifest_algorithm(manifest)
        sizes = {str(m["path"])[len(CHUNKS) :]: int(m["size"]) for m in self._list(CHUNKS)}
        for digest, where in sorted(places.items()):
            if digest not in sizes:
                report.damaged.append(integrity.Damage("is missing from the bucket", where))
                continue
            h = integrity.hasher(algorithms[digest])
            try:
                for part in self.stream(self.chunk_key(digest)):
                    h.update(part)
            except FileNotFoundError:
                report.damaged.append(integrity.Damage("is missing from the bucket", where))
                continue
            report.files += 1
            report.bytes += sizes[digest]
            if h.hexdigest() != digest:
                problem = f"does not match its checksum ({algorithms[digest]})"
                report.damaged.append(integrity.Damage(problem, where))
        return report


def local_digests(store: VersionStore) -> dict[str, Path]:
    """{digest: a file of a kept local version with it}, from their manifests' checksums: what
    a pull links instead of downloading."""
    found: dict[str, Path] = {}
    for version in store.versions():
        folder = store.path(version)
        try:
            files = manifest_files(json.loads((folder / integrity.MANIFEST).read_text()))
        except (OSError, ValueError, BucketError):
            continue
        for rel, digest in files.items():
            path = folder / rel
            if digest not in found and os.path.isfile(path):
                found[digest] = path
    return found

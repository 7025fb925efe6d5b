"""`eqrisk bench cache`: a server's time to serve a new version from a bucket (its local cache
filled from it) next to a server on the store's mount, on a built store (two versions at
least: the newest and the one before it, as after a daily update).

On a local server speaking the S3 API (moto's, `bench.s3`; its objects in its memory), in one
run:
- publishing: the older version pushed whole, then the newer one (only the chunks it changed);
- a cold cache: the older version pulled into an empty cache, then opened (a new host);
- the switch: the bucket's CURRENT moved to the newer version, the cache's `Follower.sync`
  (downloads what changed, links the rest) and the version opened, next to a mount's switch
  (the version opened where it lies);
- reads: every field of `reads` tickers' whole history, from the cache and from the mount
  (both memory-mapped local files: their ratio is the serving cost of the cache).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from eqrisk.bench.s3 import local_s3
from eqrisk.snapshot.bucket import Bucket
from eqrisk.snapshot.cache import Follower, pull
from eqrisk.snapshot.store import VersionStore
from eqrisk.snapshot.version import Snapshot


def _size(folder: Path) -> tuple[int, int]:
    """(files, bytes) of a version, each inode once."""
    seen: set[int] = set()
    files = size = 0
    for path in folder.rglob("*"):
        st = path.stat()
        if path.is_file() and st.st_ino not in seen:
            seen.add(st.st_ino)
            files += 1
            size += st.st_size
    return files, size


def _read(snap: Snapshot, tickers: list[str]) -> float:
    """Seconds to read every field's whole history of `tickers` (each row summed: read)."""
    fields = [str(name) for name in snap.manifest["fields"]]
    started = time.perf_counter()
    for ticker in tickers:
        row = snap.row_of[ticker]
        for name in fields:
            np.nansum(np.asarray(snap.array(name)[row, :], dtype=np.float64))
    return time.perf_counter() - started


def run(root: Path, reads: int, say: Callable[[str], None]) -> dict[str, Any]:
    store = VersionStore(root)
    versions = store.versions()
    new = store.current() or (versions[-1] if versions else None)
    if new is None:
        raise ValueError(f"no snapshot built under {root}: run `eqrisk build` first")
    older = [v for v in versions if v != new]
    old = older[-1] if older else None
    out: dict[str, Any] = {"store": str(root), "new version": new, "previous version": old}
    files, size = _size(store.path(new))
    out["version files"] = files
    out["version MB"] = round(size / 1e6, 1)
    with local_s3("eqrisk-bench") as s3, tempfile.TemporaryDirectory() as tmp:
        bucket = Bucket(s3.url("bench"), endpoint=s3.endpoint)
        first = old or new
        say(f"pushing {first} (whole)")
        t = time.perf_counter()
        pushed = bucket.push(store, first)
        bucket.set_current(first)
        out["push whole version, s"] = round(time.perf_counter() - t, 2)
        out["push whole version, MB"] = round(pushed.uploaded_bytes / 1e6, 1)

        cache = VersionStore(Path(tmp) / "cache")
        say(f"filling an empty cache with {first}")
        t = time.perf_counter()
        pulled = pull(bucket, cache, first)
        cache.open(first)
        out["cold cache fill + open, s"] = round(time.perf_counter() - t, 2)
        out["cold cache fill, MB downloaded"] = round(pulled.downloaded_bytes / 1e6, 1)

        if old is not None:
            say(f"pushing {new} (the chunks it changed)")
            t = time.perf_counter()
            pushed = bucket.push(store, new)
            bucket.set_current(new)
            out["push update, s"] = round(time.perf_counter() - t, 2)
            out["push update, files / MB uploaded"] = (
                f"{pushed.uploaded} / {pushed.uploaded_bytes / 1e6:.1f}"
            )
            say("the cache follows the bucket's CURRENT")
            follower = Follower(bucket, cache, every_s=1, keep=2)
            t = time.perf_counter()
            synced = follower.sync()
            snap = cache.open(new)
            switch_bucket = time.perf_counter() - t
            assert synced is not None
            out["switch from the bucket (fill + open), s"] = round(switch_bucket, 3)
            out["switch, files / MB downloaded"] = (
                f"{synced.downloaded} / {synced.downloaded_bytes / 1e6:.1f}"
            )
            out["switch, files linked"] = synced.linked
            t = time.perf_counter()
            mounted = store.open(new)
            switch_mount = time.perf_counter() - t
            out["switch on the mount (open), s"] = round(switch_mount, 3)
            out["switch: bucket / mount"] = round(switch_bucket / switch_mount, 1)
        else:
            snap = cache.open(new)
            mounted = store.open(new)
        tickers = sorted(mounted.row_of)[: max(1, reads)]
        _read(snap, tickers[:5])  # warm both (numba, page cache) before timing
        _read(mounted, tickers[:5])
        from_cache = min(_read(snap, tickers) for _ in range(3))
        from_mount = min(_read(mounted, tickers) for _ in range(3))
        out[f"read {len(tickers)} tickers x every field, cache, ms"] = round(from_cache * 1e3, 1)
        out[f"read {len(tickers)} tickers x every field, mount, ms"] = round(from_mount * 1e3, 1)
        out["reads: cache / mount"] = round(from_cache / from_mount, 2)
    return out

"""How long the builds of a store took, kept beside its versions (`BUILD_TIMES`, JSON) for the
servers' metrics (`eqrisk_build_duration_seconds`): per build mode (full, incremental, dask),
the count and total of their durations and the last one. Written by the build, under the
store's build lock, replaced atomically; a server only reads it."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

BUILD_TIMES = "BUILD_TIMES"


def read_build_times(root: Path) -> dict[str, dict[str, float]]:
    """{mode: {count, sum_seconds, last_seconds, last_finished}} ({} before the first build,
    or when the file is unreadable: metrics never fail a scrape)."""
    try:
        doc = json.loads((root / BUILD_TIMES).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def build_mode(manifest: dict[str, Any], dask: str | None) -> str:
    """The manifest's build mode ("full" or "incremental"), or "dask" for a full build that ran
    on the cluster `dask` names (an incremental build runs in process even with `dask` set:
    `dask_min_cells`)."""
    mode = str((manifest.get("build") or {}).get("mode", "full"))
    return "dask" if dask is not None and mode == "full" else mode


def record_build(root: Path, mode: str, seconds: float) -> None:
    """Add one build of `mode` that took `seconds`."""
    times = read_build_times(root)
    entry = times.setdefault(mode, {"count": 0, "sum_seconds": 0.0})
    entry["count"] = int(entry.get("count", 0)) + 1
    entry["sum_seconds"] = float(entry.get("sum_seconds", 0.0)) + seconds
    entry["last_seconds"] = seconds
    entry["last_finished"] = time.time()
    tmp = root / f".{BUILD_TIMES}.{os.getpid()}"
    try:
        tmp.write_text(json.dumps(times, indent=1, sort_keys=True))
        os.replace(tmp, root / BUILD_TIMES)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()

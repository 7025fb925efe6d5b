"""The build bench's model section: a full build and a one-session incremental build of a
synthetic market through the real build (`publish_panel`: model, digests, chunked writer, long
table, symbols table), with the disk the incremental version adds.

The market: SPY, the 11 GICS sector ETFs and `symbols - 12` stocks, each on its sector ETF, a
third listed later than the first session; one-factor-per-level returns from a seeded
generator. The panel with one more session holds the very same earlier values, as a vendor's
next day does, so the second build is incremental (and its values are checked against a full
build's in quick mode, where that costs little)."""

from __future__ import annotations

import os
import resource
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from eqrisk.build.distributed import dask_client
from eqrisk.build.pipeline import publish_panel
from eqrisk.data.master import Mappings, classify
from eqrisk.data.panel import PANEL_FIELDS, Panel
from eqrisk.model.run import ModelParams
from eqrisk.snapshot import chunks
from eqrisk.snapshot.versions import Snapshot, snapshots_dir

SECTORS = {
    "Communication Services": "XLC",
    "Consumer Discretionary": "XLY",
    "Consumer Staples": "XLP",
    "Energy": "XLE",
    "Financials": "XLF",
    "Health Care": "XLV",
    "Industrials": "XLI",
    "Information Technology": "XLK",
    "Materials": "XLB",
    "Real Estate": "XLRE",
    "Utilities": "XLU",
}


def synthetic_market(n: int, t: int, seed: int) -> tuple[Panel, pd.DataFrame]:
    """A panel of n symbols x t sessions (business days from 1996) and its classified master."""
    rng = np.random.default_rng(seed)
    etfs = ["SPY", *SECTORS.values()]
    stocks = n - len(etfs)
    if stocks < 1:
        raise ValueError(f"the synthetic market needs more than {len(etfs)} symbols")
    sector_names = list(SECTORS)
    sector_of = rng.integers(0, len(sector_names), stocks)
    market = rng.normal(0.0003, 0.011, t)
    sector_r = 0.9 * market[None, :] + rng.normal(0, 0.007, (len(SECTORS), t))
    beta = rng.uniform(0.5, 1.5, stocks)[:, None]
    r = beta * sector_r[sector_of] + rng.normal(0, 0.015, (stocks, t))
    returns = np.vstack([market[None, :], sector_r, r])
    close = 50.0 * np.cumprod(1.0 + returns, axis=1)
    listed = np.where(rng.random(stocks) < 2 / 3, 0, rng.integers(0, max(1, t // 2), stocks))
    close[len(etfs) :][np.arange(t)[None, :] < listed[:, None]] = np.nan
    symbols = np.array([*etfs, *(f"S{i:05d}" for i in range(stocks))], dtype=object)
    sessions = np.busday_offset(np.datetime64("1996-01-02"), np.arange(t), roll="forward")
    empty = np.full_like(close, np.nan)
    panel = Panel(
        symbols=symbols,
        sessions=sessions.astype("datetime64[D]"),
        close=close,
        open=empty,
        high=empty,
        low=empty,
        close_raw=empty,
        volume=empty,
        market_cap=empty,
    )
    raw = pd.DataFrame(
        {
            "symbol": symbols,
            "name": symbols,
            "asset_type": ["etf"] * len(etfs) + ["stock"] * stocks,
            "gics_sector": [None] * len(etfs) + [sector_names[s] for s in sector_of],
            "gics_sub_industry": None,
        }
    )
    return panel, classify(raw, Mappings.load(), market_etf="SPY")


def _cut(panel: Panel, t: int) -> Panel:
    """The panel's first t sessions (yesterday's data set)."""
    arrays: dict[str, Any] = {
        name: np.ascontiguousarray(getattr(panel, name)[:, :t]) for name in PANEL_FIELDS
    }
    return Panel(symbols=panel.symbols, sessions=panel.sessions[:t], **arrays)


def _bytes(folder: Path, only_new: bool = False) -> int:
    return sum(
        p.stat().st_size
        for p in folder.rglob("*")
        if p.is_file() and (not only_new or p.stat().st_nlink == 1)
    )


def _reset_peak() -> bool:
    """Start a new peak-RSS measurement (Linux: writing 5 to clear_refs resets VmHWM)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _status_mb(key: str) -> float | None:
    """A memory figure of this process from /proc (Linux), MB; None where unknown."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def _peak_mb() -> float | None:
    """Peak resident memory since the last `_reset_peak` (VmHWM), None where unknown."""
    return _status_mb("VmHWM")


class _AnonPeak:
    """The peak of this process's anonymous resident memory (Linux RssAnon, sampled every
    10 ms) while in the block: what a build needs. VmHWM also counts the pages of the chunk
    files a build maps to read back (the long table's monthly rows read the whole version),
    page cache that the kernel can drop; both are reported."""

    def __enter__(self) -> _AnonPeak:
        self.mb: float | None = None
        self._stop = threading.Event()
        self._take()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _take(self) -> None:
        now = _status_mb("RssAnon")
        if now is not None and (self.mb is None or now > self.mb):
            self.mb = now

    def _watch(self) -> None:
        while not self._stop.wait(0.01):
            self._take()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._take()


def _worker_peak_mb() -> float:
    """Peak resident memory of this (worker) process, MB (Linux: ru_maxrss is in KB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _dask_full_build(
    home: Path, panel: Panel, master: pd.DataFrame, params: ModelParams, say: Callable[[str], None]
) -> dict[str, Any]:
    """The same full build on a Dask LocalCluster (`build --dask local`: one single-threaded
    worker process per core, each writing its blocks): seconds, and the peak memory of this
    (driver) process and of the largest worker. The bench starts the cluster as the build
    would, and the build connects to it, so that the workers can be asked their peak after."""
    workers = os.cpu_count() or 1
    say(f"full build on a Dask LocalCluster of {workers} workers")
    with dask_client("local", workers=workers) as client:
        held = _status_mb("VmRSS")  # what this process holds already: the bench's panels
        resets = _reset_peak()
        start = time.perf_counter()
        with _AnonPeak() as anon:
            built = publish_panel(
                home,
                panel,
                master,
                params,
                keep=5,
                dask=client.scheduler_info()["address"],
                full=True,
            )
        seconds = time.perf_counter() - start
        driver = _peak_mb() if resets else None
        peaks: dict[str, float] = client.run(_worker_peak_mb)
    return {
        "dask_workers": workers,
        "dask_full_build_s": round(seconds, 2),
        "dask_driver_peak_rss_mb": driver,
        "dask_driver_peak_anon_mb": anon.mb,
        "dask_driver_rss_before_mb": held,
        "dask_worker_peak_rss_mb": max(peaks.values()),
        "dask_version": built["model_version"],
    }


_STEP = "chunk_step"  # the accuracy record's step, as `accuracy_store.RecordThread` calls it


class _AccuracyClock:
    """The seconds (wall and CPU) a build spends in the accuracy record's steps: the build's
    `chunk_step` timed where its thread calls it, for the block only (what the record costs
    inside the very build the bench times, not a separate run). The steps run on a thread of
    their own beside the next chunk's model: their CPU is that thread's (its kernels are
    serial), and their wall is not the build's unless the build waits for them."""

    def __enter__(self) -> _AccuracyClock:
        from eqrisk.build import accuracy_store

        self.wall = self.cpu = 0.0
        self._module, self._step = accuracy_store, getattr(accuracy_store, _STEP)

        def timed(*args: Any, **kw: Any) -> Any:
            w0, c0 = time.perf_counter(), time.thread_time()
            try:
                return self._step(*args, **kw)
            finally:
                self.wall += time.perf_counter() - w0
                self.cpu += time.thread_time() - c0

        setattr(accuracy_store, _STEP, timed)
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(self._module, _STEP, self._step)

    def figures(self, prefix: str, wall: float, cpu: float) -> dict[str, Any]:
        return {
            f"{prefix}_accuracy_s": round(self.wall, 2),
            f"{prefix}_accuracy_share": round(self.wall / wall, 3) if wall else None,
            f"{prefix}_accuracy_cpu_s": round(self.cpu, 2),
            f"{prefix}_accuracy_cpu_share": round(self.cpu / cpu, 3) if cpu else None,
        }


def run_model_builds(
    n: int,
    t: int,
    *,
    seed: int = 0,
    folder: Path | None = None,
    check: bool = False,
    say: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    """Full build of t sessions, then the one-session incremental build of t + 1: seconds,
    disk, files written; the full build again on a Dask LocalCluster; with `check`, the Dask
    version and a full rebuild of t + 1 compared bitwise with the local ones."""
    work = Path(tempfile.mkdtemp(prefix="eqrisk-bench-model-", dir=folder))
    try:
        panel, master = synthetic_market(n, t + 1, seed)
        home = work / "home"
        params = ModelParams()
        say(f"full build of {n} x {t} (the model and every file)")
        held = _status_mb("VmRSS")  # the synthetic panel, before any build
        resets = _reset_peak()
        start, cpu = time.perf_counter(), time.process_time()
        with _AnonPeak() as full_anon, _AccuracyClock() as full_acc:
            first = publish_panel(home, _cut(panel, t), master, params, keep=5, full=True)
        full_s, full_cpu = time.perf_counter() - start, time.process_time() - cpu
        full_peak = _peak_mb() if resets else None
        say("one-session incremental build")
        resets = _reset_peak()
        start, cpu = time.perf_counter(), time.process_time()
        with _AnonPeak() as incremental_anon, _AccuracyClock() as incremental_acc:
            second = publish_panel(home, panel, master, params, keep=5)
        incremental_s, incremental_cpu = time.perf_counter() - start, time.process_time() - cpu
        incremental_peak = _peak_mb() if resets else None
        root = snapshots_dir(home)
        whole = _bytes(root / first["model_version"])
        added = _bytes(root / second["model_version"], only_new=True)
        out: dict[str, Any] = {
            "model_symbols": n,
            "model_sessions": t,
            "full_build_s": round(full_s, 2),
            "incremental_build_s": round(incremental_s, 2),
            "incremental_mode": second["build"]["mode"],
            "incremental_from_chunk": second["build"].get("from_chunk"),
            "incremental_files_written": second["storage"]["chunks_written"],
            "incremental_files_shared": second["storage"]["chunks_shared"],
            "model_version_mb": round(whole / 1e6, 1),
            "incremental_added_mb": round(added / 1e6, 3),
            "incremental_added_pct": round(100 * added / whole, 3),
            # Peak memory of this process during each build (the panels of t and t + 1
            # included): resident (with mapped chunk files) and anonymous (`_AnonPeak`).
            "full_build_peak_rss_mb": full_peak,
            "full_build_peak_anon_mb": full_anon.mb,
            "full_build_rss_before_mb": held,
            "incremental_build_peak_rss_mb": incremental_peak,
            "incremental_build_peak_anon_mb": incremental_anon.mb,
            # The accuracy record's steps inside each build (wall and CPU of this process).
            **full_acc.figures("full_build", full_s, full_cpu),
            **incremental_acc.figures("incremental_build", incremental_s, incremental_cpu),
        }
        dask = _dask_full_build(work / "dask-home", _cut(panel, t), master, params, say)
        dask_version = dask.pop("dask_version")
        out.update(dask)
        if check:
            a = Snapshot.open(root / first["model_version"])
            b = Snapshot.open(snapshots_dir(work / "dask-home") / dask_version)
            out["dask_equals_local"] = all(
                chunks.same_bits(np.asarray(a.array(f)), np.asarray(b.array(f)))
                for f in first["fields"]
            ) and a.security_history().equals(b.security_history())
            say("full rebuild of the same data, compared bitwise")
            again = publish_panel(home, panel, master, params, keep=5, full=True)
            a = Snapshot.open(root / second["model_version"])
            b = Snapshot.open(root / again["model_version"])
            out["incremental_equals_full"] = all(
                chunks.same_bits(np.asarray(a.array(f)), np.asarray(b.array(f)))
                for f in again["fields"]
            ) and a.security_history().equals(b.security_history())
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)

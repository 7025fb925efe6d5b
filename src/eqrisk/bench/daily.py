"""`eqrisk bench daily`: the daily job end to end, each command in its own process, as cron
runs it, on a synthetic ingested data set of 5,000 symbols x 7,560 sessions by default:

- the full build (`eqrisk build` on a data set no version was built from),
- the daily job (`eqrisk update FILE`: the next NYSE session of every symbol merged, then the
  incremental build), with the CLI's own time of each stage and the memory of each,
- the full build on a Dask LocalCluster at two universe sizes (n and n / 2): the driver's
  peak (`eqrisk build --dask ADDRESS` in its own process) and each worker's, measured in the
  worker (the bench starts the cluster, so that it can ask the workers after the build).

Each figure is the child process's: its wall time, its peak resident memory as the kernel
keeps it (`wait4`'s ru_maxrss: every resident page, file pages mapped included) and its peak
anonymous memory (RssAnon, sampled every 10 ms from /proc). MB are 10^6 bytes. Writing the
data sets is setup (in a child too, so that no figure counts the bench's own memory).

The data set: `bench.incremental.synthetic_market` (SPY, the sector ETFs and stocks each on
its sector ETF, a third listed later) on the NYSE sessions from 1996, with open, high, low,
raw close and volume derived from the close, and share counts in the master (market caps),
written by `write_ingested` with the meta an ingest writes. The day's file holds the session
after the last for every symbol, as a vendor's LONG CSV (date, symbol, open, high, low, close,
adjusted_close, volume).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from eqrisk.bench.incremental import synthetic_market
from eqrisk.data.calendar import sessions_between
from eqrisk.data.daily import basis_for
from eqrisk.data.ingested import ingested_dir, write_ingested
from eqrisk.data.panel import PRICE_COLUMNS, RAW_MASTER_COLUMNS
from eqrisk.snapshot.versions import current_version, snapshots_dir

FIRST_SESSION = "1996-01-02"
DATA_SOURCE = "bench-daily-synthetic"
DAY_FILE = "day.csv"
# The targets: the daily job at most 3 s and under 2 GB, the full build at most 25 s and 2 GB
# (issue 35); the Dask driver's peak at n symbols at most this many times its peak at n / 2
# (independent of the universe).
DAILY_S, DAILY_MB, FULL_S, FULL_MB, DRIVER_RATIO = 3.0, 2000.0, 25.0, 2000.0, 1.10
WRITE_BLOCK = 16 << 20  # the write floor's buffer
_DONE = re.compile(r"done (\w+) in ([0-9.]+)s")


@dataclass(frozen=True)
class DailyBench:
    symbols: int = 5000
    sessions: int = 7560
    seed: int = 0
    dask: bool = True  # the Dask driver and workers at symbols and symbols // 2
    dask_workers: int | None = None  # default: one per core
    reference_full_s: float | None = None  # the full build's time to be no slower than
    folder: Path | None = None  # where to work (a temporary folder by default)


QUICK = DailyBench(symbols=300, sessions=1000)


# ---------------------------------------------------------------------------------------------
# Setup: the data set and the day's file (run in a child process by `run`).


def synthetic_prices(n: int, t: int, seed: int) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(the long price frame of t sessions, the rows of the session after them, the raw
    master) of the synthetic market of n symbols on the NYSE sessions from 1996."""
    days = sessions_between(FIRST_SESSION, "2100-01-01")
    if len(days) < t + 1:
        raise ValueError(f"the NYSE calendar holds {len(days)} sessions from 1996, not {t + 1}")
    panel, master = synthetic_market(n, t + 1, seed)
    close = panel.close
    rng = np.random.default_rng(seed + 1)
    opened = close * (1.0 + rng.normal(0.0, 0.004, close.shape))
    high = np.fmax(opened, close) * (1.0 + np.abs(rng.normal(0.0, 0.004, close.shape)))
    low = np.fmin(opened, close) * (1.0 - np.abs(rng.normal(0.0, 0.004, close.shape)))
    volume = np.where(np.isnan(close), np.nan, np.floor(rng.uniform(1e5, 5e7, close.shape)))
    values = {"close": close, "open": opened, "high": high, "low": low, "close_raw": close,
              "volume": volume}  # fmt: skip

    def long(cols: slice) -> pd.DataFrame:
        live = ~np.isnan(close[:, cols])
        rows, at = np.nonzero(live)  # row-major: by symbol, then date
        frame = {
            "date": days[(cols.start or 0) + at].to_numpy(),
            "symbol": panel.symbols[rows],
            **{name: v[:, cols][live] for name, v in values.items()},
            "market_cap": np.full(len(rows), np.nan),
        }
        return pd.DataFrame(frame, columns=PRICE_COLUMNS)

    stocks = (master["asset_type"] == "stock").to_numpy()
    shares = np.where(stocks, np.floor(rng.uniform(1e7, 2e9, len(master))), np.nan)
    raw = master.reindex(columns=RAW_MASTER_COLUMNS).assign(shares=shares)
    return long(slice(0, t)), long(slice(t, t + 1)), raw


def ingest_meta(prices: pd.DataFrame, master: pd.DataFrame) -> dict[str, Any]:
    """The meta.json `eqrisk ingest` writes for a first ingest of these rows, none rejected."""
    basis = basis_for({}, None, merge=False)
    rows = len(prices)
    return {
        "data_source": DATA_SOURCE,
        "files": [],
        "merged_files": [],
        "ingested_at": datetime.now(UTC).isoformat(),
        "report_dir": None,
        "merge": False,
        "basis": basis,
        "cap_dates": {},
        "max_move": basis["max_move"],
        "prices_basis": basis["prices_basis"],
        "actions": None,
        "return_breaks": [],
        "return_decisions": [],
        "counts": {
            "rows_read": rows,
            "rows_kept": rows,
            "rows_rejected": 0,
            "rows_flagged": 0,
            "rows_stored": rows,
            "symbols": int(prices["symbol"].nunique()),
            "sessions": int(prices["date"].nunique()),
            "master_rows": len(master),
        },
    }


def write_data_set(home: Path, n: int, t: int, seed: int, day_file: Path | None) -> dict[str, Any]:
    """The ingested data set of n x t into `home`; with `day_file`, the next session's rows
    written there as a vendor's LONG CSV. Returns what was written."""
    prices, day, master = synthetic_prices(n, t, seed)
    write_ingested(home, prices, master, ingest_meta(prices, master))
    out = {
        "rows": len(prices),
        "last_session": str(prices["date"].max().date()),
        "parquet_mb": round(
            sum(f.stat().st_size for f in ingested_dir(home).rglob("*.parquet")) / 1e6, 1
        ),
    }
    if day_file is not None:
        vendor = day.rename(columns={"close": "adjusted_close"}).assign(close=day["close_raw"])
        vendor["date"] = vendor["date"].dt.strftime("%Y-%m-%d")
        columns = ["date", "symbol", "open", "high", "low", "close", "adjusted_close", "volume"]
        vendor[columns].to_csv(day_file, index=False)
        out.update(day_rows=len(day), day=str(day["date"].iloc[0].date()))
    return out


def _setup_main(argv: Sequence[str]) -> None:
    """The setup child: a JSON list of `write_data_set`'s arguments (home, n, t, seed,
    day_file or null); prints the list of its answers."""
    answers = [
        write_data_set(Path(home), n, t, seed, Path(day) if day else None)
        for home, n, t, seed, day in json.loads(argv[0])
    ]
    sys.stdout.write(json.dumps(answers) + "\n")


# ---------------------------------------------------------------------------------------------
# A child process, measured.


@dataclass
class Child:
    """One finished child process: wall time, the kernel's peak resident memory (ru_maxrss of
    `wait4`), the (time, VmRSS, RssAnon) samples in MB, its stderr lines with their arrival
    time, its stdout."""

    seconds: float
    peak_rss_mb: float
    cpu_s: float = 0.0  # user + system, from `wait4`'s rusage
    samples: list[tuple[float, float, float]] = field(default_factory=list)
    lines: list[tuple[float, str]] = field(default_factory=list)
    stdout: str = ""

    def sampled(self, start: float = 0.0, stop: float = float("inf")) -> tuple[float, float]:
        """Peak (VmRSS, RssAnon) sampled between two times (s from the start), MB."""
        inside = [(rss, anon) for at, rss, anon in self.samples if start <= at <= stop]
        if not inside:
            return 0.0, 0.0
        return max(r for r, _ in inside), max(a for _, a in inside)

    def stages(self) -> dict[str, tuple[float, float]]:
        """The CLI's `done STAGE in Xs` lines: stage -> (its seconds, when the line came)."""
        found = {}
        for at, line in self.lines:
            if match := _DONE.search(line):
                found[match.group(1)] = (float(match.group(2)), at)
        return found

    def json(self) -> Any:
        return json.loads(self.stdout)


def _memory_mb(pid: int) -> tuple[float, float] | None:
    """(VmRSS, RssAnon) of a process, MB; None once it has gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    if "VmRSS" not in found or "RssAnon" not in found:
        return None  # a zombie: its memory is gone
    kb = (int(found[k].split()[0]) for k in ("VmRSS", "RssAnon"))
    rss, anon = (v * 1024 / 1e6 for v in kb)
    return rss, anon


def run_child(args: Sequence[str], *, env: dict[str, str], cwd: Path) -> Child:
    """Run `args`, sampling its memory every 10 ms; raise RuntimeError when it fails."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd, text=True
    )
    child = Child(0.0, 0.0)
    done = threading.Event()
    chunks: list[str] = []

    def sample() -> None:
        while not done.is_set():
            now = _memory_mb(proc.pid)
            if now is not None:
                child.samples.append((time.perf_counter() - start, *now))
            done.wait(0.01)

    def read_err() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            child.lines.append((time.perf_counter() - start, line.rstrip("\n")))

    def read_out() -> None:
        assert proc.stdout is not None
        chunks.append(proc.stdout.read())

    threads = [threading.Thread(target=f, daemon=True) for f in (sample, read_err, read_out)]
    for thread in threads:
        thread.start()
    _, status, usage = os.wait4(proc.pid, 0)
    child.seconds = time.perf_counter() - start
    done.set()
    proc.returncode = os.waitstatus_to_exitcode(status)
    for thread in threads:
        thread.join()
    child.peak_rss_mb = round(usage.ru_maxrss * 1024 / 1e6, 1)  # Linux: KiB
    child.cpu_s = round(usage.ru_utime + usage.ru_stime, 2)
    child.stdout = "".join(chunks)
    if proc.returncode != 0:
        tail = "\n".join(line for _, line in child.lines[-20:])
        raise RuntimeError(f"{' '.join(args[:4])}... exited {proc.returncode}:\n{tail}")
    return child


# ---------------------------------------------------------------------------------------------
# The bench.


def _worker_peak_mb() -> float:
    """Peak resident memory of the process this runs in (a Dask worker), MB."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6, 1)


def _verdict(ok: bool | None, target: str) -> str:
    word = "not compared" if ok is None else "pass" if ok else "fail"
    return f"{target}: {word}"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


class _Runner:
    """The children of one bench: the environment of each (its own home, no EQRISK_* of the
    caller's, no eqrisk.toml: the working folder is theirs) and the CLI's command line."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("EQRISK_")}

    def run(self, home: Path, *args: str) -> Child:
        env = {**self.env, "EQRISK_HOME": str(home)}
        return run_child([sys.executable, *args], env=env, cwd=self.work)

    def cli(self, home: Path, *args: str) -> Child:
        return self.run(home, "-m", "eqrisk.cli", *args)

    def setup(self, *sets: tuple[Path, int, int, int, Path | None]) -> list[dict[str, Any]]:
        """`write_data_set` of each (home, n, t, seed, day_file), in one child process."""
        code = "import sys; from eqrisk.bench.daily import _setup_main; _setup_main(sys.argv[1:])"
        jobs = [[str(home), n, t, seed, day and str(day)] for home, n, t, seed, day in sets]
        child = self.run(sets[0][0], "-c", code, json.dumps(jobs))
        answers: list[dict[str, Any]] = child.json()
        answers[0]["seconds"] = round(child.seconds, 1)
        return answers


def _dask_build(runner: _Runner, home: Path, workers: int) -> dict[str, Any]:
    """`eqrisk build --full --dask ADDRESS` on a LocalCluster this process starts: the
    driver's figures (the child) and the largest worker's peak, asked of the workers."""
    from eqrisk.build.distributed import dask_client

    with dask_client("local", workers=workers) as client:
        address = client.scheduler_info()["address"]
        child = runner.cli(home, "build", "--full", "--dask", address, "--json")
        peaks: dict[str, float] = client.run(_worker_peak_mb)
    _, anon = child.sampled()
    return {
        "symbols": child.json()["universe_size"],
        "s": round(child.seconds, 2),
        "driver_peak_rss_mb": child.peak_rss_mb,
        "driver_peak_anon_mb": round(anon, 1),
        "worker_peak_rss_mb": max(peaks.values()),
        "mode": child.json()["build"]["mode"],
    }


def run(b: DailyBench, say: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """The bench in a temporary folder (removed after)."""
    work = Path(tempfile.mkdtemp(prefix="eqrisk-bench-daily-", dir=b.folder))
    try:
        return measure(b, work, say)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(
    b: DailyBench, work: Path, say: Callable[[str], None] = lambda _m: None
) -> dict[str, Any]:
    """The bench in `work` (left there: `work/home` holds the data set and its versions)."""
    n, t = b.symbols, b.sessions
    work.mkdir(parents=True, exist_ok=True)
    runner = _Runner(work)
    home, day = work / "home", work / DAY_FILE
    out: dict[str, Any] = {
        "symbols": n,
        "sessions": t,
        "cores": os.cpu_count(),
        "load_average_start": _load(),
    }
    workers = b.dask_workers or os.cpu_count() or 1
    half = max(n // 2, 13)  # the synthetic market's least
    small_home = work / "home-half"
    sets = [(home, n, t, b.seed, day)] + ([(small_home, half, t, b.seed, None)] if b.dask else [])
    sizes = " and ".join(f"{size[1]} x {t}" for size in sets)
    say(f"writing the ingested data sets of {sizes} and the next session's file (setup)")
    data = runner.setup(*sets)[0]
    out.update(
        setup_s=data["seconds"],
        data_set_rows=data["rows"],
        data_set_parquet_mb=data["parquet_mb"],
        last_session=data["last_session"],
    )

    say("eqrisk build (the full build, in its own process)")
    os.sync()  # the setup's writes on disk: the build starts with no dirty pages
    full = runner.cli(home, "build", "--json")
    _, full_anon = full.sampled()
    out.update(_full_figures(full, b.reference_full_s))
    out["full_build_peak_anon_mb"] = round(full_anon, 1)
    built = _built(home)  # its write floor is measured last: writing 13 GB at 5,000 x 7,560
    # would push the data set and the version out of the page cache the daily job reads

    whole = work / "home-whole"
    shutil.copytree(ingested_dir(home), ingested_dir(whole), copy_function=os.link)
    say(f"eqrisk update {DAY_FILE} (the daily job: {data['day_rows']} rows of {data['day']})")
    # The full build's 13 GB on disk first: the daily job runs a day after the last build, not
    # while the disk still takes its writes (the job read 16.5 s right after a 110 s build,
    # 5.3-5.9 s after a sync, 5,000 x 7,560).
    os.sync()
    job = runner.cli(home, "update", str(day), "--json")
    out.update(_daily_figures(job, data, home))
    say("the same merge over the whole history (the alternative: ingest(..., whole=True))")
    code = (
        "import sys, pathlib, time; from eqrisk.data.ingest import ingest; "
        "t = time.perf_counter(); "
        "ingest([pathlib.Path(sys.argv[2])], None, home=pathlib.Path(sys.argv[1]), merge=True, "
        "whole=True); print(time.perf_counter() - t)"
    )
    alt = runner.run(whole, "-c", code, str(whole), str(day))
    merge_s, alt_s = out["daily_merge_s"], float(alt.stdout.split()[-1])
    out.update(
        whole_merge_s=round(alt_s, 2),
        whole_merge_peak_rss_mb=alt.peak_rss_mb,
        whole_over_windowed_time=round(alt_s / max(merge_s, 1e-9), 1),
        whole_over_windowed_memory=round(
            alt.peak_rss_mb / max(out["daily_merge_peak_rss_mb"], 1e-9), 1
        ),
    )

    if b.dask:
        say(f"the full build on a Dask LocalCluster of {workers} workers: {n} symbols")
        large = _dask_build(runner, home, workers)
        say(f"the full build on a Dask LocalCluster of {workers} workers: {half} symbols")
        small = _dask_build(runner, small_home, workers)
        ratio = large["driver_peak_rss_mb"] / small["driver_peak_rss_mb"]
        out["dask_workers"] = workers
        for size, figures in (("large", large), ("small", small)):
            out.update({f"dask_{size}_{k}": v for k, v in figures.items()})
        out["dask_driver_peak_ratio"] = round(ratio, 3)
        out["dask_driver_peak_ratio_target"] = _verdict(
            ratio <= DRIVER_RATIO, f"<= {DRIVER_RATIO} (the driver's peak independent of n)"
        )
    say("the write floor: the full build's version written again as files of the same sizes")
    out.update(_write_floor(built, work / "floor", full.seconds))
    out["load_average_end"] = _load()
    return out


def _built(home: Path) -> Path:
    """The folder of the version a build just published in `home`."""
    version = current_version(home)
    if version is None:
        raise RuntimeError(f"no version was published in {home}")
    return snapshots_dir(home) / version


def _full_figures(full: Child, reference_s: float | None) -> dict[str, Any]:
    """The full build's figures against issue 35's targets (and a reference run's time)."""
    faster = None if reference_s is None else full.seconds <= reference_s
    reference = (
        "a reference run's (--reference-full-s)" if reference_s is None else f"{reference_s:g} s"
    )
    return {
        "full_build_mode": full.json()["build"]["mode"],
        "full_build_s": round(full.seconds, 2),
        "full_build_cpu_s": full.cpu_s,
        "full_build_s_target": _verdict(full.seconds <= FULL_S, f"<= {FULL_S:g} s"),
        "full_build_vs_reference": _verdict(faster, f"<= {reference}"),
        "full_build_peak_rss_mb": full.peak_rss_mb,
        "full_build_peak_rss_target": _verdict(full.peak_rss_mb <= FULL_MB, f"<= {FULL_MB:.0f} MB"),
    }


def _write_floor(version: Path, scratch: Path, build_s: float) -> dict[str, Any]:
    """The time to write a version's bytes alone: every file of `version` as a file of the
    same size in `scratch` (one reused buffer of random bytes, no fsync: as the build writes,
    the page cache's dirty limit and the disk's rate included), after an `os.sync` so that
    nothing of the build is still being written. `scratch` is removed after."""
    sizes = [
        os.path.getsize(os.path.join(here, name))
        for here, _dirs, names in os.walk(version)
        for name in names
    ]
    block = np.random.default_rng(0).integers(0, 256, WRITE_BLOCK, dtype=np.uint8).tobytes()
    view = memoryview(block)
    scratch.mkdir(parents=True, exist_ok=True)
    os.sync()
    start = time.perf_counter()
    try:
        for i, size in enumerate(sizes):
            with open(scratch / f"{i}.bin", "wb", buffering=0) as fh:
                for at in range(0, size, WRITE_BLOCK):
                    fh.write(view[: min(WRITE_BLOCK, size - at)])
        seconds = time.perf_counter() - start
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {
        "version_files": len(sizes),
        "version_gb": round(sum(sizes) / 1e9, 2),
        "write_floor_s": round(seconds, 4),  # a small run writes its files in a millisecond or two
        "full_build_over_write_floor": round(build_s / max(seconds, 1e-9), 2),
    }


def _daily_figures(job: Child, data: dict[str, Any], home: Path) -> dict[str, Any]:
    """The daily job's figures: the whole process, and each stage the CLI reports (its own
    time; the memory sampled while it ran), checked against what the job should have done."""
    stages = job.stages()
    merge_s, merge_end = stages["ingest"]
    build_s, _ = stages["build"]
    merge_rss, merge_anon = job.sampled(0.0, merge_end)
    build_rss, build_anon = job.sampled(merge_end)
    summary = job.json()
    meta = json.loads((ingested_dir(home) / "meta.json").read_text())
    return {
        "daily_new_session": data["day"],
        "daily_job_s": round(job.seconds, 2),
        "daily_job_cpu_s": job.cpu_s,
        "daily_job_s_target": _verdict(job.seconds <= DAILY_S, f"<= {DAILY_S:g} s"),
        "daily_job_peak_rss_mb": job.peak_rss_mb,
        "daily_job_peak_rss_target": _verdict(job.peak_rss_mb < DAILY_MB, f"< {DAILY_MB:.0f} MB"),
        "daily_job_peak_anon_mb": round(max(merge_anon, build_anon), 1),
        # Python's start, the imports and the rest of the CLI: the time outside its two stages.
        "daily_outside_stages_s": round(job.seconds - merge_s - build_s, 2),
        "daily_merge_s": merge_s,
        "daily_merge_peak_rss_mb": round(merge_rss, 1),
        "daily_merge_peak_anon_mb": round(merge_anon, 1),
        "daily_build_s": build_s,
        "daily_build_peak_rss_mb": round(build_rss, 1),
        "daily_build_peak_anon_mb": round(build_anon, 1),
        "daily_build_mode": summary["build"]["mode"],
        "daily_build_from_session": summary["build"].get("from_session"),
        "daily_data_set_sessions": meta["counts"]["sessions"],
        "daily_version": summary["model_version"],
        "daily_version_sessions": summary["sessions"],
        "daily_version_data_as_of": summary["data_as_of"],
    }

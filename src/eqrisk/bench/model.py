"""`eqrisk bench model`: the L3 cascade over a large synthetic panel, each figure next to its
reference measured in the same run: the memory-bandwidth floor of the bytes the kernel writes,
statsmodels RollingOLS per stock (what a user would otherwise write) and polars' rolling
covariance for the market beta alone, with the answers compared.

The floor, a fill of the kernel's outputs, the kernel and polars are timed in turn, once each a
round, for `rounds` rounds, and each figure is the best of its rounds: on a shared machine the
load changes from one second to the next, and a reference timed at a quieter moment than the
kernel (or more often) says little about either.

The kernel is timed twice: into fresh outputs (the operating system zeroes every new page
first, which shows as system time) and into outputs that already exist (the snapshot's
memory-mapped files, a reused block buffer), which is the kernel's own cost.

On a virtual machine, memory the guest has not used lately costs far more on its first touch
than the zeroing itself: the hypervisor backs each page then. With free page reporting (Linux
guests on KVM; the development machine has it), memory a process frees is handed back to the
host within seconds, so a fresh allocation pays that again. The bench prints it on its own
(`first_touch_*`: the same number of bytes touched once by a plain fill, then freed), so that
the fresh-outputs figure can be read against it: the same cost with no kernel in it.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np

from eqrisk.model.cascade import CASCADE_FIELDS, rolling_cascade, rolling_std

HEDGE_FIELDS = ("l3_mkt_hr", "l3_sec_hr", "l3_sub_hr")


@dataclass(frozen=True)
class ModelBench:
    symbols: int = 5000
    sessions: int = 7560
    window: int = 252
    min_obs: int = 126
    baseline_symbols: int = 50
    seed: int = 0
    rounds: int = 3  # the floor, the kernel and polars in turn, each timed once a round


QUICK = ModelBench(symbols=60, sessions=700, baseline_symbols=50, rounds=2)


def synthetic_returns(b: ModelBench) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(stock returns n x T, factor returns F x T, factor index n x 3): 11 sectors and 20
    subsectors over one market, every stock fully observed (so RollingOLS windows agree)."""
    rng = np.random.default_rng(b.seed)
    t = b.sessions
    m = rng.standard_t(5, t) * 0.01
    sec = 0.9 * m + rng.normal(0, 0.006, (11, t))
    sub = 0.5 * m + 0.6 * sec[np.arange(20) % 11] + rng.normal(0, 0.008, (20, t))
    factors = np.vstack([m, sec, sub])
    fidx = np.empty((b.symbols, 3), dtype=np.int64)
    fidx[:, 0] = 0
    sub_of = rng.integers(0, 20, b.symbols)
    fidx[:, 1] = 1 + sub_of % 11
    fidx[:, 2] = 12 + sub_of
    betas = rng.uniform(0.2, 1.4, (b.symbols, 3))
    returns = np.empty((b.symbols, t))
    for lo in range(0, b.symbols, 1000):
        hi = min(b.symbols, lo + 1000)
        x = factors[fidx[lo:hi]]  # (k, 3, T)
        returns[lo:hi] = np.einsum("kj,kjt->kt", betas[lo:hi], x) + rng.normal(
            0, 0.015, (hi - lo, t)
        )
    return returns, factors, fidx


@dataclass
class Usage:
    """Wall, user and system seconds and minor page faults of one timed block."""

    wall: float = 0.0
    user: float = 0.0
    system: float = 0.0
    page_faults: int = 0

    def figures(self, prefix: str) -> dict[str, Any]:
        return {
            f"{prefix}_wall_s": round(self.wall, 3),
            f"{prefix}_user_s": round(self.user, 3),
            f"{prefix}_system_s": round(self.system, 3),
            f"{prefix}_system_share": round(self.system / self.wall, 3) if self.wall else 0.0,
            f"{prefix}_page_faults": self.page_faults,
        }


@contextmanager
def timed() -> Iterator[Usage]:
    """Resource usage of the process over the block (the kernel's threads included)."""
    usage = Usage()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    yield usage
    usage.wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    usage.user = r1.ru_utime - r0.ru_utime
    usage.system = r1.ru_stime - r0.ru_stime
    usage.page_faults = r1.ru_minflt - r0.ru_minflt


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (ru_maxrss is in kB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class CopyFloor:
    """A plain copy (numpy, one thread) into memory already mapped: the machine's write
    bandwidth for output that is written once, in bytes written per second. Each `time()` is
    one copy, so that the floor is timed as often, and as interleaved with the load of the
    moment, as the kernel beside it."""

    def __init__(self, nbytes: int) -> None:
        n = max(nbytes // 8, 1 << 16)
        self.src = np.ones(n)
        self.dst = np.zeros(n)  # np.zeros maps lazily: fault every page in before timing
        self.dst.fill(2.0)

    def bandwidth(self) -> float:
        t0 = time.perf_counter()
        np.copyto(self.dst, self.src)
        return self.dst.nbytes / (time.perf_counter() - t0)


def fill_seconds(arrays: list[np.ndarray]) -> float:
    """One plain fill (numpy, one thread) of the given arrays: the kernel's own bytes written
    into its own outputs, with nothing read (a copy also reads what it writes)."""
    t0 = time.perf_counter()
    for a in arrays:
        a.fill(0.5)
    return time.perf_counter() - t0


def first_touch(nbytes: int) -> None:
    """Touch `nbytes` of new memory once with a plain fill and free it: what new memory
    costs this machine with no kernel in it (see the module docstring)."""
    buffer = np.empty(max(nbytes // 8, 1))
    buffer.fill(1.0)
    del buffer


def run_kernel(
    b: ModelBench,
    returns: np.ndarray,
    factors: np.ndarray,
    fidx: np.ndarray,
    out: dict[str, np.ndarray] | None = None,
    vol: np.ndarray | None = None,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """What the bench times: the cascade and the window's volatility (17 output arrays)."""
    out = rolling_cascade(returns, factors, fidx, window=b.window, min_obs=b.min_obs, out=out)
    vol = rolling_std(returns, window=b.window, min_obs=b.min_obs, out=vol)
    return out, vol


def rolling_ols(b: ModelBench, returns: np.ndarray, factors: np.ndarray, fidx: np.ndarray) -> Any:
    """RollingOLS per stock on the first `baseline_symbols`: per-stock seconds and the fits."""
    from statsmodels.regression.rolling import RollingOLS

    seconds, fits = [], []
    for i in range(min(b.baseline_symbols, b.symbols)):
        t0 = time.perf_counter()
        x = np.column_stack([np.ones(b.sessions), factors[fidx[i]].T])
        res = RollingOLS(returns[i], x, window=b.window, min_nobs=b.min_obs, expanding=True)
        fits.append(res.fit(params_only=True).params)
        seconds.append(time.perf_counter() - t0)
    return np.array(seconds), fits


def polars_market_beta(
    b: ModelBench, returns: np.ndarray, market: np.ndarray
) -> Callable[[], tuple[float, np.ndarray]]:
    """Every stock's rolling market beta as a polars user writes it (rolling cov / rolling var
    over a wide frame, one column per stock): a call runs the rolling step and returns its
    seconds and the betas (n x T). The frame is built once."""
    import polars as pl

    names = [f"s{i}" for i in range(returns.shape[0])]
    frame = pl.DataFrame({"m": market, **dict(zip(names, returns, strict=True))})
    var_m = pl.col("m").rolling_var(b.window, min_samples=b.min_obs)

    def step() -> tuple[float, np.ndarray]:
        t0 = time.perf_counter()
        betas = frame.select(
            [(pl.rolling_cov(n, "m", window_size=b.window, min_samples=b.min_obs) / var_m)
             .alias(n) for n in names]
        )  # fmt: skip
        seconds = time.perf_counter() - t0
        return seconds, betas.to_numpy().T

    return step


def _quartiles(x: np.ndarray) -> tuple[float, float, float]:
    q1, q2, q3 = np.percentile(x, [25, 50, 75])
    return float(q1), float(q2), float(q3)


@dataclass
class Rounds:
    """Each reference and the kernel timed once a round, in turn, so that all of them meet the
    same load: the copy floor's bandwidth, a fill of the kernel's outputs, the kernel into its
    existing outputs and polars' rolling step."""

    bandwidth: list[float]
    fill: list[float]
    kernel: list[Usage]
    polars: list[float]

    def best_kernel(self) -> Usage:
        return min(self.kernel, key=lambda u: u.wall)

    def figures(self, bytes_written: int) -> dict[str, Any]:
        floors = [bytes_written / bw for bw in self.bandwidth]
        walls = [u.wall for u in self.kernel]
        return {
            "rounds": len(walls),
            "kernel_wall_s_rounds": [round(w, 5) for w in walls],
            "floor_s_rounds": [round(f, 6) for f in floors],
            "fill_outputs_s_rounds": [round(f, 4) for f in self.fill],
            "polars_market_beta_s_rounds": [round(p, 3) for p in self.polars],
            # The kernel over its floor within each round (the same moment's load).
            "kernel_over_floor_rounds": [round(w / f, 2) for w, f in zip(walls, floors, strict=True)],
            "speedup_vs_polars_rounds": [round(p / w, 2) for w, p in zip(walls, self.polars, strict=True)],
            "fill_outputs_s": round(min(self.fill), 4),
            "kernel_over_fill": round(min(walls) / min(self.fill), 2),
        }  # fmt: skip


def timed_rounds(
    b: ModelBench, inputs: tuple[np.ndarray, np.ndarray, np.ndarray], copy_bytes: int,
    out: dict[str, np.ndarray], vol: np.ndarray,
) -> tuple[Rounds, np.ndarray]:  # fmt: skip
    """`b.rounds` rounds of the floor, the fill, the kernel and polars (last betas returned);
    the kernel runs after the fill, so `out` and `vol` end with its numbers."""
    returns, factors, fidx = inputs
    floor = CopyFloor(copy_bytes)
    polars_step = polars_market_beta(b, returns, factors[0])
    rounds = Rounds([], [], [], [])
    beta = np.empty(0)
    for _ in range(b.rounds):
        rounds.bandwidth.append(floor.bandwidth())
        rounds.fill.append(fill_seconds([*out.values(), vol]))
        with timed() as kernel:
            run_kernel(b, returns, factors, fidx, out, vol)
        rounds.kernel.append(kernel)
        seconds, beta = polars_step()
        rounds.polars.append(seconds)
    return rounds, beta


def run(b: ModelBench, say: Callable[[str], Any] = print) -> dict[str, Any]:
    returns, factors, fidx = synthetic_returns(b)
    # Warm the JIT on a small slice so that compilation is not timed.
    small = ModelBench(window=b.window, min_obs=b.min_obs)
    run_kernel(small, returns[:2, :300], factors[:, :300], fidx[:2])
    n_arrays = len(CASCADE_FIELDS) + 1
    bytes_written = n_arrays * returns.size * 8
    # A copy well above the last-level cache (32 MB here), at most 1 GB.
    copy_bytes = min(max(bytes_written, 1 << 27), 1 << 30)

    say(f"first touch of {bytes_written / 1e9:.2f} GB of new memory (a plain fill) ...")
    with timed() as touch:
        first_touch(bytes_written)
    say(f"eqrisk cascade: {b.symbols} symbols x {b.sessions} sessions, fresh outputs ...")
    with timed() as fresh:
        out, vol = run_kernel(b, returns, factors, fidx)
    kept = {name: out[name][::97].copy() for name in ("l3_sub_hr", "n_obs")}
    say(
        f"{b.rounds} rounds, each: a plain copy of {copy_bytes / 1e6:.0f} MB (the floor), a fill"
        " of the outputs, the cascade into them, polars' rolling market beta ..."
    )
    load = os.getloadavg()[0]
    rounds, beta = timed_rounds(b, (returns, factors, fidx), copy_bytes, out, vol)
    load = max(load, os.getloadavg()[0])
    kernel = rounds.best_kernel()
    bandwidth = max(rounds.bandwidth)
    polars_s = min(rounds.polars)
    rewritten_equal = all(np.array_equal(out[k][::97], v, equal_nan=True) for k, v in kept.items())

    k = min(b.baseline_symbols, b.symbols)
    say(f"statsmodels RollingOLS: {k} symbols, one at a time ...")
    per_symbol, fits = rolling_ols(b, returns, factors, fidx)
    max_diff = 0.0
    for i, params in enumerate(fits):
        got = np.column_stack([out[f][i] for f in HEDGE_FIELDS])
        both = np.isfinite(params[:, 1:]) & np.isfinite(got)
        assert both.sum() > 0
        max_diff = max(max_diff, float(np.max(np.abs(got[both] - params[:, 1:][both]))))
        same_pub = np.array_equal(np.isfinite(got[:, 0]), np.isfinite(params[:, 1]))
        assert same_pub, "publication dates differ from RollingOLS"
    q1, q2, q3 = _quartiles(per_symbol)
    extrapolated = (q1 * b.symbols, q2 * b.symbols, q3 * b.symbols)

    ours = out["l1_mkt_hr"]
    both = np.isfinite(beta) & np.isfinite(ours)
    polars_diff = float(np.max(np.abs(beta[both] - ours[both]))) if both.any() else float("nan")
    polars_same_pub = bool(np.array_equal(np.isfinite(beta), np.isfinite(ours)))

    wall = kernel.wall
    threads = numba.get_num_threads()
    return {
        "symbols": b.symbols,
        "sessions": b.sessions,
        "window": b.window,
        "min_obs": b.min_obs,
        # Each figure is the best of its rounds (the floor: the fastest copy).
        **kernel.figures("kernel"),
        # On a shared machine the wall waits for cores: CPU seconds per kernel thread is the
        # wall the same work takes with that many free cores (at best), next to the load.
        "threads": threads,
        "kernel_cpu_per_thread_s": round((kernel.user + kernel.system) / threads, 3),
        "load_average_1m": round(load, 2),
        **fresh.figures("fresh_outputs"),
        **touch.figures("first_touch"),
        "rewrite_equals_first_run": rewritten_equal,
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "output_arrays": n_arrays,
        "bytes_written": bytes_written,
        "copy_bandwidth_gb_s": round(bandwidth / 1e9, 2),
        "floor_s": round(bytes_written / bandwidth, 4),
        "kernel_over_floor": round(wall / (bytes_written / bandwidth), 2),
        **rounds.figures(bytes_written),
        "rollingols_symbols_measured": k,
        "rollingols_seconds_measured": round(float(per_symbol.sum()), 3),
        "rollingols_per_symbol_ms_q1_median_q3": [round(q * 1e3, 2) for q in (q1, q2, q3)],
        "rollingols_seconds_extrapolated": round(extrapolated[1], 3),
        "rollingols_seconds_extrapolated_q1_q3": [round(extrapolated[0], 3), round(extrapolated[2], 3)],
        "speedup_vs_rollingols": round(extrapolated[1] / wall, 1),
        "speedup_vs_rollingols_q1_q3": [round(extrapolated[0] / wall, 1), round(extrapolated[2] / wall, 1)],
        "max_abs_diff_vs_rollingols": max_diff,
        "polars_market_beta_s": round(polars_s, 3),
        "speedup_vs_polars_market_beta": round(polars_s / wall, 2),
        "max_abs_diff_vs_polars_market_beta": polars_diff,
        "polars_same_publication": polars_same_pub,
    }  # fmt: skip

"""The kernel of `rolling_std` (`eqrisk.model.cascade`): the sample standard deviation of each
stock's returns over the last `window` sessions, two stocks at a time.

Each stock's sums are a chain in time (a session adds a deviation and drops one; every
`window` sessions the reference mean and the sums are recomputed from scratch, two more
chains), so one stock alone leaves the processor waiting on the previous addition: with two
stocks' chains in one loop it works on the other meanwhile (a quarter less CPU time). The
values (two divisions and a square root a session: what bounds the loop) are made from the
sums of TILE sessions at a time in a loop of selects, which the compiler runs in vector lanes
(0.086 s against 0.118 s at 5,000 x 7,560 on 2 threads). Each stock's operations are those it
had alone, in the same order: the same bits.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(cache=True, inline="always")
def _anchor_two(y, x, lo, hi):
    """For y and x: the reference mean of the finite values lo..hi (inclusive), then the sums
    of the deviations from it, of their squares, and the count."""
    ry = rx = 0.0
    my = mx = 0
    for s in range(lo, hi + 1):
        if np.isfinite(y[s]):
            ry += y[s]
            my += 1
        if np.isfinite(x[s]):
            rx += x[s]
            mx += 1
    ry = ry / my if my > 0 else 0.0
    rx = rx / mx if mx > 0 else 0.0
    y1 = y2 = x1 = x2 = 0.0
    ny = nx = 0
    for s in range(lo, hi + 1):
        if np.isfinite(y[s]):
            d = y[s] - ry
            y1 += d
            y2 += d * d
            ny += 1
        if np.isfinite(x[s]):
            d = x[s] - rx
            x1 += d
            x2 += d * d
            nx += 1
    return ry, y1, y2, ny, rx, x1, x2, nx


@njit(cache=True, inline="always")
def _move(y, t, window, ref, s1, s2, cnt):
    """The sums with session t added and session t - window dropped (finite values only)."""
    if np.isfinite(y[t]):
        d = y[t] - ref
        s1 += d
        s2 += d * d
        cnt += 1
    old = t - window
    if old >= 0 and np.isfinite(y[old]):
        d = y[old] - ref
        s1 -= d
        s2 -= d * d
        cnt -= 1
    return s1, s2, cnt


TILE = 256  # sessions whose sums are kept, then turned into values in one vector loop


@njit(cache=True, error_model="numpy")
def _values(s1, s2, cnt, nt, min_obs, out):
    """out[k] for k < nt from the sums s1, s2 and count of each session: the sample standard
    deviation (ddof=1), 0 where the variance is not positive, NaN below `min_obs` values (or
    2). Written as selects, without a branch or a zero-divisor check (a count below 2 divides
    by a stand-in and the result is not kept): a loop the compiler runs in vector lanes, where
    the divisions and roots that bound the kernel go several at a time."""
    for k in range(nt):
        c = cnt[k]
        ok = (c >= min_obs) & (c > 1)
        f = np.float64(c) if ok else 2.0
        var = (s2[k] - s1[k] * s1[k] / f) / (f - 1.0)
        root = np.sqrt(var if var > 0.0 else 0.0)
        out[k] = root if ok else np.nan


@njit(parallel=True, cache=True)
def rolling_std_all(returns, window, min_obs, start, out):
    """Sessions start..T-1 of every row into `out`, rows 2p and 2p + 1 in one loop (an odd last
    row is run beside itself and written once); the sums of TILE sessions at a time are kept,
    then turned into values (`_values`)."""
    n, n_t = returns.shape
    for p in prange((n + 1) // 2):
        i = 2 * p
        j = min(i + 1, n - 1)
        y = returns[i]
        x = returns[j]
        ys1 = np.empty(TILE)
        ys2 = np.empty(TILE)
        ycnt = np.empty(TILE, dtype=np.int64)
        xs1 = np.empty(TILE)
        xs2 = np.empty(TILE)
        xcnt = np.empty(TILE, dtype=np.int64)
        ry = y1 = y2 = rx = x1 = x2 = 0.0
        ny = nx = 0
        since_anchor = window  # sessions since the last anchor (t % window, without a division)
        k = 0  # sums kept
        first = start  # the session of kept sums' first
        for t in range(start - start % window, n_t):
            if since_anchor == window:
                since_anchor = 0
                lo = max(0, t - window + 1)
                ry, y1, y2, ny, rx, x1, x2, nx = _anchor_two(y, x, lo, t)
            else:
                y1, y2, ny = _move(y, t, window, ry, y1, y2, ny)
                x1, x2, nx = _move(x, t, window, rx, x1, x2, nx)
            since_anchor += 1
            if t < start:
                continue
            ys1[k] = y1
            ys2[k] = y2
            ycnt[k] = ny
            xs1[k] = x1
            xs2[k] = x2
            xcnt[k] = nx
            k += 1
            if k == TILE or t == n_t - 1:
                _values(ys1, ys2, ycnt, k, min_obs, out[i, first : first + k])
                if j != i:
                    _values(xs1, xs2, xcnt, k, min_obs, out[j, first : first + k])
                first += k
                k = 0

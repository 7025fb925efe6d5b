"""The style descriptors' windowed sums as a numba kernel (`styles.window_sums`): per row and
session t, the EWMA-weighted sum of x over the window of `size` sessions ending at t - lag,
weight 0.5^(o / halflife) for the value o sessions before the newest (flat weights: an
infinite half-life), missing values 0, and the number of values present.

The order of each sum is fixed by its window alone, so a window's bits do not depend on where
the array starts or which sessions are computed with it (a resumed run equals a full one):

- block sums b(e) = sum over i = 0..B-1 of c_i x(e - i), c_i = 0.5^(i / halflife), one per
  session e (i ascending);
- a window's sum: 0.0, plus d_j b(newest - B j) for j = 0, 1, .. (d_j = 0.5^(B j / halflife),
  the whole blocks, newest first), plus w_k x over the oldest size mod B values (w_k the
  window's own weights, oldest first).

Each block sum serves the B * (size // B) windows that hold it: about B + size / B products a
session instead of `size`, and the sessions of a tile run side by side in SIMD lanes. The
weight of a value is c_i d_j where the direct sum uses 0.5^((B j + i) / halflife): the same to
rounding (a sum differs from numpy's `(window * weights).sum()` by a few units in the last
place of the sum of |terms|; tested).
"""

from __future__ import annotations

import numba
import numpy as np

B = 8  # values per block sum
TILE = 256  # sessions summed side by side (their partial sums stay in the core's caches)
# The series summed, from x and y (n x T): x itself; x y and y y where both are finite (NaN
# elsewhere); x x; 1 where x is finite (NaN elsewhere): what numpy would make first, no copy.
MODES = {"x": 0, "xy": 1, "yy": 2, "xx": 3, "present": 4}


def factors(halflife: float, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The kernel's weights: c (B,) within a block, d (size // B,) of the blocks, newest first,
    and the oldest size mod B values' own weights (oldest first)."""
    c = np.asarray(0.5 ** (np.arange(B) / halflife), dtype=np.float64)
    d = np.asarray(0.5 ** (B * np.arange(size // B) / halflife), dtype=np.float64)
    rest = size % B
    o = np.arange(size - 1, size - 1 - rest, -1)  # the oldest values' offsets from the newest
    w = np.asarray(0.5 ** (o / halflife), dtype=np.float64)
    return c, d, w


@numba.njit(cache=True, nogil=True)
def _tile(buf, nt, size, c, d, w, block, out):  # out[t] for the windows buf[t : t + size]
    # (the loops run over slices, whose indices numba knows are not negative: SIMD loops)
    nb = d.shape[0]
    rest = w.shape[0]
    width = nt + size - 1
    # block[q] = sum of c_k buf[q - k]: the blocks of some window end at q >= rest + B - 1
    start = rest + B - 1
    if nb > 0:
        sums = block[start:width]
        first = buf[start:width]
        c0 = c[0]
        for q in range(width - start):
            sums[q] = c0 * first[q]
        for k in range(1, B):
            ck = c[k]
            shifted = buf[start - k : width - k]
            for q in range(width - start):
                sums[q] += ck * shifted[q]
    total = out[:nt]
    for t in range(nt):
        total[t] = 0.0
    for j in range(nb):
        dj = d[j]
        at = size - 1 - B * j  # window t's block j ends at buf[t + at]
        ends = block[at : at + nt]
        for t in range(nt):
            total[t] += dj * ends[t]
    for k in range(rest):
        wk = w[k]
        oldest = buf[k : k + nt]
        for t in range(nt):
            total[t] += wk * oldest[t]


@numba.njit(cache=True, nogil=True)
def _value(x, y, i, col, mode):  # the summed series at x[i, col] (`MODES`)
    a = x[i, col]
    if mode == 0:
        return a
    if mode == 3:
        return a * a
    if mode == 4:
        return 1.0 if np.isfinite(a) else np.nan
    b = y[i, col]
    if not (np.isfinite(a) and np.isfinite(b)):
        return np.nan
    return a * b if mode == 1 else b * b


@numba.njit(cache=True, nogil=True)
def _row(x, y, mode, i, c, d, w, lag, lo, hi, sums, count, buf, flag, block, out):
    size = B * d.shape[0] + w.shape[0]
    for t0 in range(lo, hi, TILE):
        nt = min(TILE, hi - t0)
        first = t0 + 1 - size - lag  # x's column of buf[0]
        for q in range(nt + size - 1):
            col = first + q
            v = _value(x, y, i, col, mode) if col >= 0 else np.nan
            if np.isfinite(v):
                buf[q] = v
                flag[q] = 1
            else:
                buf[q] = 0.0
                flag[q] = 0
        _tile(buf, nt, size, c, d, w, block, out)
        seen = 0
        for k in range(size):
            seen += flag[k]
        for t in range(nt):
            if t > 0:
                seen += flag[t + size - 1] - flag[t - 1]
            sums[i, t0 - lo + t] = out[t]
            count[i, t0 - lo + t] = seen


@numba.njit(cache=True, nogil=True, parallel=True)
def window_kernel(x, y, mode, c, d, w, lag, lo, hi, sums, count):
    """sums[i, t - lo], count[i, t - lo] for t in [lo, hi): the window of column t is the
    series' columns t - lag - size + 1 .. t - lag, size = B len(d) + len(w) (columns before 0
    and values not finite are missing: 0 in the sum, not counted); the series is x, or one of
    x and y's products (`MODES`). `c`, `d`, `w`: `factors`. The count slides (integers: exact
    in any order)."""
    size = B * d.shape[0] + w.shape[0]
    for i in numba.prange(x.shape[0]):
        buf = np.empty(TILE + size - 1)
        flag = np.zeros(TILE + size - 1, dtype=np.int64)
        block = np.empty(TILE + size - 1)
        out = np.empty(TILE)
        _row(x, y, mode, i, c, d, w, lag, lo, hi, sums, count, buf, flag, block, out)

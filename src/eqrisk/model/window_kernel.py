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
def _fill(x, y, mode, i, first, buf, flag):  # buf[q]: the summed series at x[i, first + q]
    # (0.0 where missing, flag 0; columns before 0 are missing). One loop per mode, each over
    # slices: the mode is decided once a row, and the loops run in SIMD lanes.
    width = buf.shape[0]
    q0 = min(max(-first, 0), width)
    for q in range(q0):
        buf[q] = 0.0
        flag[q] = 0
    m = width - q0
    xs = x[i, first + q0 : first + width]
    out = buf[q0:width]
    seen = flag[q0:width]
    if mode == 0:
        for q in range(m):
            ok = np.isfinite(xs[q])
            out[q] = xs[q] if ok else 0.0
            seen[q] = ok
    elif mode == 3:
        for q in range(m):
            ok = np.isfinite(xs[q])
            out[q] = xs[q] * xs[q] if ok else 0.0
            seen[q] = ok
    elif mode == 4:
        for q in range(m):
            ok = np.isfinite(xs[q])
            out[q] = 1.0 if ok else 0.0
            seen[q] = ok
    else:
        ys = y[i, first + q0 : first + width]
        for q in range(m):
            ok = np.isfinite(xs[q]) and np.isfinite(ys[q])
            v = xs[q] * ys[q] if mode == 1 else ys[q] * ys[q]
            out[q] = v if ok else 0.0
            seen[q] = ok


@numba.njit(cache=True, nogil=True)
def _row(x, y, mode, i, c, d, w, lag, lo, hi, sums, count, buf, flag, block, out):
    size = B * d.shape[0] + w.shape[0]
    for t0 in range(lo, hi, TILE):
        nt = min(TILE, hi - t0)
        _fill(x, y, mode, i, t0 + 1 - size - lag, buf[: nt + size - 1], flag)
        _tile(buf, nt, size, c, d, w, block, out)
        seen = 0
        for k in range(size):
            seen += flag[k]
        row_sums = sums[i, t0 - lo : t0 - lo + nt]
        row_count = count[i, t0 - lo : t0 - lo + nt]
        row_sums[0] = out[0]
        row_count[0] = seen
        for t in range(1, nt):
            seen += flag[t + size - 1] - flag[t - 1]
            row_sums[t] = out[t]
            row_count[t] = seen


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

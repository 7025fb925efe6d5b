"""The style descriptors' windowed sums as a numba kernel (`styles.window_sums`): per row and
session, sum of weights * x over the window, in the very order numpy sums the products of a
window (`(window * weights).sum(axis=-1)`: 0.0 plus its pairwise summation, eight partial sums
in blocks of at most 128 values, halves at multiples of 8 above), so the values are numpy's bit
for bit (tested), without numpy's (rows x sessions x window) temporary, and the rows in parallel.

Each window's sum is its own: the kernel runs the pairwise order of every session's window side
by side, a tile of sessions at a time (each of the eight partial sums of a block is a vector over
the tile's sessions, so the products and additions run in SIMD lanes, one session per lane),
which changes which sums are computed together, never the order of any one sum's additions.
"""

from __future__ import annotations

import numba
import numpy as np

BLOCK = 128  # numpy's PW_BLOCKSIZE: the pairwise sum's largest block summed in eight lanes
TILE = 256  # sessions summed side by side (their partial sums stay in the core's caches)


def pairwise_plan(size: int) -> np.ndarray:
    """numpy's pairwise summation tree of `size` values as steps (M, 3), step k filling slot k,
    children before parents: (0, first value, count) a leaf (at most BLOCK values, summed in
    eight lanes), (1, a, b) the sum of slots a and b; the whole sum is the last slot."""
    steps: list[tuple[int, int, int]] = []

    def node(lo: int, n: int) -> int:
        if n <= BLOCK:
            steps.append((0, lo, n))
        else:
            half = n // 2
            half -= half % 8
            left = node(lo, half)
            right = node(lo + half, n - half)
            steps.append((1, left, right))
        return len(steps) - 1

    node(0, size)
    return np.asarray(steps, dtype=np.int64)


@numba.njit(cache=True)
def _leaf(buf, w, lo, n, nt, acc, out):  # out[t] = numpy's pairwise_sum of buf[t + k] * w[k]
    if n < 8:  # k in [lo, lo + n), for t in [0, nt)
        for t in range(nt):
            out[t] = 0.0
        for k in range(lo, lo + n):
            wk = w[k]
            for t in range(nt):
                out[t] += buf[t + k] * wk
        return
    for j in range(8):
        wk = w[lo + j]
        for t in range(nt):
            acc[j, t] = buf[t + lo + j] * wk
    i = 8
    whole = n - n % 8
    while i < whole:
        for j in range(8):
            wk = w[lo + i + j]
            at = lo + i + j
            for t in range(nt):
                acc[j, t] += buf[t + at] * wk
        i += 8
    for t in range(nt):
        out[t] = ((acc[0, t] + acc[1, t]) + (acc[2, t] + acc[3, t])) + (
            (acc[4, t] + acc[5, t]) + (acc[6, t] + acc[7, t])
        )
    while i < n:
        wk = w[lo + i]
        for t in range(nt):
            out[t] += buf[t + lo + i] * wk
        i += 1


@numba.njit(cache=True, parallel=True)
def window_kernel(x, weights, lag, plan, lo, hi, sums, count):
    """sums[i, t - lo], count[i, t - lo] for t in [lo, hi): the window of column t is x's
    columns t - lag - len(weights) + 1 .. t - lag (oldest first; columns before 0 and values
    not finite are missing: 0 in the sum, not counted). `plan`: `pairwise_plan(len(weights))`.
    The count slides (integers: exact in any order)."""
    n = x.shape[0]
    size = weights.shape[0]
    n_slots = plan.shape[0]
    for i in numba.prange(n):
        acc = np.empty((8, TILE))
        part = np.empty((n_slots, TILE))
        buf = np.empty(TILE + size - 1)
        flag = np.zeros(TILE + size - 1, dtype=np.int64)
        for t0 in range(lo, hi, TILE):
            nt = min(TILE, hi - t0)
            width = nt + size - 1
            first = t0 + 1 - size - lag  # x's column of buf[0]
            for q in range(width):
                c = first + q
                v = x[i, c] if c >= 0 else np.nan
                if np.isfinite(v):
                    buf[q] = v
                    flag[q] = 1
                else:
                    buf[q] = 0.0
                    flag[q] = 0
            for k in range(n_slots):
                if plan[k, 0] == 0:
                    _leaf(buf, weights, plan[k, 1], plan[k, 2], nt, acc, part[k])
                else:
                    a, b = plan[k, 1], plan[k, 2]
                    for t in range(nt):
                        part[k, t] = part[a, t] + part[b, t]
            seen = 0
            for k in range(size):
                seen += flag[k]
            res = part[n_slots - 1]
            for t in range(nt):
                if t > 0:
                    seen += flag[t + size - 1] - flag[t - 1]
                # numpy's reduction starts from its identity, 0.0 (a sum of -0.0s is +0.0)
                sums[i, t0 - lo + t] = 0.0 + res[t]
                count[i, t0 - lo + t] = seen

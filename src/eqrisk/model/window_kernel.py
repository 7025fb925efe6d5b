"""The style descriptors' windowed sums as a numba kernel (`styles.window_sums`): per row and
session, sum of weights * x over the window, in the very order numpy sums the products of a
window (`(window * weights).sum(axis=-1)`: 0.0 plus its pairwise summation, eight partial sums
in blocks of at most 128 values, halves at multiples of 8 above), so the values are numpy's bit for bit
(tested), without numpy's (rows x sessions x window) temporary, and the rows in parallel.
"""

from __future__ import annotations

import numba

BLOCK = 128  # numpy's PW_BLOCKSIZE: the pairwise sum's largest block summed in eight lanes


@numba.njit(
    numba.float64(numba.float64[::1], numba.int64, numba.float64[::1], numba.int64, numba.int64),
    cache=True,
)
def _pairwise(v, at, w, lo, n):  # numpy's pairwise_sum of v[at + k] * w[k], k in [lo, lo + n)
    if n < 8:
        res = 0.0
        for k in range(lo, lo + n):
            res += v[at + k] * w[k]
        return res
    if n <= BLOCK:
        b = at + lo
        r0, r1 = v[b] * w[lo], v[b + 1] * w[lo + 1]
        r2, r3 = v[b + 2] * w[lo + 2], v[b + 3] * w[lo + 3]
        r4, r5 = v[b + 4] * w[lo + 4], v[b + 5] * w[lo + 5]
        r6, r7 = v[b + 6] * w[lo + 6], v[b + 7] * w[lo + 7]
        i = 8
        whole = n - n % 8
        while i < whole:
            k = lo + i
            r0 += v[b + i] * w[k]
            r1 += v[b + i + 1] * w[k + 1]
            r2 += v[b + i + 2] * w[k + 2]
            r3 += v[b + i + 3] * w[k + 3]
            r4 += v[b + i + 4] * w[k + 4]
            r5 += v[b + i + 5] * w[k + 5]
            r6 += v[b + i + 6] * w[k + 6]
            r7 += v[b + i + 7] * w[k + 7]
            i += 8
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        while i < n:
            res += v[b + i] * w[lo + i]
            i += 1
        return res
    half = n // 2
    half -= half % 8
    return _pairwise(v, at, w, lo, half) + _pairwise(v, at, w, lo + half, n - half)


@numba.njit(cache=True, parallel=True)
def window_kernel(values, present, weights, lo, hi, sums, count):
    """sums[i, t], count[i, t] for t in [lo, hi): the window of column t is values[i, t + 1:
    t + 1 + len(weights)] (`values` padded in front, missing values 0, `present` their
    flags). The count slides (integers: exact in any order)."""
    n = values.shape[0]
    size = weights.shape[0]
    for i in numba.prange(n):
        row = values[i]
        seen = 0
        for k in range(size):
            seen += present[i, lo + 1 + k]
        for t in range(lo, hi):
            if t > lo:
                seen += present[i, t + size] - present[i, t]
            # numpy's reduction starts from its identity, 0.0 (a sum of -0.0s is +0.0)
            sums[i, t] = 0.0 + _pairwise(row, t + 1, weights, 0, size)
            count[i, t] = seen

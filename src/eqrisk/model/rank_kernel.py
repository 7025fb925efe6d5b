"""Per-session cap ranks (`run.cap_rank`) as a numba kernel.

A session's order is its rows with a finite cap, largest cap first, equal caps in row order:
what a stable argsort of -cap gives. Each session is sorted by a least-significant-digit radix
sort (stable) of the rows, taken in row order, on a key of each cap that orders as the caps
do, descending: 8 passes of a byte each (a pass skipped where every key has the same byte), a
few element operations a row whatever the caps, where a comparison sort takes log2(n)
comparisons a row. The key is the cap's bits made to order as unsigned integers (a positive
float's bits with the sign bit set, a negative one's inverted), all of them inverted for the
descending order; +0.0 is added first so that -0.0 and 0.0, equal caps, get one key.

Sessions are independent: SPAN of them at a time on each thread, each row's piece of them
copied at once (one session's column alone would read a cache line a row).
"""

from __future__ import annotations

import numba
import numpy as np

SPAN = 64  # sessions gathered at a time
SIGN = np.uint64(1 << 63)
ALL = np.uint64((1 << 64) - 1)
BYTE = np.uint64(255)


@numba.njit(cache=True, nogil=True)
def _keys(values, m, keys):
    """keys[:m]: unsigned integers that order as values[:m] (finite floats) descending."""
    bits = values[:m].view(np.uint64)
    for j in range(m):
        b = bits[j]
        up = (b ^ ALL) if b & SIGN else (b | SIGN)  # ascending with the value
        keys[j] = up ^ ALL


@numba.njit(cache=True, nogil=True)
def _radix(keys, rows, m, keys2, rows2, count):
    """The rows[:m] sorted by keys[:m], stable; returns the array that holds them (rows or
    rows2: the passes swap the two)."""
    src_k, src_r, dst_k, dst_r = keys, rows, keys2, rows2
    for p in range(8):
        shift = np.uint64(8 * p)
        count[:] = 0
        for j in range(m):
            count[(src_k[j] >> shift) & BYTE] += 1
        if m == 0 or count[(src_k[0] >> shift) & BYTE] == m:
            continue  # one byte for every key: the pass would move nothing
        total = 0
        for d in range(256):
            c = count[d]
            count[d] = total
            total += c
        for j in range(m):
            d = (src_k[j] >> shift) & BYTE
            at = count[d]
            dst_k[at] = src_k[j]
            dst_r[at] = src_r[j]
            count[d] = at + 1
        src_k, src_r, dst_k, dst_r = dst_k, dst_r, src_k, src_r
    return src_r


@numba.njit(cache=True, nogil=True)
def _session(cap, out, values, keys, rows, keys2, rows2, count):
    """One session's ranks into out (n,) from its caps (n,; NaN: no rank)."""
    n = cap.shape[0]
    m = 0
    for i in range(n):
        out[i] = np.nan
        if np.isfinite(cap[i]):
            values[m] = cap[i] + 0.0
            rows[m] = i
            m += 1
    _keys(values, m, keys)
    order = _radix(keys, rows, m, keys2, rows2, count)
    for j in range(m):
        out[order[j]] = j + 1.0


@numba.njit(cache=True, nogil=True, parallel=True)
def rank_kernel(market_cap, eligible, ranks):
    """ranks[i, t] (n x T, every cell written): 1 + the number of rows before row i in session
    t's order; NaN where the row is not eligible or its cap is not finite."""
    n, n_t = market_cap.shape
    for s in numba.prange((n_t + SPAN - 1) // SPAN):
        t0 = s * SPAN
        width = min(SPAN, n_t - t0)
        caps = np.empty((SPAN, n))
        out = np.empty((SPAN, n))
        values = np.empty(n)
        keys = np.empty(n, dtype=np.uint64)
        keys2 = np.empty(n, dtype=np.uint64)
        rows = np.empty(n, dtype=np.int64)
        rows2 = np.empty(n, dtype=np.int64)
        count = np.empty(256, dtype=np.int64)
        for i in range(n):
            for k in range(width):
                v = market_cap[i, t0 + k]
                caps[k, i] = v if eligible[i] else np.nan
        for k in range(width):
            _session(caps[k], out[k], values, keys, rows, keys2, rows2, count)
        for i in range(n):
            for k in range(width):
                ranks[i, t0 + k] = out[k, i]

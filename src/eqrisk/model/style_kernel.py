"""The style exposures' standardisation as a numba kernel (`styles.style_exposures`): every
session of a block at once, the sessions in parallel (each session's numbers are its own, so
the split between threads changes no bit).

Per session, over the rows with a cap (in row order), each descriptor is standardised as
`styles` states (cap-weighted mean 0, equal-weighted standard deviation 1, limited to +-LIMIT
in rounds) with numpy's own arithmetic: every sum is numpy's pairwise summation of the same
values in the same order (`np.sum`, and `np.std`'s two sums: the mean, then the squared
deviations), so the values equal numpy's `styles.standardise` of one session bit for bit
(tested). Residual volatility (on size and beta) and liquidity (on size) are then made
orthogonal: the residual of the equal-weight least-squares fit on an intercept and those
exposures, by modified Gram-Schmidt with a second pass (the same residual as a least-squares
solver's up to rounding; a basis column within rounding of the earlier ones' span adds
nothing, as a solver's rank cut-off would), standardised again.
"""

from __future__ import annotations

import numba
import numpy as np

BLOCK = 128  # numpy's PW_BLOCKSIZE: the pairwise sum's largest block summed in eight lanes
EPS = np.finfo(np.float64).eps


@numba.njit(numba.float64(numba.float64[::1], numba.int64, numba.int64), cache=True, nogil=True)
def _pairwise(a, lo, n):  # numpy's pairwise_sum of a[lo : lo + n]
    if n < 8:
        res = 0.0
        for k in range(lo, lo + n):
            res += a[k]
        return res
    if n <= BLOCK:
        r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
        r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
        i = 8
        whole = n - n % 8
        while i < whole:
            b = lo + i
            r0 += a[b]
            r1 += a[b + 1]
            r2 += a[b + 2]
            r3 += a[b + 3]
            r4 += a[b + 4]
            r5 += a[b + 5]
            r6 += a[b + 6]
            r7 += a[b + 7]
            i += 8
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        while i < n:
            res += a[lo + i]
            i += 1
        return res
    half = n // 2
    half -= half % 8
    return _pairwise(a, lo, half) + _pairwise(a, lo + half, n - half)


@numba.njit(cache=True, nogil=True)
def _sum(a, n):  # np.sum(a[:n]): the reduction's identity 0.0 plus the pairwise sum
    return 0.0 + _pairwise(a, 0, n)


@numba.njit(cache=True, nogil=True)
def _standardise(v, c, m, work, rounds, limit, bound):
    """v[:m] standardised in place over the caps c[:m] (`styles.standardise`'s rounds, numpy's
    sums); False where the standard deviation is not positive (the session's values are then
    all 0)."""
    total = _sum(c, m)
    for _ in range(rounds):
        for k in range(m):
            work[k] = c[k] * v[k]
        mean = _sum(work, m) / total
        for k in range(m):
            v[k] = v[k] - mean
        centre = _sum(v, m) / m  # np.std: the mean, then the mean squared deviation
        for k in range(m):
            d = v[k] - centre
            work[k] = d * d
        sd = np.sqrt(_sum(work, m) / m)
        if not sd > 0:
            return False
        top = 0.0
        for k in range(m):
            v[k] = v[k] / sd
            top = max(top, abs(v[k]))
        if top <= bound:
            break
        for k in range(m):
            v[k] = min(max(v[k], -limit), limit)
    return True


@numba.njit(cache=True, nogil=True)
def _dot(a, b, m, work):
    for k in range(m):
        work[k] = a[k] * b[k]
    return _sum(work, m)


@numba.njit(cache=True, nogil=True)
def _residual(y, z, on, m, work):
    """y[:m] replaced by its residual on an intercept and the rows z[on[j], :m] (equal
    weights): modified Gram-Schmidt, each projection taken out twice."""
    q = np.empty((on.shape[0] + 1, m))
    found = 0
    for j in range(on.shape[0] + 1):
        u = q[found]
        for k in range(m):
            u[k] = 1.0 if j == 0 else z[on[j - 1], k]
        norm0 = np.sqrt(_dot(u, u, m, work))
        for _ in range(2):
            for p in range(found):
                proj = _dot(q[p], u, m, work)
                for k in range(m):
                    u[k] -= proj * q[p, k]
        norm = np.sqrt(_dot(u, u, m, work))
        if norm0 > 0 and norm > EPS * m * norm0:
            for k in range(m):
                u[k] /= norm
            found += 1
    for _ in range(2):
        for p in range(found):
            proj = _dot(q[p], y, m, work)
            for k in range(m):
                y[k] -= proj * q[p, k]


@numba.njit(cache=True, nogil=True)
def _session(raw, cap, stocks, k, z, rows, c, v, pos, work, rounds, limit, bound):
    """Session k's standardised descriptors z[s, :m] over its rows with a cap (rows[:m]);
    returns m."""
    m = 0
    for i in range(raw.shape[1]):
        ci = cap[i, k]
        if stocks[i] and np.isfinite(ci) and ci > 0:
            rows[m] = i
            m += 1
    for s in range(raw.shape[0]):
        got = 0
        for j in range(m):
            z[s, j] = 0.0  # a row with a cap and no descriptor: the average
            x = raw[s, rows[j], k]
            if np.isfinite(x):
                v[got] = x
                c[got] = cap[rows[j], k]
                pos[got] = j
                got += 1
        if got >= 2 and _standardise(v, c, got, work, rounds, limit, bound):
            for u in range(got):
                z[s, pos[u]] = v[u]
    return m


@numba.njit(cache=True, nogil=True)
def _orthogonal(z, target, on, cap, rows, k, m, c, work, rounds, limit, bound):
    """z[target, :m] made orthogonal to z[on] (and an intercept), standardised again."""
    if m <= on.shape[0] + 1:
        return
    y = z[target]
    _residual(y, z, on, m, work)
    for j in range(m):
        c[j] = cap[rows[j], k]
    if not _standardise(y, c, m, work, rounds, limit, bound):
        for j in range(m):
            y[j] = 0.0


@numba.njit(cache=True, nogil=True, parallel=True)
def exposure_kernel(raw, cap, stocks, rv, rv_on, liq, liq_on, liq_any, rounds, limit, bound, out):
    """out[s, i, k], every cell written (NaN in a row without a cap or not allowed): raw
    (S, n, K) descriptors and cap (n, K) of K sessions, stocks (n,) the rows allowed. rv / liq:
    the rows of raw to make orthogonal (-1: none) to the rows rv_on / liq_on; liquidity only in
    sessions with liq_any[k]."""
    n_s, n, n_k = raw.shape
    for k in numba.prange(n_k):
        z = np.empty((n_s, n))
        rows = np.empty(n, dtype=np.int64)
        pos = np.empty(n, dtype=np.int64)
        c = np.empty(n)
        v = np.empty(n)
        work = np.empty(n)
        m = _session(raw, cap, stocks, k, z, rows, c, v, pos, work, rounds, limit, bound)
        if rv >= 0:
            _orthogonal(z, rv, rv_on, cap, rows, k, m, c, work, rounds, limit, bound)
        if liq >= 0 and liq_any[k]:
            _orthogonal(z, liq, liq_on, cap, rows, k, m, c, work, rounds, limit, bound)
        for s in range(n_s):  # rows[:m] ascending: each (s, i, k) written once
            j = 0
            for i in range(n):
                if j < m and rows[j] == i:
                    out[s, i, k] = z[s, j]
                    j += 1
                else:
                    out[s, i, k] = np.nan

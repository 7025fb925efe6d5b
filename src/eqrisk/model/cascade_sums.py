"""The weighted moment sums of the L3 cascade (`eqrisk.model.cascade`): 4 sums and the lower
triangle of the cross sums of the stock, market, sector and subsector returns, as tuples of
scalars the compiler keeps in registers, and the day-level bookkeeping of the three samples
(the days that serve every level of a stock, one fewer, two fewer)."""

from __future__ import annotations

from numba import njit

# The accumulators of an empty sample.
ZERO14 = (0.0,) * 14


@njit(cache=True, inline="always")
def add_day(acc, w, d0, d1, d2, d3):
    """The accumulators (4 sums, then the lower triangle of the cross sums, row by row) plus one
    session of centred inputs d weighted w (a negative w drops it: (-w) d is -(w d) exactly, so
    a drop is bit for bit a subtraction). Scalars, not arrays, so that they live in registers."""
    m0, m1, m2, m3, c00, c10, c11, c20, c21, c22, c30, c31, c32, c33 = acc
    w0 = w * d0
    w1 = w * d1
    w2 = w * d2
    w3 = w * d3
    return (
        m0 + w0, m1 + w1, m2 + w2, m3 + w3,
        c00 + w0 * d0,
        c10 + w1 * d0, c11 + w1 * d1,
        c20 + w2 * d0, c21 + w2 * d1, c22 + w2 * d2,
        c30 + w3 * d0, c31 + w3 * d1, c32 + w3 * d2, c33 + w3 * d3,
    )  # fmt: skip


@njit(cache=True, inline="always")
def decay(acc, lam):
    m0, m1, m2, m3, c00, c10, c11, c20, c21, c22, c30, c31, c32, c33 = acc
    return (
        m0 * lam, m1 * lam, m2 * lam, m3 * lam,
        c00 * lam, c10 * lam, c11 * lam, c20 * lam, c21 * lam, c22 * lam,
        c30 * lam, c31 * lam, c32 * lam, c33 * lam,
    )  # fmt: skip


@njit(cache=True, inline="always")
def reference_means(z, lev, lo, hi):
    """Reference means of the scratch rows lo..hi (inclusive): the stock and the market over
    the days with an L1 observation, the sector over L2 days, the subsector over L3 days."""
    m1 = m2 = m3 = 0
    r0 = r1 = r2 = r3 = 0.0
    for s in range(lo, hi + 1):
        level = lev[s]
        if level >= 1:
            m1 += 1
            r0 += z[s, 0]
            r1 += z[s, 1]
            if level >= 2:
                m2 += 1
                r2 += z[s, 2]
                if level >= 3:
                    m3 += 1
                    r3 += z[s, 3]
    if m1 > 0:
        r0 /= m1
        r1 /= m1
    if m2 > 0:
        r2 /= m2
    if m3 > 0:
        r3 /= m3
    return r0, r1, r2, r3


@njit(cache=True, inline="always")
def add_at(
    z, s, level, top, w, dn, r0, r1, r2, r3, s_a, n_a, acc_a, s_b, n_b, acc_b, s_c, n_c, acc_c
):
    """The three samples' weight sums, counts and accumulators with scratch row s (serving
    `level` of the stock's `top` levels) added with weight w and count dn (-lam**window and -1
    drop it); a sample left empty has its sums reset to exact zeros."""
    d0 = z[s, 0] - r0
    d1 = z[s, 1] - r1
    d2 = z[s, 2] - r2
    d3 = z[s, 3] - r3
    if level == top:
        return (s_a + w, n_a + dn, add_day(acc_a, w, d0, d1, d2, d3),
                s_b, n_b, acc_b, s_c, n_c, acc_c)  # fmt: skip
    if level == top - 1:
        if n_b + dn == 0:
            return s_a, n_a, acc_a, 0.0, 0, ZERO14, s_c, n_c, acc_c
        return (s_a, n_a, acc_a, s_b + w, n_b + dn, add_day(acc_b, w, d0, d1, d2, d3),
                s_c, n_c, acc_c)  # fmt: skip
    if n_c + dn == 0:
        return s_a, n_a, acc_a, s_b, n_b, acc_b, 0.0, 0, ZERO14
    return (s_a, n_a, acc_a, s_b, n_b, acc_b,
            s_c + w, n_c + dn, add_day(acc_c, w, d0, d1, d2, d3))  # fmt: skip


@njit(cache=True, inline="always")
def window_sums(z, lev, top, lo, hi, lam, r0, r1, r2, r3):
    """From-scratch weighted sums over scratch rows lo..hi (inclusive) of the inputs centred on
    the reference r, newest first (weight 1, then lam, lam**2, ...), in three accumulators: the
    days with every level of the stock (`top`), with one fewer, with two fewer."""
    s_a = s_b = s_c = 0.0
    n_a = n_b = n_c = 0
    acc_a = acc_b = acc_c = ZERO14
    w = 1.0
    for t in range(hi, lo - 1, -1):
        level = lev[t]
        if level > 0:
            s_a, n_a, acc_a, s_b, n_b, acc_b, s_c, n_c, acc_c = add_at(
                z, t, level, top, w, 1, r0, r1, r2, r3,
                s_a, n_a, acc_a, s_b, n_b, acc_b, s_c, n_c, acc_c,
            )  # fmt: skip
        w *= lam
    return s_a, n_a, acc_a, s_b, n_b, acc_b, s_c, n_c, acc_c


@njit(cache=True, inline="always")
def plus(a, b):
    """The sum of two sets of accumulators."""
    return (
        a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3], a[4] + b[4], a[5] + b[5],
        a[6] + b[6], a[7] + b[7], a[8] + b[8], a[9] + b[9], a[10] + b[10], a[11] + b[11],
        a[12] + b[12], a[13] + b[13],
    )  # fmt: skip


@njit(cache=True, inline="always")
def window_sums_one(z, lev, lo, hi, lam, r0, r1, r2, r3):
    """`window_sums` where every day serves all the stock's levels or none: one sample."""
    s_a = 0.0
    n_a = 0
    acc_a = ZERO14
    w = 1.0
    for t in range(hi, lo - 1, -1):
        if lev[t] > 0:
            s_a += w
            n_a += 1
            acc_a = add_day(acc_a, w, z[t, 0] - r0, z[t, 1] - r1, z[t, 2] - r2, z[t, 3] - r3)
        w *= lam
    return s_a, n_a, acc_a

"""The L3 cascade's values (`eqrisk.model.cascade`): the hedge ratios and explained-risk shares
of a stock from the weighted moment sums of (r, m, s, u), its returns and its market, sector
and subsector ETF returns (DESIGN section 2).

Most of the arithmetic involves the ETFs alone: their means, the market's variance, the cleaned
sector's and subsector's coefficients and variances, the collinearity tests. `factor_part`
makes those (a record) and `stock_values` the rest, from the record and the stock's own five
sums (of r and of r times each variable); `cascade_from_sums` is the two in turn. Where a stock
has a return on every day of the window, the record is the same for every stock hedged with
the same ETFs, so a group makes it once per session (`cascade_shared`): the same operations on
the same operands, the same bits.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# A level whose cleaned ETF keeps less than this share of its raw variance is collinear with the
# levels above it: its coefficients are not identified, so it is published as null.
COLLINEAR_RTOL = 1e-8
TINY_VAR = 1e-20
NAN = np.nan
ALL_NAN = (NAN,) * 15

# A factor record's fields: the deepest level the ETFs support (0: none), the sample's count,
# then the ETF-only quantities of the cascade.
(REC_DEPTH, REC_N, REC_INV, REC_U1, REC_U2, REC_U3, REC_V_M, REC_INV_M) = range(8)
(REC_G, REC_V_S, REC_INV_S, REC_D_M, REC_D_S, REC_V_U) = range(8, 14)
REC_FIELDS = 14


@njit(cache=True, inline="always")
def cascade_from_sums(acc, s0, k):
    """Hedge ratios and risk shares (the first 15 fields) from the weighted sums of (r, m, s, u)
    (first k of them): the ETF-only part (`factor_part`), then the stock's (`stock_values`);
    NaN where a level is not published."""
    return stock_values(factor_part(acc, s0, 0.0, k), acc[0], acc[4], acc[5], acc[7], acc[10], k)


@njit(cache=True, inline="always")
def factor_part(acc, s0, n0, k):
    """The record (REC_FIELDS values) of sums `acc` of weight s0 > 0 and count n0: the part of
    the cascade that involves the ETFs alone (the stock-side sums in `acc` are not read). The
    depth is the deepest level published for a stock whose variance is not tiny (0: nothing);
    the fields below it are NaN."""
    nan = NAN
    n0 = np.float64(n0)
    _, m1, m2, m3, _, _, x11, _, x21, x22, _, x31, x32, x33 = acc
    inv = 1.0 / s0  # one division per session; the rest are multiplications
    u1 = m1 * inv
    u2 = m2 * inv
    u3 = m3 * inv
    v_m = x11 * inv - u1 * u1
    if v_m <= TINY_VAR:
        return (0.0, n0, inv, u1, u2, u3, v_m, nan, nan, nan, nan, nan, nan, nan)
    inv_m = 1.0 / v_m
    if k == 2:
        return (1.0, n0, inv, u1, u2, u3, v_m, inv_m, nan, nan, nan, nan, nan, nan)
    # L2: the sector ETF cleaned of the market.
    c_sm = x21 * inv - u2 * u1
    c_ss = x22 * inv - u2 * u2
    g = c_sm * inv_m
    v_s = c_ss - g * c_sm
    if v_s <= COLLINEAR_RTOL * c_ss or v_s <= TINY_VAR:
        return (1.0, n0, inv, u1, u2, u3, v_m, inv_m, nan, nan, nan, nan, nan, nan)
    inv_s = 1.0 / v_s
    if k == 3:
        return (2.0, n0, inv, u1, u2, u3, v_m, inv_m, g, v_s, inv_s, nan, nan, nan)
    # L3: the subsector ETF cleaned of the market and of the cleaned sector.
    c_um = x31 * inv - u3 * u1
    c_us0 = x32 * inv - u3 * u2
    c_uu = x33 * inv - u3 * u3
    d_m = c_um * inv_m
    c_us = c_us0 - g * c_um
    d_s = c_us * inv_s
    v_u = c_uu - d_m * c_um - d_s * c_us
    depth = 2.0 if v_u <= COLLINEAR_RTOL * c_uu or v_u <= TINY_VAR else 3.0
    return (depth, n0, inv, u1, u2, u3, v_m, inv_m, g, v_s, inv_s, d_m, d_s, v_u)


@njit(cache=True, inline="always")
def empty_record(n0):
    """The record of a sample too small to publish (below `min_obs`, or no weight)."""
    nan = NAN
    return (0.0, np.float64(n0), nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan)


@njit(cache=True, inline="always")
def stock_values(rec, m0, x00, x10, x20, x30, k):
    """The 15 values of a stock from a factor record (`factor_part`: a tuple, or a row of a
    group's records) and its own sums (of r, r^2, and r times the market, sector and
    subsector)."""
    nan = NAN
    depth = rec[REC_DEPTH]
    if depth == 0.0:
        return ALL_NAN
    inv = rec[REC_INV]
    u0 = m0 * inv
    v_r = x00 * inv - u0 * u0
    if v_r <= TINY_VAR:
        return ALL_NAN
    c_rm = x10 * inv - rec[REC_U1] * u0
    inv_r = 1.0 / v_r
    b_m = c_rm * rec[REC_INV_M]
    er_m = b_m * b_m * rec[REC_V_M] * inv_r
    res_1 = 1.0 - er_m
    if k == 2:
        return (b_m, er_m, res_1, b_m, nan, er_m, nan, res_1, b_m, nan, nan, er_m, nan, nan, res_1)
    if depth == 1.0:
        return (b_m, er_m, res_1, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan)
    g = rec[REC_G]
    v_s = rec[REC_V_S]
    c_rs = (x20 * inv - rec[REC_U2] * u0) - g * c_rm
    b_s = c_rs * rec[REC_INV_S]
    er_s = b_s * b_s * v_s * inv_r
    m_2 = b_m - b_s * g
    res_2 = 1.0 - er_m - er_s
    if k == 3:
        return (
            b_m, er_m, res_1, m_2, b_s, er_m, er_s, res_2,
            m_2, b_s, nan, er_m, er_s, nan, res_2,
        )  # fmt: skip
    if depth == 2.0:
        return (b_m, er_m, res_1, m_2, b_s, er_m, er_s, res_2, nan, nan, nan, nan, nan, nan, nan)
    d_m = rec[REC_D_M]
    d_s = rec[REC_D_S]
    v_u = rec[REC_V_U]
    c_ru = (x30 * inv - rec[REC_U3] * u0) - d_m * c_rm - d_s * c_rs
    b_u = c_ru / v_u
    er_u = b_u * b_u * v_u * inv_r
    m_3 = b_m - b_s * g - b_u * d_m + b_u * d_s * g
    return (
        b_m, er_m, res_1, m_2, b_s, er_m, er_s, res_2,
        m_3, b_s - b_u * d_s, b_u, er_m, er_s, er_u, 1.0 - er_m - er_s - er_u,
    )  # fmt: skip


@njit(cache=True, inline="always")
def store_fields(outs, i, t, v, cnt):
    """The 16 fields of stock i at session t (15 values, then the count), each written once."""
    outs[0][i, t] = v[0]
    outs[1][i, t] = v[1]
    outs[2][i, t] = v[2]
    outs[3][i, t] = v[3]
    outs[4][i, t] = v[4]
    outs[5][i, t] = v[5]
    outs[6][i, t] = v[6]
    outs[7][i, t] = v[7]
    outs[8][i, t] = v[8]
    outs[9][i, t] = v[9]
    outs[10][i, t] = v[10]
    outs[11][i, t] = v[11]
    outs[12][i, t] = v[12]
    outs[13][i, t] = v[13]
    outs[14][i, t] = v[14]
    outs[15][i, t] = cnt

"""The L3 cascade: rolling (optionally EWMA-weighted) moments of a stock and its ETFs, and the
hedge ratios and explained-risk shares derived from them (DESIGN section 2).

One numba kernel does it all per stock, in one pass over time:
- window of `window` sessions ending at t; each level counts its own joint sample: L1 the days
  the stock and the market have returns, L2 those where the sector has one too, L3 those where
  the subsector has one too (a level is published from its own `min_obs`-th observation, so a
  sector ETF that lists late never holds back the market beta);
- weights lam**(t - k) (lam = 1: equal weights), kept by decay-add-drop updates;
- float64 accumulators on inputs centred by a reference mean that is re-anchored every `window`
  steps (from data up to t only, so nothing looks ahead); the sums are recomputed from scratch at
  each anchor, which also bounds the drift of the add/drop updates;
- the days are kept in three accumulators by how many levels they serve (all of the stock's,
  one fewer, two fewer); a level's sums are the sum of those that serve it. Where the three
  samples agree (the usual case: every ETF listed) the two extra accumulators are empty and
  untouched, and the cost and the numbers are those of one joint sample; a stock whose every
  session serves all its levels or none runs a copy of the loop that carries that one sample
  only (the same operations in the same order: the same bits, about 5% less CPU).

Because every anchor starts from scratch, sessions t >= s need only the data from the anchor at or
before s, less one window (`start=`): a one-session update costs O(window) per stock, not O(T),
and equals a full run bitwise. The threads fill blocks of consecutive stocks, each block with its
own scratch (no allocation per stock), straight into the caller's outputs (`out=`: memory-mapped
files or a reused buffer), each output value written once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numba
import numpy as np
from numba import njit, prange

from eqrisk.model.cascade_sums import (
    ZERO14,
    add_at,
    add_day,
    decay,
    plus,
    reference_means,
    window_sums,
    window_sums_one,
)
from eqrisk.model.std_kernel import rolling_std_all

# Output fields, in the order of the kernel's first axis.
CASCADE_FIELDS: tuple[str, ...] = (
    "l1_mkt_hr",
    "l1_mkt_er",
    "l1_res_er",
    "l2_mkt_hr",
    "l2_sec_hr",
    "l2_mkt_er",
    "l2_sec_er",
    "l2_res_er",
    "l3_mkt_hr",
    "l3_sec_hr",
    "l3_sub_hr",
    "l3_mkt_er",
    "l3_sec_er",
    "l3_sub_er",
    "l3_res_er",
    "n_obs",
)
(L1_MKT_HR, L1_MKT_ER, L1_RES_ER, L2_MKT_HR, L2_SEC_HR, L2_MKT_ER, L2_SEC_ER, L2_RES_ER) = range(8)
(L3_MKT_HR, L3_SEC_HR, L3_SUB_HR, L3_MKT_ER, L3_SEC_ER, L3_SUB_ER, L3_RES_ER, N_OBS) = range(8, 16)

# A level whose cleaned ETF keeps less than this share of its raw variance is collinear with the
# levels above it: its coefficients are not identified, so it is published as null.
COLLINEAR_RTOL = 1e-8
_TINY_VAR = 1e-20
NV = 4  # variables of the cascade: the stock, market, sector and subsector returns


_NAN = np.nan
# Blocks of consecutive stocks per thread: enough to balance the threads, few enough that the
# per-block scratch (one stock's inputs in the (session, variable) layout) is allocated rarely.
BLOCKS_PER_THREAD = 4


@njit(cache=True, inline="always")
def _load_stock(returns, factors, fidx, i, k, first, z, lev):
    """Stock i's returns and its k-1 factor rows from session `first` on into the scratch, laid
    out (session - first, variable) with NV = 4 variables whatever k is (absent levels and
    missing returns are zeros), so that every inner loop has a fixed trip count the compiler
    unrolls; `lev` is the number of levels each session serves: 0 without the stock's or the
    market's return, else 1 plus the consecutive lower levels with a return. The factor rows
    are looked up once (an absent level reads the market's row, masked), and the cases are
    selects, not branches."""
    n_t = returns.shape[1]
    y_row = returns[i]
    f_m = factors[fidx[i, 0]]
    f_s = factors[fidx[i, 1] if k > 2 else fidx[i, 0]]
    f_u = factors[fidx[i, 2] if k > 3 else fidx[i, 0]]
    has_s = k > 2
    has_u = k > 3
    mixed = False
    for t in range(first, n_t):
        s = t - first
        y = y_row[t]
        x_m = f_m[t]
        x_s = f_s[t]
        x_u = f_u[t]
        ok_m = np.isfinite(x_m)
        ok_s = has_s & np.isfinite(x_s)
        ok_u = has_u & np.isfinite(x_u)
        l1 = np.isfinite(y) & ok_m
        l2 = l1 & ok_s
        l3 = l2 & ok_u
        z[s, 0] = y if np.isfinite(y) else 0.0
        z[s, 1] = x_m if ok_m else 0.0
        z[s, 2] = x_s if ok_s else 0.0
        z[s, 3] = x_u if ok_u else 0.0
        level = np.int8(l1) + np.int8(l2) + np.int8(l3)
        lev[s] = level
        mixed |= (level != 0) & (level != k - 1)
    return mixed


@njit(cache=True, inline="always")
def _store(outs, i, t, v, cnt):
    """The 16 fields of stock i at session t, each written once."""
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
    outs[N_OBS][i, t] = cnt


_ALL_NAN = (_NAN,) * 15


@njit(cache=True)
def _stock_cascade(z, lev, first, i, k, window, min_obs, lam, start, outs):
    """Cascade of stock i for sessions start..T-1 from its scratch inputs (rows from `first`, the
    session one window before the anchor at or before `start`)."""
    n_t = outs[0].shape[1]
    top = k - 1
    r0 = r1 = r2 = r3 = 0.0
    s_a = s_b = s_c = 0.0
    n_a = n_b = n_c = 0
    acc_a = acc_b = acc_c = ZERO14
    lam_w = lam**window
    since_anchor = window  # sessions since the last anchor (t % window, without a division)
    for t in range(start - start % window, n_t):
        if since_anchor == window:
            since_anchor = 0
            # Re-anchor: reference means of the window (data <= t), then exact sums.
            lo = max(0, t - window + 1) - first
            r0, r1, r2, r3 = reference_means(z, lev, lo, t - first)
            s_a, n_a, acc_a, s_b, n_b, acc_b, s_c, n_c, acc_c = window_sums(
                z, lev, top, lo, t - first, lam, r0, r1, r2, r3
            )
        else:
            if lam != 1.0:
                s_a *= lam
                acc_a = decay(acc_a, lam)
                if n_b > 0:
                    s_b *= lam
                    acc_b = decay(acc_b, lam)
                if n_c > 0:
                    s_c *= lam
                    acc_c = decay(acc_c, lam)
            s = t - first
            if lev[s] > 0:
                s_a, n_a, acc_a, s_b, n_b, acc_b, s_c, n_c, acc_c = add_at(
                    z, s, lev[s], top, 1.0, 1, r0, r1, r2, r3,
                    s_a, n_a, acc_a, s_b, n_b, acc_b, s_c, n_c, acc_c,
                )  # fmt: skip
            old = t - window - first
            if t >= window and lev[old] > 0:
                s_a, n_a, acc_a, s_b, n_b, acc_b, s_c, n_c, acc_c = add_at(
                    z, old, lev[old], top, -lam_w, -1, r0, r1, r2, r3,
                    s_a, n_a, acc_a, s_b, n_b, acc_b, s_c, n_c, acc_c,
                )  # fmt: skip
        since_anchor += 1
        if t < start:
            continue
        if n_b == 0 and n_c == 0:
            # One joint sample for every level.
            if n_a < min_obs or s_a <= 0.0:
                _store(outs, i, t, _ALL_NAN, n_a)
            else:
                _store(outs, i, t, _cascade_from_sums(acc_a, s_a, k), n_a)
            continue
        _store_levels(outs, i, t, k, min_obs, s_a, n_a, acc_a, s_b, n_b, acc_b, s_c, n_c, acc_c)


@njit(cache=True)
def _stock_cascade_one(z, lev, first, i, k, window, min_obs, lam, start, outs):
    """`_stock_cascade` for a stock whose sessions serve all its levels or none: one sample,
    the same operations on it (the other two stay empty), fewer values to carry."""
    n_t = outs[0].shape[1]
    r0 = r1 = r2 = r3 = 0.0
    s_a = 0.0
    n_a = 0
    acc_a = ZERO14
    lam_w = lam**window
    since_anchor = window
    for t in range(start - start % window, n_t):
        if since_anchor == window:
            since_anchor = 0
            lo = max(0, t - window + 1) - first
            r0, r1, r2, r3 = reference_means(z, lev, lo, t - first)
            s_a, n_a, acc_a = window_sums_one(z, lev, lo, t - first, lam, r0, r1, r2, r3)
        else:
            if lam != 1.0:
                s_a *= lam
                acc_a = decay(acc_a, lam)
            s = t - first
            if lev[s] > 0:
                s_a += 1.0
                n_a += 1
                acc_a = add_day(acc_a, 1.0, z[s, 0] - r0, z[s, 1] - r1, z[s, 2] - r2, z[s, 3] - r3)
            old = t - window - first
            if t >= window and lev[old] > 0:
                w = -lam_w
                s_a += w
                n_a -= 1
                acc_a = add_day(
                    acc_a, w, z[old, 0] - r0, z[old, 1] - r1, z[old, 2] - r2, z[old, 3] - r3
                )
        since_anchor += 1
        if t < start:
            continue
        if n_a < min_obs or s_a <= 0.0:
            _store(outs, i, t, _ALL_NAN, n_a)
        else:
            _store(outs, i, t, _cascade_from_sums(acc_a, s_a, k), n_a)


@njit(cache=True)
def _store_levels(outs, i, t, k, min_obs, s_a, n_a, acc_a, s_b, n_b, acc_b, s_c, n_c, acc_c):
    """Each level from its own sample, where they differ: the sums of a level are those of the
    days serving it (a: every level, b: one fewer, c: two fewer). The deepest level with
    `min_obs` observations fills the columns below it as a stock that stops there would (the
    rule for stocks without a subsector ETF), so a published value always names its level by
    the null sector/subsector fields beside it."""
    top = k - 1
    # Sample of level L: accumulators a (L <= top), b (L <= top - 1), c (L <= top - 2).
    s2, n2, acc2 = s_a, n_a, acc_a
    if top == 3:
        s2, n2, acc2 = s_a + s_b, n_a + n_b, plus(acc_a, acc_b)
    s1, n1, acc1 = s2, n2, acc2
    if top == 2:
        s1, n1, acc1 = s_a + s_b, n_a + n_b, plus(acc_a, acc_b)
    elif top == 3:
        s1, n1, acc1 = s2 + s_c, n2 + n_c, plus(acc2, acc_c)
    if n1 < min_obs or s1 <= 0.0:
        _store(outs, i, t, _ALL_NAN, n1)
        return
    v1 = _cascade_from_sums(acc1, s1, 2)
    deep = top >= 2 and n2 >= min_obs and s2 > 0.0
    if not deep:
        _store(outs, i, t, v1, n1)
        return
    v2 = _cascade_from_sums(acc2, s2, 3)
    if top == 3 and n_a >= min_obs and s_a > 0.0 and v2[3] == v2[3]:
        v3 = _cascade_from_sums(acc_a, s_a, 4)
        v = (
            v1[0], v1[1], v1[2], v2[3], v2[4], v2[5], v2[6], v2[7],
            v3[8], v3[9], v3[10], v3[11], v3[12], v3[13], v3[14],
        )  # fmt: skip
    else:
        v = (
            v1[0], v1[1], v1[2], v2[3], v2[4], v2[5], v2[6], v2[7],
            v2[8], v2[9], v2[10], v2[11], v2[12], v2[13], v2[14],
        )  # fmt: skip
    _store(outs, i, t, v, n1)


@njit(cache=True, inline="always")
def _cascade_from_sums(acc, s0, k):
    """Hedge ratios and risk shares (the first 15 fields) from the weighted sums: the covariance
    of (r, m, s, u) (first k of them), then the cascade; NaN where a level is not published."""
    m0, m1, m2, m3, x00, x10, x11, x20, x21, x22, x30, x31, x32, x33 = acc
    inv = 1.0 / s0  # one division per session; the rest are multiplications
    u0 = m0 * inv
    u1 = m1 * inv
    u2 = m2 * inv
    u3 = m3 * inv
    v_r = x00 * inv - u0 * u0
    c_rm = x10 * inv - u1 * u0
    v_m = x11 * inv - u1 * u1
    c_rs0 = x20 * inv - u2 * u0
    c_sm = x21 * inv - u2 * u1
    c_ss = x22 * inv - u2 * u2
    c_ru0 = x30 * inv - u3 * u0
    c_um = x31 * inv - u3 * u1
    c_us0 = x32 * inv - u3 * u2
    c_uu = x33 * inv - u3 * u3
    return _cascade(v_r, c_rm, v_m, c_rs0, c_sm, c_ss, c_ru0, c_um, c_us0, c_uu, k)


@njit(cache=True, inline="always")
def _cascade(v_r, c_rm, v_m, c_rs0, c_sm, c_ss, c_ru0, c_um, c_us0, c_uu, k):
    """Hedge ratios and risk shares from the covariance of (r, m, s, u): c_xy is cov(x, y)."""
    nan = _NAN
    if v_r <= _TINY_VAR or v_m <= _TINY_VAR:
        return _ALL_NAN
    inv_r = 1.0 / v_r
    inv_m = 1.0 / v_m
    b_m = c_rm * inv_m
    er_m = b_m * b_m * v_m * inv_r
    res_1 = 1.0 - er_m
    if k == 2:
        # A row hedged by the market only (an ETF, an unclassified stock) carries its L1 hedge
        # in the L2 and L3 columns, sector and subsector fields null.
        return (b_m, er_m, res_1, b_m, nan, er_m, nan, res_1, b_m, nan, nan, er_m, nan, nan, res_1)
    # L2: the sector ETF cleaned of the market.
    g = c_sm * inv_m
    v_s = c_ss - g * c_sm
    if v_s <= COLLINEAR_RTOL * c_ss or v_s <= _TINY_VAR:
        return (b_m, er_m, res_1, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan)
    inv_s = 1.0 / v_s
    c_rs = c_rs0 - g * c_rm
    b_s = c_rs * inv_s
    er_s = b_s * b_s * v_s * inv_r
    m_2 = b_m - b_s * g
    res_2 = 1.0 - er_m - er_s
    if k == 3:
        return (
            b_m, er_m, res_1, m_2, b_s, er_m, er_s, res_2,
            m_2, b_s, nan, er_m, er_s, nan, res_2,
        )  # fmt: skip
    # L3: the subsector ETF cleaned of the market and of the cleaned sector.
    d_m = c_um * inv_m
    c_us = c_us0 - g * c_um
    d_s = c_us * inv_s
    v_u = c_uu - d_m * c_um - d_s * c_us
    if v_u <= COLLINEAR_RTOL * c_uu or v_u <= _TINY_VAR:
        return (b_m, er_m, res_1, m_2, b_s, er_m, er_s, res_2, nan, nan, nan, nan, nan, nan, nan)
    c_ru = c_ru0 - d_m * c_rm - d_s * c_rs
    b_u = c_ru / v_u
    er_u = b_u * b_u * v_u * inv_r
    m_3 = b_m - b_s * g - b_u * d_m + b_u * d_s * g
    return (
        b_m, er_m, res_1, m_2, b_s, er_m, er_s, res_2,
        m_3, b_s - b_u * d_s, b_u, er_m, er_s, er_u, 1.0 - er_m - er_s - er_u,
    )  # fmt: skip


@njit(parallel=True, cache=True)
def _cascade_all(returns, factors, fidx, window, min_obs, lam, start, n_blocks, outs):
    n = returns.shape[0]
    n_t = returns.shape[1]
    first = max(0, start - start % window - window + 1)
    for blk in prange(n_blocks):
        # Scratch of this block, reused by each of its stocks.
        z = np.empty((n_t - first, NV))
        lev = np.empty(n_t - first, dtype=np.int8)
        for i in range(blk * n // n_blocks, (blk + 1) * n // n_blocks):
            k = 1
            for j in range(3):
                if fidx[i, j] >= 0:
                    k += 1
                else:
                    break
            if k == 1:
                for t in range(start, n_t):
                    _store(outs, i, t, _ALL_NAN, _NAN)
                continue
            if _load_stock(returns, factors, fidx, i, k, first, z, lev):
                _stock_cascade(z, lev, first, i, k, window, min_obs, lam, start, outs)
            else:
                _stock_cascade_one(z, lev, first, i, k, window, min_obs, lam, start, outs)


@contextmanager
def _slp_vectorized() -> Iterator[None]:
    """Compile the kernels with LLVM's SLP vectorizer, which numba leaves off by default: it packs
    the moment updates of the four variables into vector instructions (about 20% less CPU time
    for the cascade). Vectorizing independent lanes keeps IEEE arithmetic as written (no
    reassociation without fastmath), so the numbers are the same bit for bit (tested). numba
    reads the setting when it compiles, which happens on the first call (or never, from the
    on-disk cache), so it is set around the calls only."""
    config: Any = numba.config  # its settings are set at import, unknown to type checkers
    before = config.SLP_VECTORIZE
    config.SLP_VECTORIZE = 1
    try:
        yield
    finally:
        config.SLP_VECTORIZE = before


def ewma_lambda(halflife: float | None) -> float:
    """Per-session decay of the weights: 1 for equal weights, 0.5**(1/halflife) for EWMA."""
    return 1.0 if halflife is None else float(0.5 ** (1.0 / halflife))


def _blocks(n: int) -> int:
    return max(1, min(n, BLOCKS_PER_THREAD * numba.get_num_threads()))


def _check_start(start: int, n_t: int, out: object) -> int:
    if not 0 <= start <= n_t:
        raise ValueError(f"start must be within 0..{n_t}, got {start}")
    if start > 0 and out is None:
        raise ValueError("start > 0 updates outputs in place: pass them as out=")
    return int(start)


def _check_out(name: str, arr: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """An output the kernel may write in place: float64, C-contiguous, writable, this shape."""
    if not isinstance(arr, np.ndarray) or arr.shape != shape or arr.dtype != np.float64:
        raise ValueError(f"out[{name!r}] must be a float64 array of shape {shape}")
    if not arr.flags.c_contiguous or not arr.flags.writeable:
        raise ValueError(f"out[{name!r}] must be C-contiguous and writable")
    return arr


def rolling_cascade(
    returns: np.ndarray,
    factors: np.ndarray,
    factor_index: np.ndarray,
    *,
    window: int,
    min_obs: int,
    halflife: float | None = None,
    out: Mapping[str, np.ndarray] | None = None,
    start: int = 0,
) -> dict[str, np.ndarray]:
    """The cascade for every row of `returns` (n x T).

    `factors` (F x T) holds factor return rows; `factor_index` (n x 3) names, for each row, its
    market, sector and subsector factor rows (-1 = none; a level needs the ones above it).
    Returns one (n x T) array per name of CASCADE_FIELDS: the arrays of `out` when given (float64,
    C-contiguous, e.g. memory-mapped files), written in place, else new ones. With `start`, only
    sessions t >= start are computed (earlier values in `out` are left as they are); they equal
    a full run's bitwise. Outputs that all start at the same offset modulo 4 kB (separate
    page-aligned arrays or files) run about 40% slower: their 16 store streams share one L1 set.
    """
    returns = np.ascontiguousarray(returns, dtype=np.float64)
    factors = np.ascontiguousarray(factors, dtype=np.float64)
    fidx = np.ascontiguousarray(factor_index, dtype=np.int64)
    if window < 2 or min_obs < 2:
        raise ValueError("window and min_obs must be at least 2")
    if fidx.shape != (returns.shape[0], 3) or factors.shape[1:] != returns.shape[1:]:
        # The kernel reads without bounds checks: a mismatched index would read past its rows.
        raise ValueError(
            f"factor_index must be (n, 3) and factors (F, T) for returns {returns.shape}"
        )
    if fidx.size and (fidx.max() >= len(factors) or fidx.min() < -1):
        raise ValueError(f"factor_index must name factor rows 0..{len(factors) - 1} or -1")
    start = _check_start(start, returns.shape[1], out)
    if out is None:
        block = np.empty((len(CASCADE_FIELDS), *returns.shape))
        arrays = {name: block[f] for f, name in enumerate(CASCADE_FIELDS)}
    else:
        arrays = {name: _check_out(name, out[name], returns.shape) for name in CASCADE_FIELDS}
    outs = tuple(arrays[name] for name in CASCADE_FIELDS)
    lam = ewma_lambda(halflife)
    args = (int(window), int(min_obs), lam, start, _blocks(returns.shape[0]), outs)
    with _slp_vectorized():
        _cascade_all(returns, factors, fidx, *args)
    return arrays


def rolling_std(
    returns: np.ndarray,
    *,
    window: int,
    min_obs: int,
    out: np.ndarray | None = None,
    start: int = 0,
) -> np.ndarray:
    """Sample standard deviation (ddof=1) over the last `window` sessions, NaN below `min_obs`.

    `out` and `start` as in `rolling_cascade`: written in place, sessions t >= start only.
    """
    returns = np.ascontiguousarray(returns, dtype=np.float64)
    start = _check_start(start, returns.shape[1], out)
    out = np.empty_like(returns) if out is None else _check_out("std", out, returns.shape)
    with _slp_vectorized():
        rolling_std_all(returns, int(window), int(min_obs), start, out)
    return out

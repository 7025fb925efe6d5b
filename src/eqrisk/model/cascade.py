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
  only (the same operations in the same order: the same bits, about 5% less CPU);
- 9 of the 14 sums, and most of the cascade's arithmetic, are of the ETFs alone: stocks hedged
  with the same ETFs take them from one record per session of their group (`cascade_shared`)
  on each re-anchoring period where they have every level on every day, and carry 5 sums of
  their own (the same operations on the same values: the same bits; 84% of the stock-periods
  of the real market, a third less CPU).

Because every anchor starts from scratch, sessions t >= s need only the data from the anchor at or
before s, less one window (`start=`): a one-session update costs O(window) per stock, not O(T),
and equals a full run bitwise. Each re-anchoring period of a stock is a unit of its own (no
state crosses an anchor). The threads fill blocks of stocks, a group's stocks one after another,
each block with its own scratch (no allocation per stock), straight into the caller's outputs
(`out=`: memory-mapped files or a reused buffer), each output value written once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numba
import numpy as np
from numba import njit, prange

from eqrisk.model.cascade_shared import (
    factor_groups,
    full_span,
    group_records,
    shared_period,
)
from eqrisk.model.cascade_sums import (
    add_at,
    add_day,
    decay,
    plus,
    reference_means,
    window_sums,
    window_sums_one,
)
from eqrisk.model.cascade_values import (
    ALL_NAN,
    REC_FIELDS,
    cascade_from_sums,
    store_fields,
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

NV = 4  # variables of the cascade: the stock, market, sector and subsector returns


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


@njit(cache=True)
def _period(z, lev, first, i, k, window, min_obs, lam, start, a, outs):
    """Stock i's cascade for the sessions a..a+window-1 of one re-anchoring period (stored from
    `start`), from its scratch inputs (rows from `first`): at a, the reference means of the
    window (data <= a) and exact sums; then decay, add and drop."""
    n_t = outs[0].shape[1]
    top = k - 1
    lam_w = lam**window
    lo = max(0, a - window + 1) - first
    r0, r1, r2, r3 = reference_means(z, lev, lo, a - first)
    s_a, n_a, acc_a, s_b, n_b, acc_b, s_c, n_c, acc_c = window_sums(
        z, lev, top, lo, a - first, lam, r0, r1, r2, r3
    )
    for t in range(a, min(a + window, n_t)):
        if t > a:
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
        if t < start:
            continue
        if n_b == 0 and n_c == 0:
            # One joint sample for every level.
            if n_a < min_obs or s_a <= 0.0:
                store_fields(outs, i, t, ALL_NAN, n_a)
            else:
                store_fields(outs, i, t, cascade_from_sums(acc_a, s_a, k), n_a)
            continue
        _store_levels(outs, i, t, k, min_obs, s_a, n_a, acc_a, s_b, n_b, acc_b, s_c, n_c, acc_c)


@njit(cache=True)
def _period_one(z, lev, first, i, k, window, min_obs, lam, start, a, outs):
    """`_period` for a stock whose sessions serve all its levels or none: one sample, the same
    operations on it (the other two stay empty), fewer values to carry."""
    n_t = outs[0].shape[1]
    lam_w = lam**window
    lo = max(0, a - window + 1) - first
    r0, r1, r2, r3 = reference_means(z, lev, lo, a - first)
    s_a, n_a, acc_a = window_sums_one(z, lev, lo, a - first, lam, r0, r1, r2, r3)
    for t in range(a, min(a + window, n_t)):
        if t > a:
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
        if t < start:
            continue
        if n_a < min_obs or s_a <= 0.0:
            store_fields(outs, i, t, ALL_NAN, n_a)
        else:
            store_fields(outs, i, t, cascade_from_sums(acc_a, s_a, k), n_a)


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
        store_fields(outs, i, t, ALL_NAN, n1)
        return
    v1 = cascade_from_sums(acc1, s1, 2)
    deep = top >= 2 and n2 >= min_obs and s2 > 0.0
    if not deep:
        store_fields(outs, i, t, v1, n1)
        return
    v2 = cascade_from_sums(acc2, s2, 3)
    if top == 3 and n_a >= min_obs and s_a > 0.0 and v2[3] == v2[3]:
        v3 = cascade_from_sums(acc_a, s_a, 4)
        v = (
            v1[0], v1[1], v1[2], v2[3], v2[4], v2[5], v2[6], v2[7],
            v3[8], v3[9], v3[10], v3[11], v3[12], v3[13], v3[14],
        )  # fmt: skip
    else:
        v = (
            v1[0], v1[1], v1[2], v2[3], v2[4], v2[5], v2[6], v2[7],
            v2[8], v2[9], v2[10], v2[11], v2[12], v2[13], v2[14],
        )  # fmt: skip
    store_fields(outs, i, t, v, n1)


@njit(parallel=True, cache=True)
def _cascade_all(returns, factors, fidx, window, min_obs, lam, start, n_blocks, shared, outs):
    """Every stock's cascade, the threads taking blocks of stocks in `order` (a factor group's
    stocks one after another, so that its records stay in cache): a period where a stock has
    every level on every day of its stretch from its group's records (`group`: -1 for none),
    the others from its own sums."""
    order, group, rec, ref = shared
    n = returns.shape[0]
    n_t = returns.shape[1]
    a0 = start - start % window
    first = max(0, a0 - window + 1)
    for blk in prange(n_blocks):
        # Scratch of this block, reused by each of its stocks.
        z = np.empty((n_t - first, NV))
        lev = np.empty(n_t - first, dtype=np.int8)
        for j in range(blk * n // n_blocks, (blk + 1) * n // n_blocks):
            i = order[j]
            k = 1
            for f in range(3):
                if fidx[i, f] >= 0:
                    k += 1
                else:
                    break
            if k == 1:
                for t in range(start, n_t):
                    store_fields(outs, i, t, ALL_NAN, np.nan)
                continue
            mixed = _load_stock(returns, factors, fidx, i, k, first, z, lev)
            g = group[i]
            for a in range(a0, n_t, window):
                if g >= 0 and full_span(lev, first, k - 1, a, window, n_t):
                    p = (a - a0) // window
                    shared_period(z, first, i, k, window, lam, start, a, rec[g, a - a0 :],
                                  ref[g, p], outs)  # fmt: skip
                elif mixed:
                    _period(z, lev, first, i, k, window, min_obs, lam, start, a, outs)
                else:
                    _period_one(z, lev, first, i, k, window, min_obs, lam, start, a, outs)


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
    share: bool = True,
) -> dict[str, np.ndarray]:
    """The cascade for every row of `returns` (n x T).

    `factors` (F x T) holds factor return rows; `factor_index` (n x 3) names, for each row, its
    market, sector and subsector factor rows (-1 = none; a level needs the ones above it).
    Returns one (n x T) array per name of CASCADE_FIELDS: the arrays of `out` when given (float64,
    C-contiguous, e.g. memory-mapped files), written in place, else new ones. With `start`, only
    sessions t >= start are computed (earlier values in `out` are left as they are); they equal
    a full run's bitwise. Outputs that all start at the same offset modulo 4 kB (separate
    page-aligned arrays or files) run about 40% slower: their 16 store streams share one L1 set.
    With `share` (the default), rows hedged with the same factor rows share the moments of
    those factors where they have every level (`cascade_shared`): the same numbers, bit for
    bit, as each row on its own (`share=False`), for less work.
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
    shared = _shared_moments(factors, fidx, int(window), int(min_obs), lam, start, share)
    args = (int(window), int(min_obs), lam, start, _blocks(returns.shape[0]), shared, outs)
    with _slp_vectorized():
        _cascade_all(returns, factors, fidx, *args)
    return arrays


def _shared_moments(
    factors: np.ndarray, fidx: np.ndarray, window: int, min_obs: int, lam: float, start: int,
    share: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """The kernel's order of the rows (by factor group), each row's group (-1: none) and the
    groups' factor records and reference means from the anchor at or before `start`."""
    n, n_t = fidx.shape[0], factors.shape[1]
    present = np.cumprod(fidx >= 0, axis=1)  # a level needs the ones above it
    group, rows = factor_groups(fidx, present.sum(axis=1))
    if not share:
        group[:] = -1
        rows = rows[:0]
    a0 = start - start % window
    first = max(0, a0 - window + 1)
    periods = -(-(n_t - a0) // window)
    rec = np.empty((len(rows), n_t - a0, REC_FIELDS))
    ref = np.empty((len(rows), periods, 3))
    if len(rows) and n_t > a0:
        with _slp_vectorized():
            group_records(factors, rows, window, min_obs, lam, a0, first, rec, ref)
    order = np.argsort(group, kind="stable") if n else np.empty(0, dtype=np.int64)
    return order.astype(np.int64), group, rec, ref


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

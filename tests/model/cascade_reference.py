"""References of the cascade kernel.

`joint_reference_cascade` is the kernel as it was before issue 9 (fresh outputs, one scratch per
stock, every level on one joint sample), kept verbatim: where each level's sample is the same
(every ETF has the stock's days), the kernel equals it bitwise.

`reference_cascade` is the issue-22 definition built from it: each level on its own joint
sample (L1: stock and market; L2: and the sector; L3: and the subsector), by running the
verbatim kernel once per depth with the deeper levels cut off, then publishing each level from
its own run where its sample has `min_obs` observations; the deepest published level fills the
columns below it, as for a stock that stops there. `n_obs` is the L1 sample's count."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

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


@njit(cache=False, inline="always")
def _window_sums(z, valid, lo, hi, lam, ref, sums, cross):
    """From-scratch weighted sums over sessions lo..hi (inclusive) of the centred inputs."""
    s0 = 0.0
    cnt = 0
    for a in range(NV):
        sums[a] = 0.0
        for b in range(NV):
            cross[a, b] = 0.0
    w = 1.0
    for t in range(hi, lo - 1, -1):
        if valid[t]:
            cnt += 1
            s0 += w
            for a in range(NV):
                za = z[t, a] - ref[a]
                sums[a] += w * za
                for b in range(a + 1):
                    cross[a, b] += w * za * (z[t, b] - ref[b])
        w *= lam
    return s0, cnt


@njit(cache=False)
def _stock_cascade(y, xs, k, window, min_obs, lam, out):
    """Cascade of one stock. `xs` holds k-1 factor rows (market, sector, subsector).

    The inputs are laid out (session, variable) with NV = 4 variables whatever k is (absent
    levels are zeros), so that every inner loop has a fixed trip count the compiler unrolls.
    """
    n_t = y.shape[0]
    z = np.zeros((n_t, NV))
    valid = np.ones(n_t, dtype=np.bool_)
    for t in range(n_t):
        z[t, 0] = y[t]
        ok = np.isfinite(y[t])
        for a in range(1, k):
            z[t, a] = xs[a - 1, t]
            ok = ok and np.isfinite(xs[a - 1, t])
        valid[t] = ok
    ref = np.zeros(NV)
    sums = np.zeros(NV)
    cross = np.zeros((NV, NV))
    cov = np.zeros((NV, NV))
    mean = np.zeros(NV)
    s0 = 0.0
    cnt = 0
    lam_w = lam**window
    for t in range(n_t):
        lo = max(0, t - window + 1)
        if t % window == 0:
            # Re-anchor: reference mean of the window (data <= t), then exact sums.
            m_cnt = 0
            for a in range(NV):
                ref[a] = 0.0
            for s in range(lo, t + 1):
                if valid[s]:
                    m_cnt += 1
                    for a in range(NV):
                        ref[a] += z[s, a]
            if m_cnt > 0:
                for a in range(NV):
                    ref[a] /= m_cnt
            s0, cnt = _window_sums(z, valid, lo, t, lam, ref, sums, cross)
        else:
            if lam != 1.0:
                s0 *= lam
                for a in range(NV):
                    sums[a] *= lam
                    for b in range(a + 1):
                        cross[a, b] *= lam
            if valid[t]:
                cnt += 1
                s0 += 1.0
                for a in range(NV):
                    za = z[t, a] - ref[a]
                    sums[a] += za
                    for b in range(a + 1):
                        cross[a, b] += za * (z[t, b] - ref[b])
            old = t - window
            if old >= 0 and valid[old]:
                cnt -= 1
                s0 -= lam_w
                for a in range(NV):
                    za = z[old, a] - ref[a]
                    sums[a] -= lam_w * za
                    for b in range(a + 1):
                        cross[a, b] -= lam_w * za * (z[old, b] - ref[b])
        for f in range(out.shape[0]):
            out[f, t] = np.nan
        out[N_OBS, t] = cnt
        if cnt < min_obs or s0 <= 0.0:
            continue
        inv = 1.0 / s0  # one division per session; the rest are multiplications
        for a in range(NV):
            mean[a] = sums[a] * inv
        for a in range(NV):
            for b in range(a + 1):
                c = cross[a, b] * inv - mean[a] * mean[b]
                cov[a, b] = c
                cov[b, a] = c
        _cascade_from_cov(cov, k, out, t)


@njit(cache=False, inline="always")
def _cascade_from_cov(c, k, out, t):
    """Hedge ratios and risk shares from the covariance of (r, m, s, u) (first k of them)."""
    v_r = c[0, 0]
    v_m = c[1, 1]
    if v_r <= _TINY_VAR or v_m <= _TINY_VAR:
        return
    inv_r = 1.0 / v_r
    inv_m = 1.0 / v_m
    b_m = c[0, 1] * inv_m
    er_m = b_m * b_m * v_m * inv_r
    out[L1_MKT_HR, t] = b_m
    out[L1_MKT_ER, t] = er_m
    out[L1_RES_ER, t] = 1.0 - er_m
    if k == 2:
        # A row hedged by the market only (an ETF, an unclassified stock) carries its L1 hedge
        # in the L2 and L3 columns, sector and subsector fields null.
        out[L2_MKT_HR, t] = b_m
        out[L2_MKT_ER, t] = er_m
        out[L2_RES_ER, t] = 1.0 - er_m
        out[L3_MKT_HR, t] = b_m
        out[L3_MKT_ER, t] = er_m
        out[L3_RES_ER, t] = 1.0 - er_m
        return
    # L2: the sector ETF cleaned of the market.
    g = c[2, 1] * inv_m
    v_s = c[2, 2] - g * c[2, 1]
    if v_s <= COLLINEAR_RTOL * c[2, 2] or v_s <= _TINY_VAR:
        return
    inv_s = 1.0 / v_s
    c_rs = c[0, 2] - g * c[0, 1]
    b_s = c_rs * inv_s
    er_s = b_s * b_s * v_s * inv_r
    out[L2_MKT_HR, t] = b_m - b_s * g
    out[L2_SEC_HR, t] = b_s
    out[L2_MKT_ER, t] = er_m
    out[L2_SEC_ER, t] = er_s
    out[L2_RES_ER, t] = 1.0 - er_m - er_s
    if k == 3:
        out[L3_MKT_HR, t] = b_m - b_s * g
        out[L3_SEC_HR, t] = b_s
        out[L3_MKT_ER, t] = er_m
        out[L3_SEC_ER, t] = er_s
        out[L3_RES_ER, t] = 1.0 - er_m - er_s
        return
    # L3: the subsector ETF cleaned of the market and of the cleaned sector.
    d_m = c[3, 1] * inv_m
    c_us = c[3, 2] - g * c[3, 1]
    d_s = c_us * inv_s
    v_u = c[3, 3] - d_m * c[3, 1] - d_s * c_us
    if v_u <= COLLINEAR_RTOL * c[3, 3] or v_u <= _TINY_VAR:
        return
    c_ru = c[0, 3] - d_m * c[0, 1] - d_s * c_rs
    b_u = c_ru / v_u
    er_u = b_u * b_u * v_u * inv_r
    out[L3_SUB_HR, t] = b_u
    out[L3_SEC_HR, t] = b_s - b_u * d_s
    out[L3_MKT_HR, t] = b_m - b_s * g - b_u * d_m + b_u * d_s * g
    out[L3_MKT_ER, t] = er_m
    out[L3_SEC_ER, t] = er_s
    out[L3_SUB_ER, t] = er_u
    out[L3_RES_ER, t] = 1.0 - er_m - er_s - er_u


@njit(parallel=True, cache=False)
def _cascade_all(returns, factors, fidx, window, min_obs, lam, out):
    n = returns.shape[0]
    n_t = returns.shape[1]
    for i in prange(n):
        k = 1
        for j in range(3):
            if fidx[i, j] >= 0:
                k += 1
            else:
                break
        if k == 1:
            for f in range(out.shape[0]):
                for t in range(n_t):
                    out[f, i, t] = np.nan
            continue
        xs = np.empty((k - 1, n_t))
        for j in range(k - 1):
            xs[j] = factors[fidx[i, j]]
        _stock_cascade(returns[i], xs, k, window, min_obs, lam, out[:, i, :])


@njit(parallel=True, cache=False)
def _rolling_std_all(returns, window, min_obs, out):
    n, n_t = returns.shape
    for i in prange(n):
        y = returns[i]
        ref = 0.0
        s1 = 0.0
        s2 = 0.0
        cnt = 0
        for t in range(n_t):
            lo = max(0, t - window + 1)
            if t % window == 0:
                ref = 0.0
                m = 0
                for s in range(lo, t + 1):
                    if np.isfinite(y[s]):
                        ref += y[s]
                        m += 1
                ref = ref / m if m > 0 else 0.0
                s1 = 0.0
                s2 = 0.0
                cnt = 0
                for s in range(lo, t + 1):
                    if np.isfinite(y[s]):
                        d = y[s] - ref
                        s1 += d
                        s2 += d * d
                        cnt += 1
            else:
                if np.isfinite(y[t]):
                    d = y[t] - ref
                    s1 += d
                    s2 += d * d
                    cnt += 1
                old = t - window
                if old >= 0 and np.isfinite(y[old]):
                    d = y[old] - ref
                    s1 -= d
                    s2 -= d * d
                    cnt -= 1
            if cnt >= min_obs and cnt > 1:
                var = (s2 - s1 * s1 / cnt) / (cnt - 1)
                out[i, t] = np.sqrt(var) if var > 0.0 else 0.0
            else:
                out[i, t] = np.nan


def reference_cascade(
    returns: np.ndarray,
    factors: np.ndarray,
    fidx: np.ndarray,
    *,
    window: int,
    min_obs: int,
    lam: float = 1.0,
) -> np.ndarray:
    """(16 x n x T) in the order of CASCADE_FIELDS: every level on its own joint sample."""
    fidx = np.asarray(fidx, dtype=np.int64)
    depth = (fidx >= 0).cumprod(axis=1).sum(axis=1)  # levels each row has: 0..3
    runs = {}
    for d in (1, 2, 3):
        cut = fidx.copy()
        cut[:, d:] = -1
        runs[d] = joint_reference_cascade(
            returns, factors, cut, window=window, min_obs=min_obs, lam=lam
        )
    out = runs[1].copy()  # L1 in every column (the rule of a row hedged by the market only)
    l2 = (depth >= 2)[:, None] & (runs[2][N_OBS] >= min_obs)
    out[L2_MKT_HR:N_OBS] = np.where(l2, runs[2][L2_MKT_HR:N_OBS], out[L2_MKT_HR:N_OBS])
    l3 = (depth >= 3)[:, None] & l2 & (runs[3][N_OBS] >= min_obs) & np.isfinite(out[L2_MKT_HR])
    out[L3_MKT_HR:N_OBS] = np.where(l3, runs[3][L3_MKT_HR:N_OBS], out[L3_MKT_HR:N_OBS])
    return out


def joint_reference_cascade(
    returns: np.ndarray,
    factors: np.ndarray,
    fidx: np.ndarray,
    *,
    window: int,
    min_obs: int,
    lam: float = 1.0,
) -> np.ndarray:
    """(16 x n x T) in the order of CASCADE_FIELDS, every level on the joint sample."""
    out = np.empty((len(CASCADE_FIELDS), *returns.shape))
    _cascade_all(
        np.ascontiguousarray(returns),
        np.ascontiguousarray(factors),
        np.ascontiguousarray(fidx, dtype=np.int64),
        window,
        min_obs,
        lam,
        out,
    )
    return out


def reference_std(returns: np.ndarray, *, window: int, min_obs: int) -> np.ndarray:
    out = np.empty_like(returns)
    _rolling_std_all(np.ascontiguousarray(returns), window, min_obs, out)
    return out

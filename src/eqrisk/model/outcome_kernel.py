"""The compiled loop of the accuracy measure (`accuracy.portfolio_outcomes`): per session and
portfolio, the weights of the members with a forecast and a return, the portfolio's factor
exposures, its predicted variance, realised return and baseline. A portfolio holds a few dozen
stocks, so the loop visits its members only (a dense weights x exposures product per session
would touch every stock of every portfolio)."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def portfolio_days(
    members, weights, hedged, avail, index, level, values, cov, spec, r_sum, f_sum, base, fbase,
    style, out_real, out_model, out_base,
):  # fmt: skip
    """Sessions are the columns of `avail` (n x S), `level` (n x S), `values` (3 x n x S),
    `spec`, `r_sum`, `base` (n x S), `f_sum`, `fbase` (K x S) and `cov` (S x K x K); the
    members of portfolio p are members[p, :] (-1 = padding) with weights[p, :]. Long weights of
    the members present are scaled to sum to 1, short ones to -1. Outputs (P x S) are written
    where the portfolio has a member; the horizon's scaling is the caller's. `style` (S x n x
    S'): exposures to the second-layer factors, the last S of the K (never hedged: a hedged
    portfolio sells its exposure to the first K - S only, and keeps the second layer's risk)."""
    n_p, n_m = members.shape
    n_s = avail.shape[1]
    k = cov.shape[1]
    n_style = style.shape[0]
    n_etf = k - n_style
    x = np.zeros(k)
    touched = np.zeros(k, dtype=np.bool_)
    for t in range(n_s):
        for p in range(n_p):
            pos = 0.0
            neg = 0.0
            for a in range(n_m):
                i = members[p, a]
                if i < 0:
                    break
                if avail[i, t]:
                    w = weights[p, a]
                    if w > 0:
                        pos += w
                    else:
                        neg -= w
            if pos == 0.0 and neg == 0.0:
                continue
            x[:] = 0.0
            touched[:] = False
            spec_var = 0.0
            real = 0.0
            base_vol = 0.0
            for a in range(n_m):
                i = members[p, a]
                if i < 0:
                    break
                if not avail[i, t]:
                    continue
                w = weights[p, a]
                w = w / pos if w > 0 else w / neg
                for j in range(level[i, t]):
                    f = index[i, j]
                    if f >= 0:
                        x[f] += w * values[j, i, t]
                        touched[f] = True
                for s in range(n_style):
                    h = style[s, i, t]
                    if h != 0.0:
                        x[n_etf + s] += w * h
                        touched[n_etf + s] = True
                spec_var += w * w * spec[i, t]
                real += w * r_sum[i, t]
                if np.isfinite(base[i, t]):
                    base_vol += abs(w) * base[i, t]
            factor_var = 0.0
            for f in range(k):
                if not touched[f]:
                    continue
                if hedged[p] and f < n_etf:
                    real -= x[f] * f_sum[f, t]
                    if np.isfinite(fbase[f, t]):
                        base_vol += abs(x[f]) * fbase[f, t]
                    continue
                g0 = n_etf if hedged[p] else 0
                for g in range(g0, k):
                    if touched[g]:
                        factor_var += x[f] * cov[t, f, g] * x[g]
            out_real[p, t] = real
            out_model[p, t] = np.sqrt(spec_var + factor_var)
            out_base[p, t] = base_vol


@njit(cache=True)
def held_returns(members, weights, hedged, avail, index, level, values, r_sum, f_sum, out):  # fmt: skip
    """The realised return of each portfolio held from each of S sessions over a horizon: the
    positions of that session (`portfolio_days`' weights: members in `avail` (n x S), long
    weights scaled to 1, short to -1, a hedged one selling its ETF exposure; `index` (n x 3),
    `level` (n x S), `values` (3 x n x S)) times the horizon's summed returns `r_sum` (n x S)
    and `f_sum` (K x S). out (P x S) is written where the portfolio has a member."""
    n_p, n_m = members.shape
    k = f_sum.shape[0]
    x = np.zeros(k)
    for t in range(avail.shape[1]):
        for p in range(n_p):
            pos = 0.0
            neg = 0.0
            for a in range(n_m):
                i = members[p, a]
                if i < 0:
                    break
                if avail[i, t]:
                    w = weights[p, a]
                    if w > 0:
                        pos += w
                    else:
                        neg -= w
            if pos == 0.0 and neg == 0.0:
                continue
            x[:] = 0.0
            real = 0.0
            for a in range(n_m):
                i = members[p, a]
                if i < 0:
                    break
                if not avail[i, t]:
                    continue
                w = weights[p, a]
                w = w / pos if w > 0 else w / neg
                for j in range(level[i, t]):
                    f = index[i, j]
                    if f >= 0 and f < k:
                        x[f] += w * values[j, i, t]
                real += w * r_sum[i, t]
            if hedged[p]:
                for f in range(k):
                    real -= x[f] * f_sum[f, t]
            out[p, t] = real


@njit(cache=True)
def accumulate(z, count, s1, s2, s4, ring):  # fmt: skip
    """Add the columns of z (R x S) to the running sums one session after the other: per row
    with a finite z, count + 1, z, z^2 and z^4 to count, s1, s2, s4, and the first three to
    ring (3 x R, the current block's)."""
    for c in range(z.shape[1]):
        for r in range(z.shape[0]):
            v = z[r, c]
            if np.isfinite(v):
                q = v * v
                count[r] += 1.0
                s1[r] += v
                s2[r] += q
                s4[r] += q * q
                ring[0, r] += 1.0
                ring[1, r] += v
                ring[2, r] += q

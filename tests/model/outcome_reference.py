"""The accuracy measure's outcome loops as first written (before issue 35): per session and
portfolio, a pass over the members for the gross weights, another for the exposures (the first
layer's slot by slot, the second layer's where nonzero), then the quadratic form over the
factors the portfolio has, in order; the previous model in a pass of its own. The kernels of
`model.outcome_kernel` must give these bits."""

# ruff: noqa
from __future__ import annotations

import numpy as np
from numba import njit

from eqrisk.model.outcome_kernel import gross, twins

A = np.ndarray


def _by_session(a: np.ndarray) -> np.ndarray:
    """An (..., n, S) array as (S, n, ...), contiguous: a session's values in one block."""
    return np.ascontiguousarray(np.moveaxis(a, -1, 0).swapaxes(1, -1) if a.ndim == 3 else a.T)


def portfolio_days(
    members: A, weights: A, hedged: A, avail: A, index: A, level: A, values: A, cov: A, spec: A,
    r_sum: A, f_sum: A, base: A, fbase: A, style: A, out_real: A, out_model: A, out_base: A,
) -> None:  # fmt: skip
    """Sessions are the columns of `avail` (n x S), `level` (n x S), `values` (3 x n x S),
    `spec`, `r_sum`, `base` (n x S), `f_sum`, `fbase` (K x S) and `cov` (S x K x K); the
    members of portfolio p are members[p, :] (-1 = padding) with weights[p, :]. Long weights of
    the members present are scaled to sum to 1, short ones to -1. Outputs (P x S) are written
    where the portfolio has a member; the horizon's scaling is the caller's. `style` (S' x n x
    S): exposures to the second-layer factors, the last S' of the K (never hedged: a hedged
    portfolio sells its exposure to the first K - S' only, and keeps the second layer's risk)."""
    _portfolio_days(members, weights, hedged, twins(members, weights), _by_session(avail),
                    index, _by_session(level),
                    _by_session(values), cov, _by_session(spec), _by_session(r_sum), f_sum,
                    _by_session(base), fbase, _by_session(style), out_real, out_model,
                    out_base)  # fmt: skip


@njit
def _members(members, weights, av, p, pos, neg, index, level, values, spec, r_sum, base, style,
             t, n_etf, x, touched):  # fmt: skip
    """Portfolio p's factor exposures on session t added to x (`touched`: the factors it has),
    and its specific variance, realised return and baseline volatility."""
    spec_var = 0.0
    real = 0.0
    base_vol = 0.0
    for a in range(members.shape[1]):
        i = members[p, a]
        if i < 0:
            break
        if not av[i]:
            continue
        w = weights[p, a]
        w = w / pos if w > 0 else w / neg
        for j in range(level[t, i]):
            f = index[i, j]
            if f >= 0:
                x[f] += w * values[t, i, j]
                touched[f] = True
        for s in range(style.shape[2]):
            h = style[t, i, s]
            if h != 0.0:
                x[n_etf + s] += w * h
                touched[n_etf + s] = True
        spec_var += w * w * spec[t, i]
        real += w * r_sum[t, i]
        if np.isfinite(base[t, i]):
            base_vol += abs(w) * base[t, i]
    return spec_var, real, base_vol


@njit
def _portfolio_days(
    members, weights, hedged, twin, avail, index, level, values, cov, spec, r_sum, f_sum, base,
    fbase, style, out_real, out_model, out_base,
):  # fmt: skip
    """`portfolio_days` on session-major inputs: avail, level, spec, r_sum, base (S x n),
    values (S x n x 3), style (S x n x S'); twin[p] = q < p holding the same positions (-1:
    none), whose exposures p reuses."""
    n_p = members.shape[0]
    k = cov.shape[1]
    n_etf = k - style.shape[2]
    xs = np.zeros((n_p, k))
    touched = np.zeros((n_p, k), dtype=np.bool_)
    sums = np.zeros((n_p, 3))  # specific variance, realised return, baseline (unhedged)
    used = np.zeros(k, dtype=np.int64)
    for t in range(avail.shape[0]):
        av = avail[t]
        for p in range(n_p):
            pos, neg = gross(members, weights, av, p)
            if pos == 0.0 and neg == 0.0:
                continue
            x = xs[p]
            q = twin[p]
            if q >= 0:
                x[:] = xs[q]
                touched[p] = touched[q]
                sums[p] = sums[q]
            else:
                x[:] = 0.0
                touched[p] = False
                sums[p, 0], sums[p, 1], sums[p, 2] = _members(
                    members, weights, av, p, pos, neg, index, level, values, spec, r_sum, base,
                    style, t, n_etf, x, touched[p])  # fmt: skip
            spec_var, real, base_vol = sums[p, 0], sums[p, 1], sums[p, 2]
            m = 0  # the touched factors, in order
            for f in range(k):
                if touched[p, f]:
                    used[m] = f
                    m += 1
            g0 = 0  # a hedged portfolio's risk: the second layer's factors only
            if hedged[p]:
                while g0 < m and used[g0] < n_etf:
                    f = used[g0]
                    real -= x[f] * f_sum[f, t]
                    if np.isfinite(fbase[f, t]):
                        base_vol += abs(x[f]) * fbase[f, t]
                    g0 += 1
            factor_var = 0.0
            for u in range(g0, m):
                f = used[u]
                for v in range(g0, m):
                    g = used[v]
                    factor_var += x[f] * cov[t, f, g] * x[g]
            out_real[p, t] = real
            out_model[p, t] = np.sqrt(spec_var + factor_var)
            out_base[p, t] = base_vol


def held_returns(
    members: A, weights: A, hedged: A, avail: A, index: A, level: A, values: A, r_sum: A,
    f_sum: A, out: A,
) -> None:  # fmt: skip
    """The realised return of each portfolio held from each of S sessions over a horizon: the
    positions of that session (`portfolio_days`' weights: members in `avail` (n x S), long
    weights scaled to 1, short to -1, a hedged one selling its ETF exposure; `index` (n x 3),
    `level` (n x S), `values` (3 x n x S)) times the horizon's summed returns `r_sum` (n x S)
    and `f_sum` (K x S). out (P x S) is written where the portfolio has a member."""
    _held_returns(members, weights, hedged, _by_session(avail), index, _by_session(level),
                  _by_session(values), _by_session(r_sum), f_sum, out)  # fmt: skip


@njit
def _held_returns(members, weights, hedged, avail, index, level, values, r_sum, f_sum, out):  # fmt: skip
    """`held_returns` on session-major inputs (as `_portfolio_days`)."""
    n_p, n_m = members.shape
    k = f_sum.shape[0]
    x = np.zeros(k)
    for t in range(avail.shape[0]):
        av = avail[t]
        for p in range(n_p):
            pos, neg = gross(members, weights, av, p)
            if pos == 0.0 and neg == 0.0:
                continue
            x[:] = 0.0
            real = 0.0
            for a in range(n_m):
                i = members[p, a]
                if i < 0:
                    break
                if not av[i]:
                    continue
                w = weights[p, a]
                w = w / pos if w > 0 else w / neg
                if hedged[p]:
                    for j in range(level[t, i]):
                        f = index[i, j]
                        if f >= 0 and f < k:
                            x[f] += w * values[t, i, j]
                real += w * r_sum[t, i]
            if hedged[p]:
                for f in range(k):
                    real -= x[f] * f_sum[f, t]
            out[p, t] = real

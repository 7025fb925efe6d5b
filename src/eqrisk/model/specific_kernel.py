"""The specific variances' recursion and shrinkage as numba kernels (`specific.specific_variance`):
every row's EWMA recursion through its sessions, then every session's shrinkage toward its
group's mean, each in parallel blocks (`risk_kernel.parallel_blocks`). A row's recursion reads
its own state and residuals only, a session's shrinkage that session's raw forecasts only, so
the split changes no bit. The recursion does numpy's elementwise operations in numpy's order
(bit for bit those of the vectorised code it replaces); group means are sums in row order
(numpy's `bincount`), the cross-section's mean too (numpy's pairwise sum differed from it in
the last bit).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from eqrisk.model.risk_kernel import newey_west


@njit(cache=True, nogil=True, error_model="numpy")
def _shrink_session(
    raw, evidence, groups, c, g_col, n_groups, min_group, prior_obs, floor2, var
):  # pragma: no cover - compiled
    """One session's shrinkage of raw[:, c] into var[:, c] (specific's docstring): a stock's
    EWMA variance toward its group's mean (a group of the session's forecast stocks with at
    least `min_group` of them; else the whole cross-section's) by its evidence, floored."""
    n = raw.shape[0]
    sizes = np.zeros(n_groups + 1)
    sums = np.zeros(n_groups + 1)
    count = np.zeros(n_groups + 1)
    for i in range(n):
        g = groups[i, g_col]
        if np.isfinite(raw[i, c]) and g >= 0:
            sizes[g] += 1.0
    total = 0.0
    seen = 0
    for i in range(n):
        x = raw[i, c]
        if not np.isfinite(x):
            continue
        g = groups[i, g_col]
        if g < 0 or sizes[g] < min_group:
            g = n_groups
        sums[g] += x
        count[g] += 1.0
        total += x
        seen += 1
    for i in range(n):
        x = raw[i, c]
        if not np.isfinite(x):
            var[i, c] = np.nan
            continue
        g = groups[i, g_col]
        if g < 0 or sizes[g] < min_group:
            g = n_groups
        mean = total / seen if g == n_groups else sums[g] / max(count[g], 1.0)
        n_i = evidence[i, c]
        post = (n_i * x + prior_obs * mean) / (n_i + prior_obs) if prior_obs > 0 else x
        var[i, c] = post if (post >= floor2 or post != post) else floor2


@njit(cache=True, nogil=True, error_model="numpy", parallel=True)
def specific_kernel(
    e,
    first_column,
    start,
    groups,
    n_groups,
    min_group,
    lam,
    nw,
    min_obs,
    prior_obs,
    floor2,
    sums,
    weights,
    squares,
    count,
    lagged,
    raw,
    evidence,
    var,
    nb,
):  # pragma: no cover - compiled
    """The specific recursion of sessions start..T-1 (specific.specific_variance): the
    forecast of each from the state (EWMA sums of lagged products, weights, squared weights,
    counts, last residuals), updated in place, then the session's residuals join it. A row's
    recursion reads its own state and residuals only, a session's shrinkage that session's
    raw forecasts only: first the rows, then the sessions, each in `nb` parallel blocks."""
    n, n_cols = e.shape
    for blk in prange(nb):
        for i in range(blk * n // nb, (blk + 1) * n // nb):
            _specific_row(e, first_column, start, i, lam, nw, min_obs, sums, weights,
                          squares, count, lagged, raw, evidence)  # fmt: skip
    n_s = first_column + n_cols - start
    for blk in prange(nb):
        for c in range(blk * n_s // nb, (blk + 1) * n_s // nb):
            col = c + start - first_column
            g_col = col if groups.shape[1] > 1 else 0
            _shrink_session(
                raw, evidence, groups, c, g_col, n_groups, min_group, prior_obs, floor2, var
            )


@njit(cache=True, nogil=True, error_model="numpy")
def _specific_row(
    e, first_column, start, i, lam, nw, min_obs, sums, weights, squares, count, lagged, raw,
    evidence,
):  # pragma: no cover - compiled  # fmt: skip
    """Row i of `specific_kernel`'s recursion: its raw forecast and evidence of each session,
    its state updated in place."""
    n_cols = e.shape[1]
    n_lags = nw.shape[0]
    lam2 = lam * lam
    for t in range(start, first_column + n_cols):
        c = t - start
        col = t - first_column
        v = newey_west(sums, weights, nw, i)
        raw[i, c] = v if count[i] >= min_obs else np.nan
        sq = squares[i]
        evidence[i, c] = weights[0, i] * weights[0, i] / sq if sq > 0 else 0.0
        x = e[i, col]
        for lag in range(n_lags + 1):
            prod = x * (x if lag == 0 else lagged[lag - 1, i])
            ok = np.isfinite(prod)
            sums[lag, i] = lam * sums[lag, i] + (prod if ok else 0.0)
            weights[lag, i] = lam * weights[lag, i] + (1.0 if ok else 0.0)
            if lag == 0:
                squares[i] = lam2 * squares[i] + (1.0 if ok else 0.0)
                count[i] += 1.0 if ok else 0.0
        for lag in range(n_lags - 1, 0, -1):
            lagged[lag, i] = lagged[lag - 1, i]
        if n_lags:
            lagged[0, i] = x

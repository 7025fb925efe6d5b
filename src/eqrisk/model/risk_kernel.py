"""The risk model's per-session loops as numba kernels: the second layer's cross-sectional
regressions (`style_regression.style_returns`, `estimation_noise`), each row's factor variance
(`RiskModel.factor_var`) and the factor covariance's recursion (the specific variances' are in
`specific_kernel`). One pass over the sessions of a run, no numpy call per session.

Each session is computed from that session's numbers alone, in a fixed order (rows in order,
factors in order), so a session's result does not depend on the run or the chunk it is part of:
an incremental build equals a full one bit for bit, and the kernels run blocks of sessions
(of rows) on numba's threads (`parallel_blocks`) with the same bits. The regression is a
Householder QR of W^1/2 X over the session's stocks (as `style_regression.wls`, numerically
the same method).
"""

from __future__ import annotations

import numpy as np
from numba import get_num_threads, njit, prange


@njit(cache=True, nogil=True, error_model="numpy")
def _dot(a, b, lo, hi):  # pragma: no cover - compiled
    """sum of a[i] * b[i], i in [lo, hi), in four interleaved partial sums (a fixed order:
    the same numbers give the same sum; four chains instead of one dependent one)."""
    s0 = 0.0
    s1 = 0.0
    s2 = 0.0
    s3 = 0.0
    i = lo
    while i + 3 < hi:
        s0 += a[i] * b[i]
        s1 += a[i + 1] * b[i + 1]
        s2 += a[i + 2] * b[i + 2]
        s3 += a[i + 3] * b[i + 3]
        i += 4
    while i < hi:
        s0 += a[i] * b[i]
        i += 1
    return (s0 + s1) + (s2 + s3)


@njit(cache=True, nogil=True, error_model="numpy")
def _qr(at, m, p, qt, r):  # pragma: no cover - compiled
    """Householder QR of the (m x p) matrix held transposed in at[:p, :m] (destroyed): the
    thin Q, transposed, into qt[:p, :m] and R into r[:p, :p]."""
    beta = np.zeros(p)
    for k in range(p):
        vk = at[k]
        norm = np.sqrt(_dot(vk, vk, k, m))
        alpha = -norm if vk[k] >= 0.0 else norm
        vk[k] -= alpha
        vv = _dot(vk, vk, k, m)
        beta[k] = 2.0 / vv if vv > 0.0 else 0.0
        for j in range(k + 1, p):
            vj = at[j]
            f = beta[k] * _dot(vk, vj, k, m)
            for i in range(k, m):
                vj[i] -= f * vk[i]
        for j in range(p):
            r[k, j] = 0.0
        r[k, k] = alpha
        for j in range(k + 1, p):
            r[k, j] = at[j, k]
    for j in range(p):
        for i in range(m):
            qt[j, i] = 1.0 if i == j else 0.0
    for k in range(p - 1, -1, -1):
        vk = at[k]
        for j in range(k, p):
            qj = qt[j]
            f = beta[k] * _dot(vk, qj, k, m)
            for i in range(k, m):
                qj[i] -= f * vk[i]


@njit(cache=True, nogil=True, error_model="numpy")
def _r_inverse(r, p, out):  # pragma: no cover - compiled
    """out[:p, :p] = R^-1 (upper triangular), by back substitution on the identity."""
    for c in range(p):
        for j in range(p - 1, -1, -1):
            s = 1.0 if j == c else 0.0
            for k in range(j + 1, p):
                s -= r[j, k] * out[k, c]
            out[j, c] = s / r[j, j]


@njit(cache=True, nogil=True, error_model="numpy")
def _session_design(exposures, w, resid, t, intercept, rows, cols):  # pragma: no cover
    """The stocks (into rows) and factors (into cols, -1 the intercept) of session t's
    regression: finite residual, exposures and weight; a style without a non-zero exposure
    among them is left out. Returns (m, number of columns)."""
    n, n_style = exposures.shape[1], exposures.shape[2]
    m = 0
    for i in range(n):
        good = np.isfinite(resid[t, i]) and np.isfinite(w[t, i])
        for s in range(n_style):
            good = good and np.isfinite(exposures[t, i, s])
        if good:
            rows[m] = i
            m += 1
    p = 0
    if intercept:
        cols[0] = -1
        p = 1
    for s in range(n_style):
        for k in range(m):
            if exposures[t, rows[k], s] != 0.0:
                cols[p] = s
                p += 1
                break
    return m, p


@njit(cache=True, nogil=True, error_model="numpy")
def _fill(exposures, w, rows, cols, m, p, t, at):  # pragma: no cover - compiled
    """at[:p, :m] = (W^1/2 X)' of session t's design."""
    for k in range(m):
        sw = np.sqrt(w[t, rows[k]])
        for j in range(p):
            c = cols[j]
            x = 1.0 if c < 0 else exposures[t, rows[k], c]
            at[j, k] = x * sw


def parallel_blocks(count: int) -> int:
    """How many blocks the parallel kernels split their `count` sessions or rows into (their
    `nb`): each block's scratch is allocated once and its items run in order."""
    return max(1, min(count, 4 * get_num_threads()))


@njit(cache=True, nogil=True, error_model="numpy", parallel=True)
def style_returns_kernel(
    resid,
    exposures,
    w,
    intercept,
    min_stocks,
    returns,
    tstat,
    r2,
    stocks,
    residuals,
    used,
    leverage,
    nb,
):  # pragma: no cover - compiled
    """Every session's weighted least squares (style_regression.style_returns), into the
    output arrays (returns, tstat: rows are the intercept first when asked, then the styles).
    `w`: the regression weights (NaN where a stock has no usable cap). Blocks of sessions run
    in parallel (`nb`: `parallel_blocks`): a session's numbers are its own, so the split
    changes no bit."""
    n_s, n, n_style = exposures.shape
    width = n_style + 1
    for blk in prange(nb):
        rows = np.empty(n, np.int64)
        cols = np.empty(width, np.int64)
        work = np.empty((2 * width + 2, n))  # at, qt, W^1/2 y, the leverage
        r = np.empty((2, width, width))  # R, R^-1
        for t in range(blk * n_s // nb, (blk + 1) * n_s // nb):
            _regress(resid, exposures, w, intercept, min_stocks, t, rows, cols, work, r,
                     (returns, tstat, r2, stocks, residuals, used, leverage))  # fmt: skip


@njit(cache=True, nogil=True, error_model="numpy")
def _regress(
    resid, exposures, w, intercept, min_stocks, t, rows, cols, work, rr, outs
):  # pragma: no cover - compiled
    """Session t of `style_returns_kernel` into its outputs `outs`; rows, cols, work, rr:
    scratch."""
    returns, tstat, r2, stocks, residuals, used, leverage = outs
    width = exposures.shape[2] + 1
    at, qt = work[:width], work[width : 2 * width]
    yw, lev = work[2 * width], work[2 * width + 1]
    r, rinv = rr[0], rr[1]
    params = np.empty(width)
    shift = 1 if intercept else 0
    m, p = _session_design(exposures, w, resid, t, intercept, rows, cols)
    if m < max(min_stocks, 2 * p + 1) or p == 0:
        return
    _fill(exposures, w, rows, cols, m, p, t, at)
    _qr(at, m, p, qt, r)
    for k in range(m):
        yw[k] = resid[t, rows[k]] * np.sqrt(w[t, rows[k]])
        lev[k] = 0.0
    for j in range(p):  # Q' W^1/2 y; the leverage, sum over j of Q_kj^2
        params[j] = _dot(qt[j], yw, 0, m)
        for k in range(m):
            lev[k] += qt[j, k] * qt[j, k]
    for j in range(p - 1, -1, -1):
        s = params[j]
        for k in range(j + 1, p):
            s -= r[j, k] * params[k]
        params[j] = s / r[j, j]
    ssr = 0.0
    wsum = 0.0
    wy = 0.0
    for k in range(m):
        i = rows[k]
        fitted = 0.0
        for j in range(p):
            c = cols[j]
            fitted += (1.0 if c < 0 else exposures[t, i, c]) * params[j]
        e = resid[t, i] - fitted
        residuals[t, i] = e
        ssr += w[t, i] * e * e
        wsum += w[t, i]
        wy += w[t, i] * resid[t, i]
        leverage[t, i] = lev[k]
        used[t, i] = True
    tss = 0.0
    mean = wy / wsum
    for k in range(m):
        y = resid[t, rows[k]]
        d = y - mean if intercept else y
        tss += w[t, rows[k]] * d * d
    sigma2 = ssr / (m - p)
    _r_inverse(r, p, rinv)
    for j in range(p):
        s = 0.0
        for k in range(p):
            s += rinv[j, k] * rinv[j, k]
        row = cols[j] + shift
        returns[row, t] = params[j]
        tstat[row, t] = params[j] / np.sqrt(sigma2 * s)
    r2[t] = 1.0 - ssr / tss
    stocks[t] = m


@njit(cache=True, nogil=True, error_model="numpy", parallel=True)
def estimation_noise_kernel(
    exposures, w, used, estimated, specific_var, intercept, out, nb
):  # pragma: no cover - compiled
    """Every session's (X'WX)^-1 X'W Omega W X (X'WX)^-1 = R^-1 Q' (W Omega) Q R^-T over its
    regression's stocks (`used`) and estimated factors (`estimated`, rows of `out`), W^1/2 X
    = QR; Omega: the stocks' specific variances (a missing one: the session's median); the
    upper triangle mirrored, so that it is exactly symmetric. Blocks of sessions in parallel,
    as `style_returns_kernel`."""
    n_s, n = exposures.shape[0], exposures.shape[1]
    p_all = out.shape[1]
    for blk in prange(nb):
        rows = np.empty(n, np.int64)
        cols = np.empty((2, p_all), np.int64)  # the columns, the estimated rows of out
        work = np.empty((2 * p_all + 2, n))  # at, qt, omega, its scaled rows
        small = np.empty((4, p_all, p_all))  # R, R^-1, Q' W Omega Q, the covariance
        for t in range(blk * n_s // nb, (blk + 1) * n_s // nb):
            _noise_session(exposures, w, used, estimated, specific_var, intercept, t, rows,
                           cols, work, small, out)  # fmt: skip


@njit(cache=True, nogil=True, error_model="numpy")
def _noise_session(
    exposures, w, used, estimated, specific_var, intercept, t, rows, cols2, work, small, out
):  # pragma: no cover - compiled
    """Session t of `estimation_noise_kernel`; rows, cols2, work, small: scratch."""
    n = exposures.shape[1]
    p_all = out.shape[1]
    shift = 1 if intercept else 0
    cols, est = cols2[0], cols2[1]
    at, qt = work[:p_all], work[p_all : 2 * p_all]
    omega, scaled = work[2 * p_all], work[2 * p_all + 1]
    r, rinv, mid, cov = small[0], small[1], small[2], small[3]
    m = 0
    known = 0
    for i in range(n):
        if used[t, i]:
            rows[m] = i
            omega[m] = specific_var[t, i]
            if np.isfinite(omega[m]):
                known += 1
            m += 1
    if m == 0 or known == 0:
        return
    if known < m:
        have = np.empty(known)
        h = 0
        for k in range(m):
            if np.isfinite(omega[k]):
                have[h] = omega[k]
                h += 1
        fill = np.median(have)
        for k in range(m):
            if not np.isfinite(omega[k]):
                omega[k] = fill
    p = 0
    for j in range(p_all):
        if estimated[j, t]:
            est[p] = j
            cols[p] = j - shift
            p += 1
    _fill(exposures, w, rows, cols, m, p, t, at)
    _qr(at, m, p, qt, r)
    _r_inverse(r, p, rinv)
    for a in range(p):  # Q' (W Omega) Q
        for k in range(m):
            scaled[k] = qt[a, k] * (w[t, rows[k]] * omega[k])
        for b in range(a, p):
            s = _dot(scaled, qt[b], 0, m)
            mid[a, b] = s
            mid[b, a] = s
    for a in range(p):  # R^-1 M R^-T, the upper triangle
        for b in range(a, p):
            s = 0.0
            for c in range(a, p):
                inner = 0.0
                for d in range(b, p):
                    inner += mid[c, d] * rinv[b, d]
                s += rinv[a, c] * inner
            cov[a, b] = s
    for a in range(p):
        for b in range(a, p):
            out[t, est[a], est[b]] = cov[a, b]
            out[t, est[b], est[a]] = cov[a, b]


@njit(cache=True, nogil=True, error_model="numpy", parallel=True)
def factor_var_kernel(index, values, level, cov, style, k0, out, nb):  # pragma: no cover
    """h' F h of each row and session (RiskModel.factor_var): the ETF slots of the level used,
    then (with `style`, S x n x T; an empty first axis without) the second layer's part
    h_s' F_ss h_s + 2 h_etf' F_es h_s over F with its NaN as 0. Sessions in tiles, so that
    the tile's F stays in cache while the rows go by; blocks of rows in parallel (`nb`), each
    row's numbers its own."""
    n, n_t = level.shape
    n_style = style.shape[0]
    n_k = cov.shape[1]
    tile = 32
    for blk in prange(nb):
        block = np.empty((tile, n_k, n_style))  # F[:, k0 + a] of the tile's sessions, NaN as 0
        for t0 in range(0, n_t, tile):
            _factor_var_tile(index, values, level, cov, style, k0, out, block, t0,
                             blk * n // nb, (blk + 1) * n // nb)  # fmt: skip


@njit(cache=True, nogil=True, error_model="numpy")
def _factor_var_tile(
    index, values, level, cov, style, k0, out, block, t0, i0, i1
):  # pragma: no cover - compiled
    """`factor_var_kernel`'s rows i0..i1-1 of the sessions of the tile from t0."""
    n_t = level.shape[1]
    n_style = style.shape[0]
    n_k = cov.shape[1]
    t1 = min(t0 + block.shape[0], n_t)
    for t in range(t0, t1):
        for k in range(n_k):
            for a in range(n_style):
                f = cov[t, k, k0 + a]
                block[t - t0, k, a] = f if f == f else 0.0
    for i in range(i0, i1):
        for t in range(t0, t1):
            lv = level[i, t]
            if lv == 0:
                out[i, t] = np.nan
                continue
            total = 0.0
            for a in range(3):
                for b in range(3):
                    ia, ib = index[i, a], index[i, b]
                    if ia >= 0 and ib >= 0 and lv > a and lv > b:
                        total += values[a, i, t] * values[b, i, t] * cov[t, ia, ib]
            if n_style:
                quad = 0.0
                for a in range(n_style):
                    for b in range(n_style):
                        quad += style[a, i, t] * block[t - t0, k0 + a, b] * style[b, i, t]
                for j in range(3):
                    ij = index[i, j]
                    if ij < 0 or lv <= j:
                        continue
                    cross = 0.0
                    for a in range(n_style):
                        cross += block[t - t0, ij, a] * style[a, i, t]
                    quad += 2.0 * (values[j, i, t] * cross)
                total += quad
            out[i, t] = total


@njit(cache=True, nogil=True, error_model="numpy")
def newey_west(sums, weights, nw, j):  # pragma: no cover - compiled
    """The Newey-West variance of series j from its EWMA lag sums and weights (lag 0 first):
    the lag-0 mean plus 2 nw[l-1] times each finite lag-l mean, back to the lag-0 mean when
    that is not positive. Shared by the factor and the specific variances."""
    m0 = sums[0, j] / weights[0, j]
    out = m0
    for lag in range(1, nw.shape[0] + 1):
        ml = sums[lag, j] / weights[lag, j]
        out += 2.0 * nw[lag - 1] * (ml if np.isfinite(ml) else 0.0)
    return out if out > 0.0 else m0


@njit(cache=True, nogil=True, error_model="numpy")
def covariance_kernel(
    f,
    start,
    lam_v,
    lam_c,
    nw,
    min_obs,
    standardised,
    noise,
    has_noise,
    vs,
    vw,
    vc,
    cross,
    own,
    pc,
    lagged,
    nsum,
    cov,
    vol,
    obs,
    signal,
):  # pragma: no cover - compiled
    """The factor covariance's recursion (covariance.factor_covariance) over sessions
    start..T-1 of f (K x T), the state (own moments vs, vw, vc; pair moments cross, own, pc;
    lagged returns; noise sums) updated in place: numpy's elementwise operations of the
    vectorised code in its order, so the numbers are the same bit for bit."""
    k, n_t = f.shape
    n_lags = nw.shape[0]
    x = np.empty(k)
    xs = np.empty(k)
    scale = np.empty(k)
    for t in range(start, n_t):
        c = t - start
        for j in range(k):
            v = newey_west(vs, vw, nw, j)
            vol[c, j] = np.sqrt(v) if vc[j] >= min_obs else np.nan
            obs[c, j] = vc[j]
        for a in range(k):
            for b in range(k):
                if a == b:
                    rho = 1.0
                else:
                    rho = cross[a, b] / np.sqrt(own[a, b] * own[b, a])
                    if not (pc[a, b] >= min_obs and np.isfinite(rho)):
                        rho = 0.0
                cov[c, a, b] = rho * (vol[c, a] * vol[c, b])
        if has_noise:
            for j in range(k):
                total = vs[0, j] + nsum[j]
                kappa = min(max(vs[0, j] / total, 0.0), 1.0)
                signal[c, j] = kappa if (nsum[j] > 0 and total > 0) else 1.0
        for j in range(k):
            x[j] = f[j, t]
            scale[j] = 1.0 / vol[c, j] if standardised else 1.0
            xs[j] = x[j] * scale[j] if standardised else x[j]
        for j in range(k):  # the own moments
            for lag in range(n_lags + 1):
                prod = x[j] * (x[j] if lag == 0 else lagged[lag - 1, j])
                ok = np.isfinite(prod)
                vs[lag, j] = lam_v * vs[lag, j] + (prod if ok else 0.0)
                vw[lag, j] = lam_v * vw[lag, j] + (1.0 if ok else 0.0)
            vc[j] += 1.0 if np.isfinite(x[j]) else 0.0
        for a in range(k):  # the pair moments
            sa = np.isfinite(xs[a])
            xa = xs[a] if sa else 0.0
            for b in range(k):
                sb = np.isfinite(xs[b])
                xb = xs[b] if sb else 0.0
                cross[a, b] = lam_c * cross[a, b] + xa * xb
                own[a, b] = lam_c * own[a, b] + (xa * xa if (sa and sb) else 0.0)
                pc[a, b] += 1.0 if (sa and sb) else 0.0
        if has_noise:
            for j in range(k):
                if np.isfinite(x[j]):
                    vs[0, j] -= noise[c, j, j]
            for a in range(k):
                if not np.isfinite(xs[a]):
                    continue
                diag = noise[c, a, a] * (scale[a] * scale[a])
                for b in range(k):
                    if np.isfinite(xs[b]):
                        cross[a, b] -= noise[c, a, b] * (scale[a] * scale[b])
                        own[a, b] -= diag
            for j in range(k):
                nsum[j] = lam_v * nsum[j] + (noise[c, j, j] if np.isfinite(x[j]) else 0.0)
        for lag in range(n_lags - 1, 0, -1):
            for j in range(k):
                lagged[lag, j] = lagged[lag - 1, j]
        if n_lags:
            for j in range(k):
                lagged[0, j] = x[j]

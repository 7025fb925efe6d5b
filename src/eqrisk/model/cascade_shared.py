"""The L3 cascade's shared factor moments (`eqrisk.model.cascade`).

Of the 14 moment sums of a stock's window, 9 are of its ETFs alone (their sums and cross sums),
and so is most of the cascade made from them (`cascade_values`). On a stretch where a stock
has every level on every day, those depend only on the ETFs it is hedged with: every stock of
such a group gets them from one computation, a factor record per session, and carries only
its own 5 sums (of r, r^2, r m, r s, r u) and the arithmetic that involves r.

A stretch is one re-anchoring period (the sessions a..a+window-1, anchored at a multiple of the
window) with the window before it: the sums of its sessions are made from that data only. A
stock takes the group's record on a period where each of those sessions serves all its levels;
elsewhere (a listing, a halt, an ETF's missing day) it makes all 14 sums itself. The record is
made by the same operations, in the same order, on the same values as the stock's own sums
would be: the numbers are the same bit for bit either way (tested), only the work differs.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from eqrisk.model.cascade_sums import add_day, decay, reference_means, window_sums_one
from eqrisk.model.cascade_values import (
    REC_FIELDS,
    REC_N,
    empty_record,
    factor_part,
    stock_values,
    store_fields,
)

# A group shares its records when it has this many stocks: one stock alone would make its
# sums twice. It also bounds the records' memory: 14 values a session for at least 2 rows,
# which have 16 outputs each, so at most 7/16 of the outputs' (a few MB for a real market:
# groups are ETF combinations).
MIN_GROUP = 2


def factor_groups(fidx: np.ndarray, levels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(group of each row, -1 where it shares with no other row; the factor rows of each group,
    -1 for absent levels) for rows hedged with `levels` (k - 1) levels of `fidx`'s factors."""
    if not len(fidx):
        return np.empty(0, dtype=np.int64), np.empty((0, 3), dtype=np.int64)
    key = np.where(np.arange(3)[None, :] < levels[:, None], fidx, -1)
    key[levels == 0] = -2  # rows without a market: no group
    groups, inverse, counts = np.unique(key, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    keep = (counts >= MIN_GROUP) & (groups[:, 0] >= 0)
    number = np.cumsum(keep) - 1
    group = np.where(keep[inverse], number[inverse], -1).astype(np.int64)
    return group, np.ascontiguousarray(groups[keep], dtype=np.int64)


@njit(cache=True)
def full_span(lev, first, top, a, window, n_t):
    """Whether every session of period a's stretch (the window before a, then a's period)
    serves all `top` levels of the stock."""
    lo = max(0, a - window + 1) - first
    hi = min(a + window, n_t) - first
    for s in range(lo, hi):  # noqa: SIM110 - numba compiles no generator into all()
        if lev[s] != top:
            return False
    return True


@njit(cache=True, inline="always")
def _load_group(factors, rows, first, z):
    """The group's factor rows from `first` on into scratch z (session, variable), as a stock's
    would be loaded (a missing value is a zero; the stock's column is zero)."""
    n_t = factors.shape[1]
    k = 1
    for j in range(3):
        if rows[j] >= 0:
            k += 1
    for t in range(first, n_t):
        s = t - first
        z[s, 0] = 0.0
        for j in range(3):
            x = factors[rows[j], t] if j < k - 1 else 0.0
            z[s, j + 1] = x if np.isfinite(x) else 0.0
    return k


@njit(cache=True)
def _group_period(z, lev, first, k, window, min_obs, lam, a, n_t, rec, ref):
    """The records of sessions a..a+window-1 (rec rows from session a) and the reference means
    of the ETFs (ref) for a group: `_period_one`'s sums of a stock with every level on every
    session (`lev`) and a zero return, whose ETF-only part they are."""
    lam_w = lam**window
    lo = max(0, a - window + 1) - first
    r0, r1, r2, r3 = reference_means(z, lev, lo, a - first)
    ref[0] = r1
    ref[1] = r2
    ref[2] = r3
    s_a, n_a, acc = window_sums_one(z, lev, lo, a - first, lam, r0, r1, r2, r3)
    for t in range(a, min(a + window, n_t)):
        if t > a:
            # `_period_one`'s step; each writes it out (with the step as an inlined helper,
            # `_period_one` ran 1.8x slower).
            if lam != 1.0:
                s_a *= lam
                acc = decay(acc, lam)
            s = t - first
            s_a += 1.0
            n_a += 1
            acc = add_day(acc, 1.0, z[s, 0] - r0, z[s, 1] - r1, z[s, 2] - r2, z[s, 3] - r3)
            if t >= window:
                old = t - window - first
                s_a += -lam_w
                n_a -= 1
                acc = add_day(
                    acc, -lam_w, z[old, 0] - r0, z[old, 1] - r1, z[old, 2] - r2, z[old, 3] - r3
                )
        small = n_a < min_obs or s_a <= 0.0
        record = empty_record(n_a) if small else factor_part(acc, s_a, n_a, k)
        row = rec[t - a]
        for f in range(REC_FIELDS):
            row[f] = record[f]


@njit(parallel=True, cache=True)
def group_records(factors, groups, window, min_obs, lam, a0, first, rec, ref):
    """Every group's records of sessions a0..T-1 (rec: groups x (T - a0) x REC_FIELDS) and
    the ETFs' reference means of each period (ref: groups x periods x 3)."""
    n_t = factors.shape[1]
    for g in prange(groups.shape[0]):
        z = np.empty((n_t - first, 4))
        lev = np.full(n_t - first, 3, dtype=np.int8)  # every level, every session
        k = _load_group(factors, groups[g], first, z)
        for p in range(ref.shape[1]):
            a = a0 + p * window
            _group_period(
                z, lev, first, k, window, min_obs, lam, a, n_t, rec[g, a - a0 :], ref[g, p]
            )


@njit(cache=True, inline="always")
def _add5(m0, c00, c10, c20, c30, w, d0, d1, d2, d3):
    """The stock's own five sums plus one session weighted w (as `add_day` makes them)."""
    w0 = w * d0
    return m0 + w0, c00 + w0 * d0, c10 + (w * d1) * d0, c20 + (w * d2) * d0, c30 + (w * d3) * d0


@njit(cache=True)
def shared_period(z, first, i, k, window, lam, start, a, rec, ref, outs):
    """Stock i's cascade for sessions a..a+window-1 (stored from `start`) from its own sums and
    its group's records (rec rows from session a) and reference means: a stretch where every
    session serves all its levels."""
    n_t = outs[0].shape[1]
    lo = max(0, a - window + 1) - first
    top_s = a - first
    r0 = 0.0
    for s in range(lo, top_s + 1):
        r0 += z[s, 0]
    r0 /= top_s + 1 - lo
    r1, r2, r3 = ref[0], ref[1], ref[2]
    m0 = c00 = c10 = c20 = c30 = 0.0
    w = 1.0
    for s in range(top_s, lo - 1, -1):
        m0, c00, c10, c20, c30 = _add5(
            m0, c00, c10, c20, c30, w, z[s, 0] - r0, z[s, 1] - r1, z[s, 2] - r2, z[s, 3] - r3
        )
        w *= lam
    lam_w = lam**window
    for t in range(a, min(a + window, n_t)):
        if t > a:
            if lam != 1.0:
                m0 *= lam
                c00 *= lam
                c10 *= lam
                c20 *= lam
                c30 *= lam
            s = t - first
            m0, c00, c10, c20, c30 = _add5(
                m0, c00, c10, c20, c30, 1.0, z[s, 0] - r0, z[s, 1] - r1, z[s, 2] - r2, z[s, 3] - r3
            )
            if t >= window:
                old = t - window - first
                m0, c00, c10, c20, c30 = _add5(
                    m0, c00, c10, c20, c30, -lam_w,
                    z[old, 0] - r0, z[old, 1] - r1, z[old, 2] - r2, z[old, 3] - r3,
                )  # fmt: skip
        if t >= start:
            row = rec[t - a]
            store_fields(outs, i, t, stock_values(row, m0, c00, c10, c20, c30, k), row[REC_N])


__all__ = ["factor_groups", "full_span", "group_records", "shared_period"]

"""Positive definiteness of the factor correlation matrices, changing as little as it can.

Correlations estimated pair by pair over the days both factors exist are each within [-1, 1],
but together need not be positive semi-definite: a factor listed years after the others has
correlations from a few months next to the others' years. The repair keeps every factor's older
relations and shrinks only the newcomer's:

factors are taken oldest first (most observations; ties in index order) and the correlation
matrix is factored (Cholesky) row by row. When a row's pivot, the share of that factor's
variance not explained by the factors before it, falls below PIVOT_FLOOR, its correlations with
those factors are scaled by the one factor c that brings the pivot to the floor. The result is
the original matrix with each such pair scaled by the c of its later factor: positive definite
(its Cholesky factor has pivots >= the floor), and untouched, bit for bit, where no pivot was low.
"""

from __future__ import annotations

import numpy as np
from numba import njit

PIVOT_FLOOR = 1e-4


@njit(cache=True, nogil=True)
def _row_scales(rho, order, floor):
    """Per matrix (D, K, K) and its factor order (D, K): the scale of each factor's
    correlations with the factors before it (1 = untouched)."""
    n_days, k, _ = rho.shape
    scales = np.ones((n_days, k))
    chol = np.zeros((k, k))
    for d in range(n_days):
        chol[:, :] = 0.0
        for a in range(k):
            j = order[d, a]
            # Row a of the Cholesky factor of the ordered matrix: solve L y = rho[j, earlier].
            s = 0.0
            for b in range(a):
                acc = rho[d, j, order[d, b]]
                for c in range(b):
                    acc -= chol[a, c] * chol[b, c]
                chol[a, b] = acc / chol[b, b]
                s += chol[a, b] * chol[a, b]
            pivot = 1.0 - s
            if pivot < floor:
                c = np.sqrt((1.0 - floor) / s)
                scales[d, j] = c
                for b in range(a):
                    chol[a, b] *= c
                pivot = floor
            chol[a, a] = np.sqrt(pivot)
    return scales


def make_positive_definite(rho: np.ndarray, observations: np.ndarray) -> np.ndarray:
    """Repair, in place, correlation matrices (D, K, K) given each factor's number of
    observations (D, K); returns which matrices changed (D,)."""
    if rho.shape[0] == 0:
        return np.zeros(0, dtype=bool)
    order = np.argsort(-observations, axis=1, kind="stable").astype(np.int64)
    scales = _row_scales(np.ascontiguousarray(rho), order, PIVOT_FLOOR)
    changed: np.ndarray = (scales < 1.0).any(axis=1)
    for d in np.flatnonzero(changed).tolist():
        rank = np.empty(rho.shape[1], dtype=np.int64)
        rank[order[d]] = np.arange(rho.shape[1])
        # A pair's scale is its later factor's.
        later = np.where(rank[:, None] > rank[None, :], scales[d][:, None], scales[d][None, :])
        np.fill_diagonal(later, 1.0)
        rho[d] *= later
    return changed

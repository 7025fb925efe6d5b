"""Member returns as a group portfolio holds them (issue 22), written out here from the rule
and not from the model's code: each member's return is held within 4 robust vols of its own
(1.4826 x the median |return| over its previous 63 sessions, at least 20 returns there; else
the median of the other members' vols that day) around the members' median return that day."""

from __future__ import annotations

import numpy as np

SIGMAS, WINDOW, MIN_RETURNS = 4.0, 63, 20


def held_returns(r: np.ndarray) -> np.ndarray:
    """(members x T) returns of a group's members, held as the rule says."""
    n, n_t = r.shape
    vol = np.full((n, n_t), np.nan)
    for i in range(n):
        for t in range(1, n_t):
            past = np.abs(r[i, max(0, t - WINDOW) : t])
            past = past[np.isfinite(past)]
            if len(past) >= MIN_RETURNS:
                vol[i, t] = 1.4826 * np.median(past)
    out = r.copy()
    for t in range(n_t):
        have = np.isfinite(r[:, t])
        if not have.any():
            continue
        centre = np.median(r[have, t])
        known = np.isfinite(vol[:, t])
        if not known.any():
            continue  # no vol known at all: returns stay as they are
        v = np.where(known, vol[:, t], np.median(vol[known, t]))
        out[have, t] = np.clip(r[have, t], centre - SIGMAS * v[have], centre + SIGMAS * v[have])
    return out

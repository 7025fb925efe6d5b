"""The L* rule: which hedge level (L1, L2, L3) a symbol should be hedged at on a session
(docs/decisions/drop-in-routes.md, "L*").

The rule reads the stored out-of-sample hedge quality `lk_hq` (the variance of `lk_rr`, the
residual left by the previous session's hedge applied to this session's ETF returns, over the
variance of the return, on the trailing window). Without a threshold: the level that left the
least residual variance, the simpler level on a tie (a level not yet published repeats the one
above it, so it ties and is never chosen). With a threshold: start at L1 and go one level deeper
only while the deeper level lowers the residual share by at least `threshold` (the explained
share it adds, out of sample).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

LEVELS = ("L1", "L2", "L3")
HQ_FIELDS = ("l1_hq", "l2_hq", "l3_hq")
RR_FIELDS = ("l1_rr", "l2_rr", "l3_rr")


def lstar_levels(hq: np.ndarray, threshold: float | None = None) -> np.ndarray:
    """Per column of `hq` (3, n): the chosen level 1, 2 or 3, or 0 where L1's quality is
    unknown (NaN)."""
    ok = np.isfinite(hq[0])
    if threshold is None:
        filled = np.where(np.isfinite(hq), hq, np.inf)
        level = np.argmin(filled, axis=0) + 1  # argmin keeps the first (simplest) of equals
        return np.where(ok, level, 0).astype(np.int64)
    out = np.where(ok, 1, 0).astype(np.int64)
    best = hq[0].copy()
    for k in (1, 2):
        deeper = hq[k]
        step = (out == k) & np.isfinite(deeper) & (best - deeper >= threshold)
        out[step] = k + 1
        best = np.where(step, deeper, best)
    return out


def pick(values: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Per column, the row of `values` (3, n) at the chosen level (NaN where none)."""
    out = np.full(values.shape[1], np.nan)
    chosen = levels > 0
    cols = np.flatnonzero(chosen)
    out[chosen] = values[levels[chosen] - 1, cols]
    return out


def level_names(levels: np.ndarray) -> list[str | None]:
    return [LEVELS[k - 1] if k > 0 else None for k in levels.tolist()]


# Per level: the hedge ratio fields of (market, sector, subsector) and its residual share.
_LEVEL_FIELDS = (
    ("l1_mkt_hr", None, None, "l1_res_er", "l1_rr"),
    ("l2_mkt_hr", "l2_sec_hr", None, "l2_res_er", "l2_rr"),
    ("l3_mkt_hr", "l3_sec_hr", "l3_sub_hr", "l3_res_er", "l3_rr"),
)


def lstar_columns(
    column: Callable[[str], np.ndarray], threshold: float | None
) -> dict[str, np.ndarray]:
    """The vendor's /lstar arrays from a symbol's daily columns (`column(field)`): per session
    the L* level, that level's hedge ratios, its explained share (`total_er` = 1 - residual
    share) and residual return, and the L2 sector / L3 subsector shares."""
    hq = np.vstack([column(f) for f in HQ_FIELDS])
    levels = lstar_levels(hq, threshold)
    n = hq.shape[1]
    nan = np.full(n, np.nan)

    def at_level(k: int) -> np.ndarray:
        rows = [nan if (name := f[k]) is None else column(name) for f in _LEVEL_FIELDS]
        return np.vstack(rows)

    res_er = at_level(3)
    return {
        "lstar": np.array(level_names(levels), dtype=object),
        "market_hr": pick(at_level(0), levels),
        "sector_hr": pick(at_level(1), levels),
        "subsector_hr": pick(at_level(2), levels),
        "total_er": 1.0 - pick(res_er, levels),
        "residual_return": pick(at_level(4), levels),
        "l2_sector_er": column("l2_sec_er"),
        "l3_subsector_er": column("l3_sub_er"),
    }

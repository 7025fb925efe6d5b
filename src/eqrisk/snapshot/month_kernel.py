"""The month-end view of a level (`tables.monthly_views`) as a numba kernel: per series (a
symbol's key) and month, the last finite value within the month's sessions, found by reading
back from the month's last session (most months stop at their first read), NaN where the month
has none. It picks values, so its answer is numpy's to the bit."""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def month_last(level, starts, ends, out):
    """out[i, m] (rows x M): the last finite level[i, t] for t in month m's sessions
    starts[m] .. ends[m], NaN where none is."""
    for i in range(level.shape[0]):
        series = level[i]
        for m in range(starts.shape[0]):
            value = np.nan
            for t in range(ends[m], starts[m] - 1, -1):
                if np.isfinite(series[t]):
                    value = series[t]
                    break
            out[i, m] = value

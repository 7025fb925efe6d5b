"""The style descriptors' window sums (`styles.window_sums`, a numba kernel) are numpy's
`(window * weights).sum(axis=-1)` bit for bit: the same pairwise order, so a risk model built
with the kernel equals one built with numpy, and every window depends on its own values only."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from eqrisk.model.styles import ewma_weights, window_sums


def numpy_window_sums(
    x: np.ndarray, weights: np.ndarray, lag: int, lo: int, hi: int
) -> tuple[np.ndarray, np.ndarray]:
    """The reference: each column's window of the padded series, multiplied and summed by
    numpy, missing values as 0, the count of those present."""
    n, n_t = x.shape
    size = len(weights)
    pad = size + lag
    padded = np.full((n, n_t + pad), np.nan)
    padded[:, pad:] = x
    present = np.isfinite(padded)
    values = np.where(present, padded, 0.0)
    sums = np.full((n, n_t), np.nan)
    count = np.zeros((n, n_t))
    win = sliding_window_view(values[:, lo + 1 : hi + size], size, axis=1)
    seen = sliding_window_view(present[:, lo + 1 : hi + size], size, axis=1)
    sums[:, lo:hi] = (win * weights).sum(axis=-1)
    count[:, lo:hi] = seen.sum(axis=-1)
    return sums, count


@pytest.mark.parametrize(
    ("size", "halflife", "lag", "lo", "hi"),
    [
        (504, 126.0, 21, 600, 728),  # momentum over one chunk of 128 sessions
        (252, 63.0, 0, 0, 700),  # beta, every column (the early ones partly padded)
        (21, 5.0, 0, 10, 300),  # reversal
        (63, 1e12, 0, 0, 700),  # liquidity's flat weights
        (7, 3.0, 0, 0, 50),  # shorter than the eight lanes
        (130, 40.0, 3, 100, 400),  # just over one pairwise block
    ],
)
def test_the_kernel_sums_as_numpy_does(
    size: int, halflife: float, lag: int, lo: int, hi: int
) -> None:
    rng = np.random.default_rng(size)
    x = rng.normal(0.0, 0.02, (37, 730))
    x[rng.random(x.shape) < 0.15] = np.nan
    x[:, :40] = np.nan  # listed late
    x[3, 200] = np.inf  # not finite: left out, as NaN is
    x[4, 300:] = -0.0
    weights = ewma_weights(halflife, size)
    got_sums, got_count = window_sums(x, weights, lag, columns=slice(lo, hi))
    want_sums, want_count = numpy_window_sums(x, weights, lag, lo, hi)
    assert got_sums.tobytes() == want_sums.tobytes()
    assert got_count.tobytes() == want_count.tobytes()
    assert np.isfinite(got_sums[:, lo:hi]).all() and np.isnan(got_sums[:, hi:]).all()
    assert got_count[:, lo:hi].max() <= size and (got_count[:, hi:] == 0).all()

"""The style descriptors' window sums (`styles.window_sums`, a numba kernel of block sums) equal
numpy's `(window * weights).sum(axis=-1)` to rounding, and every window's sum depends on its
own values only: the same bits wherever the array starts and whichever sessions are computed
with it (what lets a resumed risk model equal a full run)."""

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
        (63, np.inf, 0, 0, 700),  # liquidity's flat weights
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
    got_sums, got_count = window_sums(x, halflife, size, lag, columns=slice(lo, hi))
    want_sums, want_count = numpy_window_sums(x, weights, lag, lo, hi)
    # Rounding: a few units in the last place of the sum of the terms' sizes (2 at most seen).
    scale, _ = numpy_window_sums(np.abs(x), weights, lag, lo, hi)
    assert (
        np.abs(got_sums - want_sums)[:, lo:hi] <= 4 * np.finfo(float).eps * scale[:, lo:hi]
    ).all()
    assert got_count.tobytes() == want_count.tobytes()
    assert np.isfinite(got_sums[:, lo:hi]).all() and np.isnan(got_sums[:, hi:]).all()
    assert got_count[:, lo:hi].max() <= size and (got_count[:, hi:] == 0).all()


@pytest.mark.parametrize(
    ("size", "halflife", "lag"), [(504, 126.0, 21), (252, 63.0, 0), (21, 5.0, 0)]
)
def test_a_window_depends_on_its_own_values_only(size: int, halflife: float, lag: int) -> None:
    """The same sessions in an array that starts 300 sessions earlier, computed one column at
    a time, in one block and in two blocks: the same bits."""
    rng = np.random.default_rng(7)
    x = rng.normal(0.0, 0.02, (5, 1400))
    x[rng.random(x.shape) < 0.1] = np.nan
    whole, whole_count = window_sums(x, halflife, size, lag, columns=slice(900, 1400))
    late = x[:, 300:]
    for parts in ([(600, 1100)], [(600, 613), (613, 1100)], [(t, t + 1) for t in range(600, 640)]):
        for a, b in parts:
            got, count = window_sums(late, halflife, size, lag, columns=slice(a, b))
            assert got[:, a:b].tobytes() == whole[:, a + 300 : b + 300].tobytes()
            assert count[:, a:b].tobytes() == whole_count[:, a + 300 : b + 300].tobytes()

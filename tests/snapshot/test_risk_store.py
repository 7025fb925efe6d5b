"""The stored risk fields read like the snapshot's other arrays: `RiskArray` over per-chunk
files gives the dense array's values for every kind of index the routes use; a version without
the risk model reads as NaN of the right shape."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from eqrisk.snapshot.chunks import ChunkGrid
from eqrisk.snapshot.risk_arrays import MissingArray, RiskArray
from eqrisk.snapshot.risk_arrays import risk_rel as _rel


@pytest.fixture()
def stored(tmp_path: Path) -> tuple[RiskArray, np.ndarray]:
    (tmp_path / "risk").mkdir()
    grid = ChunkGrid(7, 300)
    full = np.random.default_rng(0).normal(size=(7, 300))
    full[2, 100:140] = np.nan
    for c in range(grid.chunks):
        lo, hi = grid.cols(c)
        np.save(tmp_path / _rel("total", c), full[:, lo:hi])
    return RiskArray(tmp_path, "total", grid), full


@pytest.mark.parametrize(
    "cols",
    [[3, 130, 5, 299, 128], list(range(100, 260)), [7], [], [-1, 0]],
)
def test_index_arrays_of_sessions(stored: tuple[RiskArray, np.ndarray], cols: list[int]) -> None:
    a, full = stored
    idx = np.asarray(cols, dtype=np.int64)
    np.testing.assert_array_equal(a[2, idx], full[2, idx])
    np.testing.assert_array_equal(a[:, idx], full[:, idx])


def test_slices_scalars_and_the_whole(stored: tuple[RiskArray, np.ndarray]) -> None:
    a, full = stored
    np.testing.assert_array_equal(a[1, 10:290], full[1, 10:290])
    np.testing.assert_array_equal(a[np.array([0, 3]), 5:200], full[[0, 3], 5:200])
    np.testing.assert_array_equal(a[:, 131], full[:, 131])
    assert a[4, 299] == full[4, 299]
    np.testing.assert_array_equal(np.asarray(a), full)
    missing = MissingArray((7, 300))
    assert np.isnan(missing[3, 4]) and missing[:, 2:9].shape == (7, 7)
    assert np.asarray(missing).shape == (7, 300)

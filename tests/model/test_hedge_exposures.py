"""The first layer's exposures read the hedge ratios from the session before the first
forecast one only: a run may hand them in from there (the build holds a chunk's, not its
history's), with the same exposures, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from eqrisk.model.risk_model import hedge_exposures
from eqrisk.snapshot.chunks import same_bits
from eqrisk.snapshot.risk_arrays import HEDGE_FIELDS


def _ratios(n: int, n_t: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name in HEDGE_FIELDS:
        x = rng.normal(1.0, 0.3, (n, n_t))
        x[rng.random((n, n_t)) < 0.1] = np.nan  # missing betas: a lower level is used
        out[name] = x
    return out


@pytest.mark.parametrize("level", [1, 2, 3])
@pytest.mark.parametrize("start", [0, 1, 7, 39])
def test_the_hedge_ratios_from_the_session_before_give_the_same_exposures(
    level: int, start: int
) -> None:
    n, n_t = 30, 40
    ratios = _ratios(n, n_t, start + 10 * level)
    rng = np.random.default_rng(level)
    fidx = np.column_stack([np.zeros(n), rng.integers(1, 4, n), rng.integers(4, 9, n)])
    fidx[rng.random((n, 3)) < 0.2] = -1
    fidx[:, 0] = np.where(rng.random(n) < 0.1, -1, 0)
    own = np.full(n, -1)
    own[2] = 5  # a factor's own row
    want = hedge_exposures(ratios, fidx.astype(np.int64), own, level, start)
    first = max(start, 1) - 1
    for skip in range(first + 1):
        part = {k: np.ascontiguousarray(v[:, skip:]) for k, v in ratios.items()}
        got = hedge_exposures(part, fidx.astype(np.int64), own, level, start, n_t)
        assert same_bits(got.index, want.index)
        assert same_bits(got.values, want.values)
        assert same_bits(got.level, want.level)
    assert np.isfinite(want.values).any()
    late = {k: v[:, first + 1 :] for k, v in ratios.items()}
    with pytest.raises(ValueError, match="hedge ratios hold"):
        hedge_exposures(late, fidx.astype(np.int64), own, level, start, n_t)

"""The cap rank kernel (`model.rank_kernel`, behind `run.cap_rank`) against numpy's stable
argsort of each session's caps: equal on real price paths, on caps that tie, vanish, turn
ineligible, reshuffle from one session to the next, and caps of every sign and size."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from eqrisk.data.panel import Panel
from eqrisk.model.run import cap_rank
from helpers import nan_equal


def _numpy_rank(market_cap: np.ndarray, eligible: np.ndarray) -> np.ndarray:
    """Per session, a stable argsort of -cap over every row (no cap: -inf, sorted last)."""
    caps = np.where(eligible[:, None] & np.isfinite(market_cap), market_cap, -np.inf)
    order = np.argsort(-caps, axis=0, kind="stable")
    ranks = np.empty_like(caps)
    np.put_along_axis(ranks, order, np.arange(1, caps.shape[0] + 1, dtype=float)[:, None], axis=0)
    return np.where(np.isfinite(caps), ranks, np.nan)


def _walk(rng: np.random.Generator, n: int, t: int) -> np.ndarray:
    return np.exp(rng.normal(22.0, 1.5, (n, 1)) + rng.normal(0, 0.02, (n, t)).cumsum(axis=1))


def test_ranks_equal_a_stable_argsort_on_real_price_paths(
    real_universe: tuple[Panel, pd.DataFrame],
) -> None:
    panel, _ = real_universe
    rng = np.random.default_rng(3)
    caps = panel.close * rng.lognormal(18.0, 1.0, (panel.shape[0], 1))  # fixed share counts
    eligible = rng.random(panel.shape[0]) < 0.9
    got = cap_rank(caps, eligible)
    assert nan_equal(got, _numpy_rank(caps, eligible))
    assert np.nanmax(got) == (eligible[:, None] & np.isfinite(caps)).sum(axis=0).max()


def test_ranks_equal_a_stable_argsort_where_caps_tie_vanish_and_reshuffle() -> None:
    rng = np.random.default_rng(11)
    n, t = 400, 300
    caps = _walk(rng, n, t)
    caps[:40] = caps[40:80]  # equal caps: row order decides
    caps[80:90, 100:] = 5e9  # a block of equal caps from a session on
    caps[90:95, 50] = 0.0
    caps[95:100, 50] = -0.0  # equal to 0.0
    caps[rng.random((n, t)) < 0.05] = np.nan  # gaps: rows leave and come back
    caps[100:110, :150] = np.nan  # rows that list late
    caps[110:115, 200] = np.inf  # not finite: no rank
    caps[:, 120] = np.nan  # a session with no cap at all
    caps[:, 160] = rng.permutation(caps[:, 159])  # reshuffled
    caps[:, 161] = caps[::-1, 160]
    eligible = rng.random(n) < 0.9
    got = cap_rank(caps, eligible)
    assert nan_equal(got, _numpy_rank(caps, eligible))
    assert np.isnan(got[:, 120]).all()
    assert np.isnan(got[110:115, 200]).all()
    ranked = np.sort(got[:, 161][np.isfinite(got[:, 161])])
    assert np.array_equal(ranked, np.arange(1.0, len(ranked) + 1))


@pytest.mark.parametrize(("n", "t"), [(0, 5), (1, 4), (3, 0), (2, 1)])
def test_ranks_of_tiny_universes(n: int, t: int) -> None:
    caps = np.arange(n * t, dtype=float).reshape(n, t)
    eligible = np.ones(n, dtype=bool)
    assert nan_equal(cap_rank(caps, eligible), _numpy_rank(caps, eligible))


def test_ranks_of_caps_across_every_byte_of_their_keys() -> None:
    """Caps of every sign and magnitude (each byte of the radix keys varies), ties among
    them, subnormals and both zeros: the order numpy's comparison sort gives."""
    rng = np.random.default_rng(5)
    n, t = 300, 40
    caps = rng.choice([-1.0, 1.0], (n, t)) * 10.0 ** rng.uniform(-300, 300, (n, t))
    caps[:30] = caps[30:60]
    caps[60:70] = 5e-324  # the smallest subnormal
    caps[70:75] = -0.0
    caps[75:80] = 0.0
    caps[80:85, ::2] = -np.inf
    caps[85:90, 1::2] = np.nan
    eligible = rng.random(n) < 0.95
    got = cap_rank(caps, eligible)
    assert nan_equal(got, _numpy_rank(caps, eligible))
    assert len(np.unique(got[np.isfinite(got[:, 0]), 0])) == np.isfinite(got[:, 0]).sum()

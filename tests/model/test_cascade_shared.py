"""The cascade's shared factor moments (`model/cascade_shared.py`): rows hedged with the same
factor rows take the ETF-only sums and arithmetic from one record per session where they have
every level on a period's whole stretch, and the numbers are those of each row on its own, bit
for bit, on a panel that reaches every branch and on the real market."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from eqrisk.data.panel import Panel
from eqrisk.model.cascade import CASCADE_FIELDS, rolling_cascade
from eqrisk.model.cascade_shared import MIN_GROUP, factor_groups
from eqrisk.model.run import ModelParams, plan_model

WINDOW, MIN_OBS = 60, 30
Inputs = tuple[np.ndarray, np.ndarray, np.ndarray]


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float64).view(np.uint64)


def levels_of(fidx: np.ndarray) -> np.ndarray:
    return np.cumprod(fidx >= 0, axis=1).sum(axis=1)


def shared_stretches(inputs: Inputs, window: int) -> np.ndarray:
    """(rows x periods) whether a row takes its group's records on a period: in a group, and
    a return and every one of its levels' factor returns on each session of the period and
    the window before it (an independent statement of `full_span`)."""
    returns, factors, fidx = inputs
    group, _ = factor_groups(fidx, levels_of(fidx))
    full = np.isfinite(returns).copy()
    for j in range(3):
        has = np.arange(len(fidx))[levels_of(fidx) > j]
        full[has] &= np.isfinite(factors[fidx[has, j]])
    n_t = returns.shape[1]
    starts = range(0, n_t, window)
    out = np.zeros((len(fidx), len(starts)), dtype=bool)
    for p, a in enumerate(starts):
        out[:, p] = full[:, max(0, a - window + 1) : min(a + window, n_t)].all(axis=1)
    return out & (group >= 0)[:, None]


def assert_same_bits(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    for name in CASCADE_FIELDS:
        assert np.array_equal(bits(a[name]), bits(b[name])), name


def test_rows_on_the_same_factor_rows_form_a_group() -> None:
    fidx = np.array(
        [
            [0, 1, 5],  # group A
            [0, 1, 5],  # group A
            [0, 1, -1],  # group B (market and sector)
            [0, 1, -1],  # group B
            [0, -1, 5],  # market only: a subsector needs a sector -> group C
            [0, -1, -1],  # group C
            [0, 2, 6],  # alone
            [-1, -1, -1],  # no market: no group
            [-1, -1, -1],
        ]
    )
    group, rows = factor_groups(fidx, levels_of(fidx))
    assert MIN_GROUP == 2
    assert group[0] == group[1] >= 0 and group[2] == group[3] >= 0 and group[4] == group[5] >= 0
    assert len({group[0], group[2], group[4]}) == 3
    assert (group[6:] == -1).all()
    assert rows[group[0]].tolist() == [0, 1, 5]
    assert rows[group[2]].tolist() == [0, 1, -1]
    assert rows[group[4]].tolist() == [0, -1, -1]
    empty, none = factor_groups(np.empty((0, 3), dtype=np.int64), np.empty(0, dtype=np.int64))
    assert empty.shape == (0,) and none.shape == (0, 3)


@pytest.mark.parametrize("halflife", [None, 20.0])
@pytest.mark.parametrize("start", [0, 130, 250])
def test_shared_moments_equal_each_row_on_its_own_bitwise(
    cascade_panel: Inputs, halflife: float | None, start: int
) -> None:
    returns, factors, fidx = cascade_panel
    kwargs = {"window": WINDOW, "min_obs": MIN_OBS, "halflife": halflife}
    alone = rolling_cascade(returns, factors, fidx, **kwargs, share=False)
    if start:
        out = {name: np.where(np.arange(returns.shape[1]) < start, a, -7.0)
               for name, a in alone.items()}  # fmt: skip
        shared = rolling_cascade(returns, factors, fidx, **kwargs, out=out, start=start)
    else:
        shared = rolling_cascade(returns, factors, fidx, **kwargs)
    assert_same_bits(shared, alone)
    # The shared path runs for every kind of group, next to rows on their own sums.
    taken = shared_stretches(cascade_panel, WINDOW)
    levels = levels_of(fidx)
    assert taken[1:4].any() and taken[4:8][levels[4:8] == 2].any()  # market only, L2
    assert taken[8:10].all()  # the collinear subsector: L3 null, L2 published
    assert (
        np.isnan(shared["l3_sub_hr"][8:10]).all() and np.isfinite(shared["l2_sec_hr"][8:10]).any()
    )
    assert taken[levels == 3].any() and not taken[levels == 3].all()
    # Own sums: a listing (session 90), a halt (200-214), sparse gaps.
    assert not taken[10:13, :2].any() and taken[10:13, 2:].any()
    assert not taken[13:16, 3:5].any() and taken[13:16, 5:].any()
    assert not taken[16].any()


@pytest.fixture(scope="module")
def real_inputs(real_universe: tuple[Panel, pd.DataFrame]) -> Inputs:
    plan = plan_model(*real_universe, ModelParams())
    return plan.returns, plan.in_process().factors, plan.layout.model_fidx


@pytest.mark.parametrize("halflife", [None, 90.0])
def test_on_the_real_market_the_shared_moments_change_no_bit(
    real_inputs: Inputs, halflife: float | None
) -> None:
    returns, factors, fidx = real_inputs
    kwargs = {"window": 252, "min_obs": 126, "halflife": halflife}
    shared = rolling_cascade(returns, factors, fidx, **kwargs)
    alone = rolling_cascade(returns, factors, fidx, **kwargs, share=False)
    assert_same_bits(shared, alone)
    taken = shared_stretches(real_inputs, 252)
    # Most stock-periods of 574 symbols over 2010-2026 take the shared path (84% here).
    assert taken.mean() > 0.75
    assert np.isfinite(shared["l3_sub_hr"]).mean() > 0.3  # 33%: many have no subsector ETF


def test_a_gap_on_either_edge_of_a_stretch_keeps_the_row_on_its_own_sums(
    cascade_panel: Inputs,
) -> None:
    """One missing return on the last session of period 60's stretch (119) and one on the
    first of period 180's (121): those periods run on the row's own sums (their windows hold
    one observation fewer than the group's), the neighbours on the group's records."""
    returns, factors, fidx = (a.copy() for a in cascade_panel)
    rows = np.flatnonzero(
        (levels_of(fidx) == 3) & shared_stretches(cascade_panel, WINDOW)[:, 1:4].all(axis=1)
    )
    assert len(rows) >= 2
    returns[rows[0], 119] = np.nan
    returns[rows[1], 121] = np.nan
    taken = shared_stretches((returns, factors, fidx), WINDOW)
    assert not taken[rows[0], 1:3].any() and taken[rows[0], 3]
    assert taken[rows[1], 1] and not taken[rows[1], 2:4].any()
    kwargs = {"window": WINDOW, "min_obs": MIN_OBS}
    shared = rolling_cascade(returns, factors, fidx, **kwargs)
    assert_same_bits(shared, rolling_cascade(returns, factors, fidx, **kwargs, share=False))
    assert (
        shared["n_obs"][rows[0], 119] == WINDOW - 1 and shared["n_obs"][rows[1], 180] == WINDOW - 1
    )

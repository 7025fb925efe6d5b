"""The model owns its time axis: a run from any session (`model.resume.run_from`), on the whole
plan or on a plan that begins `warmup` sessions before it (its own state: the inputs since the
re-anchoring point), gives the full run's values from that session on, bit for bit."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from eqrisk.bench.incremental import synthetic_market
from eqrisk.data.panel import PANEL_FIELDS, Panel
from eqrisk.model.resume import anchors, run_from, warmup
from eqrisk.model.run import ModelParams, plan_model, run_model

PARAMS = ModelParams(window=40, min_obs=20)
N, T = 40, 420


@pytest.fixture(scope="module")
def market() -> tuple[Panel, pd.DataFrame, dict[str, np.ndarray]]:
    """A synthetic market and its full run's metrics."""
    panel, master = synthetic_market(N, T, seed=11)
    return panel, master, run_model(panel, master, PARAMS).metrics


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a, np.float64), np.ascontiguousarray(b, np.float64)
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def _from(panel: Panel, base: int) -> Panel:
    """The panel's sessions from `base` on (a data set read from there)."""
    arrays: dict[str, Any] = {
        name: np.ascontiguousarray(getattr(panel, name)[:, base:]) for name in PANEL_FIELDS
    }
    return Panel(symbols=panel.symbols, sessions=panel.sessions[base:], **arrays)


@pytest.mark.parametrize("start", [0, 1, 39, 80, 81, 200, 333, T - 1])
def test_a_run_from_any_session_equals_the_full_run_bitwise(
    market: tuple[Panel, pd.DataFrame, dict[str, np.ndarray]], start: int
) -> None:
    panel, master, full = market
    got = run_from(plan_model(panel, master, PARAMS), start, rows=16)
    assert set(got) == set(full)  # every metric
    for name, values in full.items():
        assert got[name].shape == (N, T - start), name
        assert _same_bits(got[name], values[:, start:]), name
    assert np.isfinite(got["l3_mkt_hr"][N // 2 :]).any()  # the values are not all missing


@pytest.mark.parametrize("start", [280, 301, T - 1])
def test_a_run_from_its_own_state_equals_the_full_run_bitwise(
    market: tuple[Panel, pd.DataFrame, dict[str, np.ndarray]], start: int
) -> None:
    """The plan holds only the sessions from `base` on (the warm-up, rounded down to an
    anchor): what a daily build hands the model."""
    panel, master, full = market
    base = (start - warmup(PARAMS.window)) // PARAMS.window * PARAMS.window
    assert 0 < base <= anchors(start, PARAMS.window)[0]
    got = run_from(plan_model(_from(panel, base), master, PARAMS), start, base=base)
    for name, values in full.items():
        assert _same_bits(got[name], values[:, start:]), name


def test_a_plan_that_begins_too_late_is_refused(
    market: tuple[Panel, pd.DataFrame, dict[str, np.ndarray]],
) -> None:
    panel, master, _ = market
    late = 2 * PARAMS.window
    plan = plan_model(_from(panel, late), master, PARAMS)
    with pytest.raises(ValueError, match="cannot run"):
        run_from(plan, late + 10, base=late)
    with pytest.raises(ValueError, match="cannot run"):
        run_from(plan, late + 3 * PARAMS.window, base=late + 1)


def test_the_anchors_are_multiples_of_the_window_two_windows_back() -> None:
    w = PARAMS.window
    for start in range(0, 6 * w):
        long_from, short_from = anchors(start, w)
        assert long_from % w == 0 and short_from % 23 == 0
        assert long_from <= max(0, start - 2 * w) and short_from <= max(0, start - 23)
        assert start < 2 * w or long_from > start - 3 * w
    assert warmup(w) >= 3 * w

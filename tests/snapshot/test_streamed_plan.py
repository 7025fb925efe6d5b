"""A plan streamed one slice of sessions at a time (`block_inputs.stream_plan`): every task's
rows equal those of the plan held whole, and planning holds memory of a slice, not of the
universe's history."""

from __future__ import annotations

import tracemalloc
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from eqrisk.bench.incremental import synthetic_market
from eqrisk.build.block_inputs import InMemory, StreamedPlan, stream_plan
from eqrisk.build.incremental import input_digests
from eqrisk.data.panel import MODEL_FIELDS, Panel
from eqrisk.model.plan_slices import plan_shape
from eqrisk.model.run import ModelParams, plan_model

PARAMS = ModelParams(window=126, min_obs=60)
BLOCK = 32


def _market(n: int, t: int) -> tuple[Panel, pd.DataFrame]:
    """A synthetic market whose technology and energy sectors have no ETF (cap-weighted groups
    with leave-one-out rows) and whose stocks have caps, a tenth of them none."""
    panel, master = synthetic_market(n, t, seed=3)
    keep = ~np.isin(panel.symbols, ["XLK", "XLE"])
    arrays = {
        k: v[keep] for k, v in panel.__dict__.items() if isinstance(v, np.ndarray) and v.ndim == 2
    }
    shares = np.random.default_rng(1).uniform(1e7, 1e9, keep.sum())
    shares[::10] = np.nan
    arrays["market_cap"] = shares[:, None] * arrays["close"]
    sub = replace(panel, symbols=panel.symbols[keep], **arrays)
    return sub, master[master["symbol"].isin(set(sub.symbols))]


def _stream(panel: Panel, master: pd.DataFrame, folder: Path, breaks: set) -> StreamedPlan:
    shape = plan_shape(panel.symbols, panel.sessions, master, PARAMS)

    def read(t0: int, t1: int) -> tuple[np.ndarray, np.ndarray]:
        return panel.close[:, t0:t1], panel.market_cap[:, t0:t1]

    return stream_plan(shape, read, folder, master, block_symbols=BLOCK, breaks=breaks)


def test_every_tasks_rows_equal_the_whole_plans(tmp_path: Path) -> None:
    panel, master = _market(150, 700)
    breaks = {(20, 300), (21, 511), (21, 512), (140, 699)}  # across slices of 512
    exclude = np.zeros(panel.shape, dtype=bool)
    for i, j in breaks:
        exclude[i, j] = True
    plan = plan_model(panel, master, PARAMS, exclude=exclude)
    assert plan.layout.leave_one_out_rows > 20
    assert plan.layout.caps_imputed  # the stocks without a cap, weighted by the rule
    streamed = _stream(panel, master, tmp_path, breaks)
    whole = InMemory(plan)
    assert streamed.shape == whole.shape
    assert streamed.plan.layout.caps_imputed == plan.layout.caps_imputed
    assert streamed.plan.returns_excluded == 4 == plan.returns_excluded
    np.testing.assert_array_equal(streamed.shared.factors, plan.shared.factors)
    np.testing.assert_array_equal(streamed.shared.flat_returns, plan.shared.flat_returns)
    for start, stop in ((0, 32), (32, 96), (128, 148), (0, 148)):
        got, want = streamed.block(start, stop), whole.block(start, stop)
        np.testing.assert_array_equal(got.returns, want.returns)
        np.testing.assert_array_equal(got.exposure, want.exposure)
        # Each row's factor rows (published or its own leave-one-out rows) are the same
        # series, whatever their numbering in the task.
        rows_got = np.vstack([streamed.shared.factors, got.own_factors])
        rows_want = np.vstack([whole.shared.factors, want.own_factors])
        assert ((got.model_fidx >= 0) == (want.model_fidx >= 0)).all()
        has = got.model_fidx >= 0
        np.testing.assert_array_equal(
            rows_got[got.model_fidx[has]], rows_want[want.model_fidx[has]]
        )
        np.testing.assert_array_equal(streamed.rank(start, stop), whole.rank(start, stop))
        for name, values in streamed.prices(start, stop).items():
            np.testing.assert_array_equal(values, whole.prices(start, stop)[name])
    with pytest.raises(ValueError, match="not whole blocks of 32"):
        streamed.block(10, 40)
    # The input digests equal a whole plan's (the next build compares them chunk by chunk).
    # (The other price fields' digests are fed as the tasks read them: `RowDigests`.)
    lean = replace(panel, read=MODEL_FIELDS)
    want_digests = input_digests(plan, lean, master, exclude)
    assert streamed.inputs == want_digests


def _planning_peak(t: int, folder: Path) -> int:
    panel, master = _market(600, t)
    tracemalloc.start()
    try:
        _stream(panel, master, folder, set())
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak


def test_planning_holds_a_slice_not_the_history(tmp_path: Path) -> None:
    """Twice the history: the same peak (slices of 512 sessions), under one field's size
    (measured: 19.7 and 20.0 MB; the whole plan holds several fields of 28.8 MB)."""
    _planning_peak(700, tmp_path / "warm")  # first-call allocations (caches) out of the way
    short = _planning_peak(3000, tmp_path / "short")
    long = _planning_peak(6000, tmp_path / "long")
    one_field = 600 * 6000 * 8
    assert long < 1.15 * short, (short, long)
    assert long < one_field, (long, one_field)


def test_the_next_slice_is_read_while_this_one_is_planned() -> None:
    """`_read_ahead`: the slices in order, the next one's read started before this one is
    handed over, at most one read ahead; a read's error is raised at its turn."""
    import threading

    from eqrisk.build.block_inputs import _read_ahead

    started: list[tuple[int, int]] = []
    spans = [(0, 10), (5, 20), (15, 30)]
    second = threading.Event()

    def read(t0: int, t1: int) -> tuple[np.ndarray, np.ndarray]:
        assert threading.current_thread().name.startswith("eqrisk-plan-read")
        started.append((t0, t1))
        if t0 == 5:
            second.set()
        if t0 == 15:
            raise OSError("the third slice's file is gone")
        return np.full(1, float(t0)), np.full(1, float(t1))

    slices = _read_ahead(read, spans)
    close, cap = next(slices)
    assert (close[0], cap[0]) == (0.0, 10.0)
    # The generator waits at its `yield`: a read that starts now was asked for before it.
    assert second.wait(10)
    assert started == spans[:2]  # and no further
    close, cap = next(slices)
    assert (close[0], cap[0]) == (5.0, 20.0)
    with pytest.raises(OSError, match="the third slice's file is gone"):
        next(slices)
    assert list(_read_ahead(read, [])) == []

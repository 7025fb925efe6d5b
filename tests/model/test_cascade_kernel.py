"""The cascade kernel: every level on its own joint sample (issue 22), equal to the reference
built from the kernel as it was before (cascade_reference.py) to 1e-12, and bit for bit where
the levels' samples are the same; and its mechanics (issues 9 and 10): outputs written in place
(`out=`, e.g. memory-mapped files, or a block buffer reused across symbol blocks) and partial
runs from a session (`start=`) give exactly the numbers of a full run, NaN positions included."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from eqrisk.model.cascade import CASCADE_FIELDS, rolling_cascade, rolling_std
from model.cascade_reference import joint_reference_cascade, reference_cascade, reference_std

WINDOW, MIN_OBS = 60, 30
HALFLIFE = 20.0
LAM = 0.5 ** (1.0 / HALFLIFE)


def bits(a: np.ndarray) -> np.ndarray:
    """The float64 bit patterns: equal bits is the strictest equality (signed zeros, NaN)."""
    return np.ascontiguousarray(a, dtype=np.float64).view(np.uint64)


@pytest.fixture(scope="module")
def panel(cascade_panel: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, ...]:
    return cascade_panel


def expected(panel: tuple[np.ndarray, np.ndarray, np.ndarray], lam: float) -> np.ndarray:
    returns, factors, fidx = panel
    return reference_cascade(returns, factors, fidx, window=WINDOW, min_obs=MIN_OBS, lam=lam)


def _lam(halflife: float | None) -> float:
    return 1.0 if halflife is None else LAM


@pytest.mark.parametrize("halflife", [None, HALFLIFE])
def test_each_level_equals_its_own_joint_sample_reference(panel, halflife) -> None:
    returns, factors, fidx = panel
    got = rolling_cascade(returns, factors, fidx, window=WINDOW, min_obs=MIN_OBS, halflife=halflife)
    want = expected(panel, _lam(halflife))
    for f, name in enumerate(CASCADE_FIELDS):
        assert np.array_equal(np.isnan(got[name]), np.isnan(want[f])), name
        np.testing.assert_allclose(got[name], want[f], rtol=0, atol=1e-12, err_msg=name)
    # The panel reaches every branch: unpublished rows, each level's publication, collinearity.
    assert np.isnan(got["n_obs"][0]).all()
    assert np.isfinite(got["l3_sub_hr"][20:]).any() and np.isnan(got["l3_sub_hr"][8:10]).all()
    assert np.isfinite(got["l2_sec_hr"][8:10]).any()
    # A stock on the late sector ETF has its market level from its own min_obs-th session
    # with the market, its sector level from its min_obs-th with the sector ETF too, and the
    # L3 columns carry its deepest published level meanwhile (sector/subsector fields null).
    late = np.flatnonzero((fidx[:, 1] == 3) & (fidx[:, 2] >= 0) & (fidx[:, 2] != 5))
    row = late[late >= 17][0]  # fully observed itself
    first_l2 = 200 + MIN_OBS - 1  # its min_obs-th return with the ETF's first return at 200
    assert np.isnan(got["l1_mkt_hr"][row, : MIN_OBS - 1]).all()
    assert np.isfinite(got["l1_mkt_hr"][row, MIN_OBS - 1 :]).all()
    assert np.isnan(got["l2_sec_hr"][row, :first_l2]).all()
    assert np.isfinite(got["l2_sec_hr"][row, first_l2:]).all()
    np.testing.assert_array_equal(
        got["l3_mkt_hr"][row, MIN_OBS:200], got["l1_mkt_hr"][row, MIN_OBS:200]
    )
    assert np.isnan(got["l3_sec_hr"][row, MIN_OBS:200]).all()


def test_where_the_levels_share_their_sample_the_kernel_is_the_joint_one_bitwise(panel) -> None:
    """Rows whose ETFs have every session (and the market-only rows) are computed as before
    issue 22, bit for bit: a late ETF costs its own rows only."""
    returns, factors, fidx = panel
    got = rolling_cascade(returns, factors, fidx, window=WINDOW, min_obs=MIN_OBS)
    want = joint_reference_cascade(returns, factors, fidx, window=WINDOW, min_obs=MIN_OBS)
    gaps = np.isnan(factors[:, :]).any(axis=1)
    same = ~(np.where(fidx >= 0, gaps[np.maximum(fidx, 0)], False)[:, 1:]).any(axis=1)
    assert same.sum() >= 10
    for f, name in enumerate(CASCADE_FIELDS):
        assert np.array_equal(bits(got[name][same]), bits(want[f][same])), name


def test_rolling_std_equals_the_reference_bitwise(panel) -> None:
    """The kernel runs the rows two at a time: an odd number of rows too (the last alone)."""
    for returns in (panel[0], panel[0][:-1], panel[0][:1]):
        for window, min_obs in ((WINDOW, MIN_OBS), (23, 16)):
            got = rolling_std(returns, window=window, min_obs=min_obs)
            assert np.array_equal(
                bits(got), bits(reference_std(returns, window=window, min_obs=min_obs))
            )


def test_outputs_are_written_into_memory_mapped_files(panel, tmp_path: Path) -> None:
    returns, factors, fidx = panel
    want = rolling_cascade(returns, factors, fidx, window=WINDOW, min_obs=MIN_OBS)
    files = {
        name: np.lib.format.open_memmap(tmp_path / f"{name}.npy", "w+", np.float64, returns.shape)
        for name in CASCADE_FIELDS
    }
    got = rolling_cascade(returns, factors, fidx, window=WINDOW, min_obs=MIN_OBS, out=files)
    assert all(got[name] is files[name] for name in CASCADE_FIELDS)
    for array in files.values():
        array.flush()
    for name in CASCADE_FIELDS:
        assert np.array_equal(bits(np.load(tmp_path / f"{name}.npy")), bits(want[name])), name
    vol_file = np.lib.format.open_memmap(tmp_path / "vol.npy", "w+", np.float64, returns.shape)
    assert rolling_std(returns, window=WINDOW, min_obs=MIN_OBS, out=vol_file) is vol_file
    assert np.array_equal(
        bits(vol_file), bits(reference_std(returns, window=WINDOW, min_obs=MIN_OBS))
    )


def test_symbol_blocks_through_one_reused_buffer_equal_the_full_run(panel) -> None:
    """A caller that writes blocks of symbols through one small buffer (then to disk) gets the
    same numbers as one call over every symbol."""
    returns, factors, fidx = panel
    want = rolling_cascade(
        returns, factors, fidx, window=WINDOW, min_obs=MIN_OBS, halflife=HALFLIFE
    )
    block = 7
    buffer = {name: np.full((block, returns.shape[1]), -1.0) for name in CASCADE_FIELDS}
    for lo in range(0, len(returns), block):
        hi = min(lo + block, len(returns))
        view = {name: buf[: hi - lo] for name, buf in buffer.items()}
        rolling_cascade(
            returns[lo:hi], factors, fidx[lo:hi],
            window=WINDOW, min_obs=MIN_OBS, halflife=HALFLIFE, out=view,
        )  # fmt: skip
        for name in CASCADE_FIELDS:
            assert np.array_equal(bits(view[name]), bits(want[name][lo:hi])), (name, lo)


def _start_points(n_t: int) -> list[int]:
    """Sessions on anchors and next to them, the first and the last, and random ones."""
    rng = np.random.default_rng(10)
    anchors = [a + d for a in range(0, n_t, WINDOW) for d in (-1, 0, 1)]
    picks = [0, 1, n_t - 1, *anchors, *rng.integers(0, n_t, 6).tolist()]
    return sorted({s for s in picks if 0 <= s < n_t})


@pytest.mark.parametrize("halflife", [None, HALFLIFE])
def test_a_run_from_start_equals_the_full_run_and_leaves_earlier_sessions(panel, halflife) -> None:
    returns, factors, fidx = panel
    want = rolling_cascade(
        returns, factors, fidx, window=WINDOW, min_obs=MIN_OBS, halflife=halflife
    )
    sentinel = 12345.0
    for start in _start_points(returns.shape[1]):
        out = {name: np.full(returns.shape, sentinel) for name in CASCADE_FIELDS}
        rolling_cascade(
            returns, factors, fidx, window=WINDOW, min_obs=MIN_OBS, halflife=halflife,
            out=out, start=start,
        )  # fmt: skip
        for name in CASCADE_FIELDS:
            assert (out[name][:, :start] == sentinel).all(), (name, start)
            assert np.array_equal(bits(out[name][:, start:]), bits(want[name][:, start:])), (
                name,
                start,
            )


@pytest.mark.parametrize("halflife", [None, HALFLIFE])
def test_a_run_from_start_reads_one_window_before_its_anchor_only(panel, halflife) -> None:
    """Issue 10's incremental update: data older than (anchor at or before start) - window + 1
    is never read, so a one-session update costs O(window) per stock, not O(T)."""
    returns, factors, fidx = panel
    want = rolling_cascade(
        returns, factors, fidx, window=WINDOW, min_obs=MIN_OBS, halflife=halflife
    )
    n_t = returns.shape[1]
    for start in (n_t - 1, 3 * WINDOW, 3 * WINDOW + 1, 5 * WINDOW - 1):
        first = start - start % WINDOW - WINDOW + 1
        garbage_r, garbage_f = returns.copy(), factors.copy()
        garbage_r[:, :first] = 1e6  # anything read from here would change the answer
        garbage_f[:, :first] = -1e6
        out = {name: np.zeros(returns.shape) for name in CASCADE_FIELDS}
        rolling_cascade(
            garbage_r, garbage_f, fidx, window=WINDOW, min_obs=MIN_OBS, halflife=halflife,
            out=out, start=start,
        )  # fmt: skip
        for name in CASCADE_FIELDS:
            assert np.array_equal(bits(out[name][:, start:]), bits(want[name][:, start:])), name
        vol = np.zeros(returns.shape)
        rolling_std(garbage_r, window=WINDOW, min_obs=MIN_OBS, out=vol, start=start)
        full = reference_std(returns, window=WINDOW, min_obs=MIN_OBS)
        assert np.array_equal(bits(vol[:, start:]), bits(full[:, start:]))


def test_rolling_std_from_start_equals_the_full_run(panel) -> None:
    returns = panel[0][1:]  # an odd number of rows
    for window, min_obs in ((WINDOW, MIN_OBS), (23, 16)):
        full = reference_std(returns, window=window, min_obs=min_obs)
        for start in (0, 1, window - 1, window, window + 1, 200, returns.shape[1] - 1):
            out = np.full(returns.shape, 7.0)
            rolling_std(returns, window=window, min_obs=min_obs, out=out, start=start)
            assert (out[:, :start] == 7.0).all()
            assert np.array_equal(bits(out[:, start:]), bits(full[:, start:])), (window, start)


def test_outputs_the_kernel_cannot_write_in_place_are_refused(panel) -> None:
    returns, factors, fidx = panel
    good = {name: np.empty(returns.shape) for name in CASCADE_FIELDS}
    kwargs = {"window": WINDOW, "min_obs": MIN_OBS}
    with pytest.raises(ValueError, match="float64"):
        rolling_cascade(returns, factors, fidx, **kwargs, out={**good, "n_obs": np.empty((2, 2))})
    with pytest.raises(ValueError, match="C-contiguous"):
        strided = np.empty((returns.shape[0], 2 * returns.shape[1]))[:, ::2]
        rolling_cascade(returns, factors, fidx, **kwargs, out={**good, "l1_mkt_hr": strided})
    with pytest.raises(ValueError, match="out="):
        rolling_cascade(returns, factors, fidx, **kwargs, start=5)
    with pytest.raises(ValueError, match="factor_index must be"):
        rolling_cascade(returns.T.copy(), factors, fidx, **kwargs)  # (T, n): read past fidx
    with pytest.raises(ValueError, match="factor rows"):
        rolling_cascade(returns, factors, np.where(fidx >= 0, fidx + 1, -1), **kwargs)
    with pytest.raises(ValueError, match="start"):
        rolling_std(returns, **kwargs, out=np.empty(returns.shape), start=returns.shape[1] + 1)


@pytest.mark.parametrize("halflife", [None, HALFLIFE])
def test_the_one_sample_loop_equals_the_three_sample_loop_bitwise(panel, halflife) -> None:
    """A stock whose sessions serve all its levels or none runs `_period_one`; the general
    `_period` gives it the same bits (both run here on each such stock's scratch, period by
    period over its whole history), and the panel has stocks of both kinds."""
    from eqrisk.model import cascade as kernel

    returns, factors, fidx = panel
    n_t = returns.shape[1]
    lam = _lam(halflife)
    one_sample = 0
    for i in range(1, returns.shape[0]):
        k = 1 + int((fidx[i] >= 0).sum())
        z = np.empty((n_t, kernel.NV))
        lev = np.empty(n_t, dtype=np.int8)
        if kernel._load_stock(returns, factors, fidx, i, k, 0, z, lev):
            assert set(np.unique(lev)) - {0, k - 1}
            continue
        one_sample += 1
        outs = [tuple(np.full((i + 1, n_t), -1.0) for _ in CASCADE_FIELDS) for _ in range(2)]
        for a in range(0, n_t, WINDOW):
            kernel._period(z, lev, 0, i, k, WINDOW, MIN_OBS, lam, 0, a, outs[0])
            kernel._period_one(z, lev, 0, i, k, WINDOW, MIN_OBS, lam, 0, a, outs[1])
        for a, b in zip(*outs, strict=True):
            assert np.array_equal(bits(a[i]), bits(b[i]))
        assert np.isfinite(outs[1][0][i]).sum() > 0
    assert 10 <= one_sample < returns.shape[0] - 1

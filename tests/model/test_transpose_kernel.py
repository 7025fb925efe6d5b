"""The session-major copy of a block of style arrays (`model.transpose_kernel`, behind
`style_regression._session_major`): numpy's moved-axes copy, value for value."""

from __future__ import annotations

import numpy as np
import pytest

from eqrisk.model.style_regression import _session_major


def _numpy_session_major(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.moveaxis(a, (-1, -2), (0, 1)), dtype=np.float64)


@pytest.mark.parametrize("shape", [(6, 500, 37), (1, 3, 1), (2, 0, 5), (3, 4, 0), (7, 33, 16)])
def test_a_block_in_session_major_order_equals_numpys_copy(shape: tuple[int, int, int]) -> None:
    rng = np.random.default_rng(sum(shape))
    block = rng.normal(size=shape)
    block[rng.random(shape) < 0.1] = np.nan
    block[..., ::5] = -0.0
    got = _session_major(block)
    want = _numpy_session_major(block)
    assert got.shape == (shape[2], shape[1], shape[0]) and got.flags.c_contiguous
    assert np.array_equal(got.view(np.uint64), want.view(np.uint64))  # the bits, NaN and -0.0


def test_a_view_and_a_narrower_dtype_are_copied_as_numpy_copies_them() -> None:
    rng = np.random.default_rng(4)
    wide = rng.normal(size=(5, 40, 90))
    view = wide[:, ::3, 10:70]  # not contiguous
    assert np.array_equal(_session_major(view), _numpy_session_major(view))
    narrow = wide.astype(np.float32)
    got = _session_major(narrow)
    assert got.dtype == np.float64 and np.array_equal(got, _numpy_session_major(narrow))
    flags = rng.random((2, 6, 9)) < 0.5  # bool blocks keep their dtype (numpy's copy)
    assert _session_major(flags).dtype == bool
    assert np.array_equal(_session_major(flags), np.moveaxis(flags, (-1, -2), (0, 1)))

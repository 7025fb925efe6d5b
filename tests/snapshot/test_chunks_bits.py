"""`same_bits` and `narrowest` read arrays in place and keep their bit-for-bit meaning: the
answers equal those of the byte-copy definitions (`tobytes()` of both sides, and the narrow
array converted back to float64 and compared byte for byte) on values chosen to tell bits
from numbers: NaN payloads, -0.0, infinities, subnormals, integers at the dtype edges."""

from __future__ import annotations

import numpy as np
import pytest

from eqrisk.snapshot.chunks import narrowest, same_bits
from eqrisk.snapshot.chunks.grid import CODES


def _bytes_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _narrowest_by_copies(values: np.ndarray) -> np.ndarray:
    for code in ("B", "H", "f"):
        dtype = CODES[code]
        if dtype.kind == "u" and not np.isfinite(values).all():
            continue
        with np.errstate(invalid="ignore", over="ignore"):
            narrow = values.astype(dtype)
        if _bytes_equal(narrow.astype(np.float64), values):
            return narrow
    return values


def _nan(payload: int, sign: int = 0) -> float:
    bits = np.array([(sign << 63) | (0x7FF << 52) | payload], dtype=np.uint64)
    return float(bits.view(np.float64)[0])


SPECIAL = [
    0.0,
    -0.0,
    1.0,
    255.0,
    256.0,
    65535.0,
    65536.0,
    -1.0,
    0.5,
    np.inf,
    -np.inf,
    5e-324,
    1e300,
    float(np.float32(0.1)),
    0.1,
    float(np.finfo(np.float32).max),
]
NANS = [
    _nan(1 << 51),  # the quiet NaN numpy makes
    _nan(1 << 51, sign=1),
    _nan((1 << 51) | (1 << 29)),  # a payload float32 keeps
    _nan((1 << 51) | 1),  # a payload float32 drops
    _nan(1),  # signalling
]


def _cases() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    cases = []
    for pool in (SPECIAL, SPECIAL + NANS, NANS, [0.0, 3.0, 200.0], [0.0, 3.0, 60000.0]):
        for size in (1, 5, 64):
            cases.append(rng.choice(np.array(pool), size=(size, 3)))
    cases.append(np.array([[1.0, 2.0], [np.nan, 4.0]]))
    cases.append(np.array([[-0.0, 2.0]]))
    cases.append(np.array([[float(np.float32(0.1)), _nan((1 << 51) | (1 << 29))]]))
    cases.append(np.empty((0, 4)))
    return cases


@pytest.mark.parametrize("values", _cases())
def test_narrowest_is_the_byte_copy_definition(values: np.ndarray) -> None:
    got, want = narrowest(values), _narrowest_by_copies(values)
    assert got.dtype == want.dtype
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("values", _cases())
def test_same_bits_is_the_byte_copy_definition(values: np.ndarray) -> None:
    rng = np.random.default_rng(11)
    for other in (values.copy(), rng.permutation(values.ravel()).reshape(values.shape)):
        assert same_bits(values, other) == _bytes_equal(values, other)
    if values.size:
        flipped = values.copy()
        flipped.view(np.uint64).flat[0] ^= np.uint64(1)  # one bit of one element
        assert same_bits(values, flipped) is False
    # Strided views (a column, a reversed row order) are compared in place as well.
    for a, b in ((values[:, 1:], values.copy()[:, 1:]), (values[::-1], values[::-1].copy())):
        assert same_bits(a, b) is True
    assert same_bits(values, np.zeros(values.shape, np.float32)) is False  # dtype counts
    assert same_bits(values, values.reshape(-1)) is (values.ndim == 1)


def test_same_bits_tells_nan_payloads_and_signed_zeros_apart() -> None:
    a = np.array([_nan(1 << 51), -0.0, 1.0])
    assert same_bits(a, a.copy()) is True  # NaN equals itself bit for bit
    assert same_bits(a, np.array([_nan((1 << 51) | 1), -0.0, 1.0])) is False
    assert same_bits(a, np.array([_nan(1 << 51), 0.0, 1.0])) is False
    narrow = np.array([[1, 2]], dtype=np.uint8)
    assert same_bits(narrow, narrow.copy()) is True
    assert same_bits(narrow, narrow.astype(np.uint16)) is False


@pytest.mark.parametrize(
    "values",
    [
        np.array([[0.0 + 1j, _nan(1 << 51) - 0.0j], [-0.0 + 0j, 2.0 + 0j]]),
        np.array([(1.0, 2), (-0.0, 3)], dtype=[("x", "f8"), ("n", "i2")]),
    ],
)
def test_same_bits_of_other_widths_is_the_byte_copy_definition(values: np.ndarray) -> None:
    """Complex and record elements (no unsigned integer of their width) compare bytes too,
    strided views included."""
    assert same_bits(values, values.copy()) is True
    flipped = values.copy()
    flipped.view(np.uint8).flat[0] ^= np.uint8(1)
    assert same_bits(values, flipped) is _bytes_equal(values, flipped) is False
    assert same_bits(values[::-1], values.copy()[::-1]) is True
    zero = values.copy()
    zero.view(np.uint8)[...] = 0
    assert same_bits(values, zero) is _bytes_equal(values, zero) is False

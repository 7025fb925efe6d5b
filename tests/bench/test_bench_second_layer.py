"""The second-layer measurement's numerics (`bench/second_layer.py`) on small synthetic residuals:
rolling loadings equal a direct loop over the window before t, the orthogonal return and the
principal components never read session t or later, a planted common factor shows in the
common-variance figures and is found by one component, independent noise is not."""

from __future__ import annotations

import numpy as np
import pytest

from eqrisk.bench.second_layer import (
    WINDOW,
    explained,
    orthogonal,
    pca_loadings,
    pca_returns,
    rolling_loadings,
    window_common,
)

N, T = 40, 700


def _panel(common: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    f = rng.normal(0.0, 0.01, T)
    load = rng.normal(1.0, 0.5, N)
    e = common * load[:, None] * f[None, :] + rng.normal(0.0, 0.01, (N, T))
    e[3, 100:180] = np.nan
    return e, f, load


def test_rolling_loadings_are_the_slopes_of_the_window_before() -> None:
    e, f, _ = _panel(1.0)
    beta = rolling_loadings(e, f)
    for i, t in ((0, 300), (3, 260), (3, 400), (7, T - 1)):
        lo = max(t - WINDOW, 0)
        y, x = e[i, lo:t], f[lo:t]
        ok = np.isfinite(y)
        assert beta[i, t] == pytest.approx(np.sum(y[ok] * x[ok]) / np.sum(x[ok] ** 2), rel=1e-10)
    assert np.isnan(beta[:, :100]).all()  # fewer than 126 sessions before t


def test_nothing_reads_the_session_or_later() -> None:
    e, f, _ = _panel(1.0)
    x = np.vstack([f, np.random.default_rng(5).normal(0.0, 0.01, T)])
    c = 0.5 * f + np.random.default_rng(6).normal(0.0, 0.01, T)
    base_c, base_u = orthogonal(c, x, WINDOW), pca_loadings(e, WINDOW, 2)
    cut = 500
    e2, x2, c2 = e.copy(), x.copy(), c.copy()
    e2[:, cut:] *= 7.0
    x2[:, cut:] *= -3.0
    c2[cut:] += 1.0
    np.testing.assert_array_equal(orthogonal(c2, x2, WINDOW)[:cut], base_c[:cut])
    np.testing.assert_array_equal(pca_loadings(e2, WINDOW, 2)[:, :, :cut], base_u[:, :, :cut])
    np.testing.assert_array_equal(rolling_loadings(e2, f)[:, :cut], rolling_loadings(e, f)[:, :cut])


def test_a_planted_factor_shows_and_noise_does_not() -> None:
    noisy, _, _ = _panel(0.0)
    common, f, _ = _panel(1.0)
    quiet, loud = window_common(noisy[:, -WINDOW:]), window_common(common[:, -WINDOW:])
    assert quiet["above_edge"] == 0 and loud["above_edge"] >= 1
    assert quiet["top1"] < quiet["noise_edge"] < loud["top1"]
    # The equal-weight book: about 1 (independent) without the factor, about n x share with it.
    assert 0.7 < quiet["book_ratio"] < 1.4
    assert loud["book_ratio"] > 10
    u = pca_loadings(common, WINDOW, 1)
    g = pca_returns(common, u)
    fitted = np.einsum("nkt,kt->nt", u, g)
    ok = np.isfinite(common)
    books = {2: np.array([[0, 1], [5, 9]])}
    out = explained(common, fitted, books, ok, WINDOW)
    # Pooled share of the factor: E[l^2] var(f) / (E[l^2] var(f) + var(noise)) = 1.25 / 2.25.
    assert out["stocks"] == pytest.approx(1.25 / 2.25, rel=0.1)
    assert out["books_2"] > 0.5
    v = pca_loadings(noisy, WINDOW, 1)
    none = explained(noisy, np.einsum("nkt,kt->nt", v, pca_returns(noisy, v)), books,
                     np.isfinite(noisy), WINDOW)  # fmt: skip
    assert none["stocks"] < 0.1 < out["stocks"]
    assert abs(float(np.corrcoef(g[0, WINDOW:], f[WINDOW:])[0, 1])) > 0.95

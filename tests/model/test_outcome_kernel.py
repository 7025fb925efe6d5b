"""The accuracy measure's outcome loops (`model.outcome_kernel`, issue 35: sessions in blocks,
a member's figures added for a run of sessions in one sweep, the previous model in the same
pass, the quadratic forms of every portfolio at once) give the bits of the loops as first
written (`outcome_reference`), on books of every kind: long-only, long-short, hedged twins,
members missing a session inside a block, slots above a member's level, second-layer
exposures of 0 beside a factor with no covariance (a pair the portfolio lacks adds nothing),
and a portfolio with no member at all on a session; and their portfolios' figures are a plain
numpy computation's (normalised weights times the dense exposures, x' F x) to rounding."""

from __future__ import annotations

import numpy as np
import pytest

from eqrisk.model import outcome_kernel
from eqrisk.model.outcome_kernel import BLOCK, held_returns, portfolio_days, twins
from model import outcome_reference as reference

N, K_ETF, N_STYLE = 60, 5, 3
K = K_ETF + N_STYLE


def _books(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(members, weights, hedged): long-only books, long-short ones, the long-only ones again
    hedged (twins), and a book of one stock."""
    rows: list[np.ndarray] = []
    for size in (5, 12, 20):
        w = np.zeros(N)
        w[rng.choice(N, size, replace=False)] = rng.dirichlet(np.ones(size))
        rows.append(w)
    for _ in range(2):
        w = np.zeros(N)
        pick = rng.choice(N, 16, replace=False)
        w[pick[:8]] = rng.dirichlet(np.ones(8))
        w[pick[8:]] = -rng.dirichlet(np.ones(8))
        rows.append(w)
    rows += rows[:3]
    one = np.zeros(N)
    one[7] = 1.0
    rows.append(one)
    weights = np.array(rows)
    hedged = np.array([False] * 5 + [True] * 3 + [True])
    held = weights != 0
    width = int(held.sum(axis=1).max())
    members = np.full((len(rows), width), -1, dtype=np.int64)
    padded = np.zeros((len(rows), width))
    for p in range(len(rows)):
        at = np.flatnonzero(held[p])
        members[p, : len(at)] = at
        padded[p, : len(at)] = weights[p, at]
    return members, padded, hedged


def _case(seed: int, s_count: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    members, weights, hedged = _books(rng)
    index = np.full((N, 3), -1, dtype=np.int64)
    index[:, 0] = 0
    index[:, 1] = rng.integers(1, 3, N)
    index[: N // 2, 2] = rng.integers(3, K_ETF, N // 2)
    level = rng.integers(1, 4, (N, s_count)).astype(np.int64)
    values = rng.normal(1.0, 0.3, (3, N, s_count))
    values[:, :, :3] = np.nan  # no hedge yet: not available below
    style = rng.normal(0.0, 1.0, (N_STYLE, N, s_count))
    style[:, rng.random(N) < 0.3, :] = 0.0  # stocks without a second-layer exposure
    style[2] = 0.0  # a factor nobody has ...
    a = rng.normal(size=(s_count, K, K)) * 0.1
    cov = np.einsum("tij,tkj->tik", a, a) + np.eye(K) * 0.01
    cov[:, K - 1, :] = np.nan  # ... and that has no covariance
    cov[:, :, K - 1] = np.nan
    spec = rng.uniform(1e-4, 4e-4, (N, s_count))
    avail = rng.random((N, s_count)) > 0.03  # a few members missing a session
    avail[:, : min(3, s_count - 1)] = False
    avail[7, 40:50] = False  # the one-stock book holds nothing for a while
    late = min(70, s_count)
    avail[: N // 3, late:] = rng.random((N // 3, s_count - late)) > 0.5
    p_a = rng.normal(size=(s_count, K_ETF, K_ETF)) * 0.1
    return {
        "members": members, "weights": weights, "hedged": hedged, "avail": avail,
        "index": index, "level": level, "values": values, "cov": cov, "spec": spec,
        "r_sum": rng.normal(0, 0.01, (N, s_count)),
        "f_sum": rng.normal(0, 0.01, (K_ETF, s_count)),
        "base": np.where(rng.random((N, s_count)) < 0.05, np.nan,
                         rng.uniform(0.01, 0.03, (N, s_count))),
        "fbase": np.where(rng.random((K_ETF, s_count)) < 0.05, np.nan,
                          rng.uniform(0.01, 0.02, (K_ETF, s_count))),
        "style": style,
        "p_cov": np.einsum("tij,tkj->tik", p_a, p_a) + np.eye(K_ETF) * 0.01,
        "p_spec": rng.uniform(1e-4, 4e-4, (N, s_count)),
    }  # fmt: skip


ARGS = ("members", "weights", "hedged", "avail", "index", "level", "values", "cov", "spec",
        "r_sum", "f_sum", "base", "fbase")  # fmt: skip


def _days(module: object, c: dict[str, np.ndarray], style: np.ndarray, cov: np.ndarray,
          spec: np.ndarray) -> list[np.ndarray]:  # fmt: skip
    p, s_count = len(c["members"]), c["avail"].shape[1]
    out = [np.full((p, s_count), np.nan) for _ in range(3)]
    args = [c[a] for a in ARGS]
    args[7], args[8] = cov, spec
    module.portfolio_days(*args, style, *out)  # type: ignore[attr-defined]
    return out


def _bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize(("seed", "s_count"), [(0, 3 * BLOCK + 7), (1, BLOCK - 5), (2, 1)])
def test_the_loops_give_the_first_loops_bits(seed: int, s_count: int) -> None:
    c = _case(seed, max(s_count, 1))
    if s_count < 4:  # one session: every member there
        c["avail"][:] = True
        c["values"][:] = np.nan_to_num(c["values"], nan=1.0)
    want = _days(reference, c, c["style"], c["cov"], c["spec"])
    got = _days(outcome_kernel, c, c["style"],
                c["cov"], c["spec"])  # fmt: skip
    for a, b in zip(want, got, strict=True):
        assert _bits(a, b)
    # the factor with no covariance, which nobody has, leaves every forecast there; the only
    # ones missing are of a book with no member present
    assert np.isfinite(got[1]).any()
    assert (np.isnan(got[1]) == np.isnan(got[0])).all() and (s_count == 1) != np.isnan(got[1]).any()
    # The previous model in the same pass: its own call's forecasts, without `style`.
    prev_want = _days(reference, c, np.zeros((0, N, c["avail"].shape[1])), c["p_cov"],
                      c["p_spec"])[1]  # fmt: skip
    p, s = len(c["members"]), c["avail"].shape[1]
    out = [np.full((p, s), np.nan) for _ in range(4)]
    portfolio_days(*[c[a] for a in ARGS], c["style"], *out[:3], (c["p_cov"], c["p_spec"], out[3]),
                   twins(c["members"], c["weights"]))  # fmt: skip
    assert all(_bits(a, b) for a, b in zip(want, out[:3], strict=True))
    assert _bits(prev_want, out[3])
    # The held returns over a horizon.
    args = [c[a] for a in ("members", "weights", "hedged", "avail", "index", "level", "values",
                           "r_sum", "f_sum")]  # fmt: skip
    h_want, h_got = np.full((p, s), np.nan), np.full((p, s), np.nan)
    reference.held_returns(*args, h_want)
    held_returns(*args, h_got)
    assert _bits(h_want, h_got) and np.isfinite(h_got).any()


def test_the_figures_are_a_dense_computation() -> None:
    """Per session: weights of the members present scaled to 1 (longs) and -1 (shorts), x =
    w' B over the slots of each member's level and its second-layer exposures, the model's
    variance x' F x + sum w^2 d over the factors the book has, the realised return w' r."""
    c = _case(3, 2 * BLOCK + 3)
    model = _days(outcome_kernel, c, c["style"],
                  c["cov"], c["spec"])[1]  # fmt: skip
    real = _days(outcome_kernel, c, c["style"],
                 c["cov"], c["spec"])[0]  # fmt: skip
    checked = 0
    for t in range(c["avail"].shape[1]):
        for p in range(len(c["members"])):
            at = c["members"][p] >= 0
            rows, w = c["members"][p][at], c["weights"][p][at]
            ok = c["avail"][rows, t]
            if not ok.any():
                assert np.isnan(model[p, t]) and np.isnan(real[p, t])
                continue
            rows, w = rows[ok], w[ok]
            w = np.where(w > 0, w / w[w > 0].sum() if (w > 0).any() else 1.0,
                         w / -w[w < 0].sum() if (w < 0).any() else 1.0)  # fmt: skip
            b = np.zeros((len(rows), K))
            has = np.zeros(K, dtype=bool)
            for a, i in enumerate(rows):
                for j in range(c["level"][i, t]):
                    f = c["index"][i, j]
                    if f >= 0:
                        b[a, f] += c["values"][j, i, t]
                        has[f] = True
                b[a, K_ETF:] = c["style"][:, i, t]
                has[K_ETF:] |= c["style"][:, i, t] != 0
            x = w @ b
            r = w @ c["r_sum"][rows, t]
            if c["hedged"][p]:
                r -= x[:K_ETF][has[:K_ETF]] @ c["f_sum"][:K_ETF, t][has[:K_ETF]]
                has[:K_ETF] = False
            f = np.flatnonzero(has)
            var = x[f] @ c["cov"][t][np.ix_(f, f)] @ x[f] + (w * w) @ c["spec"][rows, t]
            assert model[p, t] == pytest.approx(np.sqrt(var), rel=1e-12)
            assert real[p, t] == pytest.approx(r, rel=1e-12, abs=1e-15)
            checked += 1
    assert checked > 500

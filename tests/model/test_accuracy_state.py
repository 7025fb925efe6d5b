"""Issue 34 part 4: the accuracy record as a running state. Run forward in steps of any size
(through plain arrays, as a snapshot stores it) it gives the bits of one run; its figures are
the measure's (`model.accuracy`: the same outcomes, bias and windows, computed directly from
every session's realised returns and forecasts of the real-data slice)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from eqrisk.model.accuracy import (
    YEAR,
    bias,
    mad_from_one,
    portfolio_outcomes,
    previous,
    stock_outcomes,
)
from eqrisk.model.accuracy_state import (
    ROW_FAMILIES,
    AccuracyState,
    accuracy_step,
    figures_of,
    new_state,
    previous_params,
)
from eqrisk.model.cascade import rolling_std
from eqrisk.model.regime import RegimeParams
from eqrisk.model.risk_model import RiskModel, RiskParams, RiskState, risk_model
from eqrisk.snapshot.chunks import same_bits
from eqrisk.snapshot.risk_arrays import HEDGE_FIELDS
from model.risk_case import STOCKS, Case

DAILY = np.sqrt(252.0)
# The model measured: the ETF layer with the regime adjustment (the slice has no caps, so no
# second layer), so that the previous model (`previous_params`: no regime) differs from it.
SERVED = RiskParams(regime=RegimeParams.calibrated())


def _start(case: Case) -> AccuracyState:
    fidx = case.layout.fidx
    stocks = np.isin(case.result.symbols, STOCKS) & (fidx[:, 1] >= 0)
    return new_state(stocks, np.where(stocks, fidx[:, 1], -1), len(case.layout.keys))


def _run(case: Case, cuts: list[int], *, through_arrays: bool = True) -> AccuracyState:
    """The state after every session, stepped at `cuts` as a build steps its chunks: each
    step's risk model resumed from the last (`risk_model(..., state=)`)."""
    m, lay = case.result.metrics, case.layout
    n_t = m["return"].shape[1]
    vol = previous(m["vol_23d"] / DAILY)
    state = _start(case)
    risk: RiskState | None = None
    before: RiskState | None = None  # the previous model's, stepped beside it
    bounds = [0, *cuts, n_t]
    for lo, hi in itertools.pairwise(bounds):
        first = max(lo - 1, 0)
        sl = slice(first, hi)
        model = _resumed(case, sl, None if risk is None else risk.moved(-first), SERVED)
        risk = model.state.moved(first)
        prev = _resumed(case, sl, None if before is None else before.moved(-first),
                        previous_params(SERVED))  # fmt: skip
        before = prev.state.moved(first)
        state = accuracy_step(
            state, model, m["return"][:, lo:hi], lay.factors[:, lo:hi], vol[:, lo:hi], prev
        )
        if through_arrays:
            state = AccuracyState.from_arrays(
                {k: np.array(v) for k, v in state.to_arrays().items()}
            )
    return state


def _resumed(case: Case, sl: slice, state: RiskState | None, params: RiskParams) -> RiskModel:
    m, lay = case.result.metrics, case.layout
    return risk_model(
        m["return"][:, sl], lay.factors[:, sl], lay.fidx, lay.keys, case.result.symbols,
        {k: m[k][:, sl] for k in HEDGE_FIELDS}, params, state=state,
    )  # fmt: skip


def test_the_previous_model_is_the_etf_layer_without_the_regime_adjustment() -> None:
    from eqrisk.build.risk_run import SERVED as BUILT

    prev = previous_params(BUILT)
    assert prev.styles is None and prev.regime is None
    # the same estimators, but correlations of the raw returns, as before issue 34's fix
    assert BUILT.covariance.corr_standardised and not prev.covariance.corr_standardised
    assert (prev.level, prev.covariance, prev.specific) == (
        BUILT.level, replace(BUILT.covariance, corr_standardised=False), BUILT.specific)  # fmt: skip
    assert previous_params(RiskParams()) == RiskParams()


@pytest.fixture(scope="module")
def whole(risk_case: Case) -> AccuracyState:
    return _run(risk_case, [], through_arrays=False)


def test_steps_of_any_size_give_the_bits_of_one_run(risk_case: Case, whole: AccuracyState) -> None:
    n_t = risk_case.result.metrics["return"].shape[1]
    # Chunks of 128 as a build writes them, then a daily build's one-session steps; and cuts
    # inside a 21-day horizon, a month block and the burn-in.
    for cuts in (list(range(128, n_t, 128)), [5, 260, 261, 700, n_t - 3, n_t - 2, n_t - 1]):
        got = _run(risk_case, cuts)
        want = whole.to_arrays()
        have = got.to_arrays()
        assert set(have) == set(want)
        for key, value in want.items():
            assert same_bits(np.asarray(have[key]), np.asarray(value)), key
        assert figures_of(got) == figures_of(whole)


def test_the_figures_are_the_measure_of_every_sessions_outcomes(
    risk_case: Case, whole: AccuracyState
) -> None:
    m, lay = risk_case.result.metrics, risk_case.layout
    models = {"model": risk_case.run(SERVED), "previous": risk_case.model}
    assert previous_params(SERVED) == RiskParams()  # the case's own model
    vol23 = m["vol_23d"] / DAILY
    fvol = rolling_std(lay.factors, window=23, min_obs=16)
    figures = figures_of(whole)
    family = whole.family
    n = whole.n
    for h in (1, 21):
        outcomes = {}
        for name, mod in models.items():
            outcomes[name] = (
                stock_outcomes(mod, m["return"], vol23, h),
                portfolio_outcomes(mod, whole.portfolios, m["return"], lay.factors, vol23,
                                   fvol, h),
            )  # fmt: skip
        for kind in ("model", "baseline", "previous"):
            s_out, p_out = outcomes["previous" if kind == "previous" else "model"]
            # the same outcomes: the previous model's books hold the same members
            np.testing.assert_array_equal(p_out.realised, outcomes["model"][1].realised)
            attr = "model" if kind == "previous" else kind
            real = np.vstack([s_out.realised, p_out.realised])[:, YEAR:]
            fc = np.vstack([getattr(s_out, attr), getattr(p_out, attr)])[:, YEAR:]
            run = whole.sums[f"{h}d/{kind}"]
            with np.errstate(invalid="ignore", divide="ignore"):
                z = real / fc
            z[~np.isfinite(z)] = np.nan
            np.testing.assert_array_equal(run.count, np.isfinite(z).sum(axis=1))
            got = np.sqrt((run.s2 - run.s1**2 / run.count) / (run.count - 1))
            counted = run.count >= YEAR
            np.testing.assert_allclose(got[counted], bias(real, fc)[counted], rtol=1e-12)
            # 12-month windows: 252 outcomes from the first, one every 21, complete ones only.
            ends = range(YEAR, run.outcomes + 1, 21)  # the windows complete so far
            windows = np.column_stack([bias(real[:, e - YEAR : e], fc[:, e - YEAR : e],
                                            min_obs=YEAR // 2) for e in ends])  # fmt: skip
            mad = run.mad_sum / run.mad_count
            has = np.isfinite(windows).any(axis=1)
            np.testing.assert_allclose(mad[has], mad_from_one(windows)[has], rtol=1e-10)
            for f, name in enumerate(ROW_FAMILIES):
                rows = np.flatnonzero(family == f)
                med = [np.median(w[np.isfinite(w)]) for w in windows[rows].T
                       if np.isfinite(w).any()]  # fmt: skip
                if med:
                    assert run.worst[f] == pytest.approx(max(med), rel=1e-10)
                    slot = "previous_model" if kind == "previous" else kind
                    assert figures[f"{h}d"][name][slot]["worst_12m"] == round(max(med), 4)
            kept = counted & (family >= 0)
            single = kept[:n] & (family[:n] == 0)
            if kind != "baseline":
                b = np.median(bias(real[:n][single], fc[:n][single]))
                slot = "previous_model" if kind == "previous" else kind
                assert figures[f"{h}d"]["single_stocks"][slot]["bias"] == round(b, 4)
    one = figures["1d"]
    assert set(one) == set(ROW_FAMILIES) and figures["21d"].keys() == one.keys()
    for entry in one.values():
        lo, hi = entry["band"]
        assert lo < 1 < hi and 0.5 < entry["model"]["bias"] < 1.5
        prev = entry["previous_model"]  # measured beside it, and not the same forecasts
        assert 0.5 < prev["bias"] < 1.5 and prev["mad_12m"] != entry["model"]["mad_12m"]
        assert 0 < entry["mad_12m_floor"] < entry["model"]["mad_12m"] + 0.1


def test_the_stored_state_holds_the_books_members_and_reads_the_older_dense_form() -> None:
    rng = np.random.default_rng(3)
    n = 400
    stocks = rng.random(n) > 0.1
    state = new_state(stocks, np.where(stocks, rng.integers(0, 9, n), -1), 6)
    parts = state.to_arrays()
    weights = state.portfolios.weights
    held = weights != 0
    # the members only: each book's count, then its rows and weights in order
    assert "p_weights" not in parts
    assert parts["p_count"].tolist() == held.sum(axis=1).tolist()
    assert parts["p_rows"].tolist() == np.nonzero(held)[1].tolist()
    assert same_bits(parts["p_members"], weights[held])
    assert parts["p_rows"].size < weights.size // 5
    dense = {k: v for k, v in parts.items() if k not in ("p_count", "p_rows", "p_members")}
    dense["p_weights"] = weights  # a state written before the members' form
    for stored in (parts, dense):
        back = AccuracyState.from_arrays({k: np.array(v) for k, v in stored.items()})
        assert same_bits(back.portfolios.weights, weights)
        for have, want in zip(back.portfolios.members(), state.portfolios.members(), strict=True):
            assert same_bits(have, want)
        again = back.to_arrays()
        assert set(again) == set(parts)
        for key, value in parts.items():
            assert same_bits(np.asarray(again[key]), np.asarray(value)), key

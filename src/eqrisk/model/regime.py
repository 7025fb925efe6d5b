"""The volatility regime adjustment (as USE4's VRA): the forecasts of F and D are scaled by how
much risk they recently under- or over-stated across the cross-section. Pure.

Per session s the cross-sectional bias of the factor forecasts is B_F,s^2 = mean over the
factors with a forecast and a return of (f_k,s / sigma_k,s)^2 (sigma before the adjustment),
and of the specific forecasts B_D,s^2 = mean over stocks of e_i,s^2 / D_i,s. The multiplier of
session t, lambda_t, is the EWMA mean (half-life 21 by default, weights as elsewhere) of B^2 over
sessions up to t-1, over its EWMA mean with a long half-life (504): the recent bias relative to
the long-run one (1 before `min_obs` sessions); F_t and D_t are multiplied by it (a variance
scale: volatilities scale by its square root). A regime where realised risk runs above the
forecasts raises lambda within days; calm lowers it. Relative, because the mean of z^2 runs
above 1 in every regime (fat tails, and noise in the forecast it divides by): as a plain level
it scaled every forecast up by 4-6% on the real data (random books' b 0.987 -> 0.957).

Resumable: `RegimeState` (the two EWMA sums, weight sums and counts) after session T-1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eqrisk.model.covariance import decay


@dataclass(frozen=True)
class RegimeParams:
    """Half-lives of the factor and the specific multipliers, sessions before one applies."""

    factor_halflife: float = 21.0
    specific_halflife: float = 21.0
    min_obs: int = 21
    # The multiplier is relative to the long-run mean of B^2 (None: to 1); see the docstring.
    long_halflife: float | None = 504.0
    # Each z = realised / forecast counts at most this far from 0 in B^2 (None: no limit): an
    # earnings jump of 15 standard deviations says little about the regime of the others.
    limit: float | None = None
    # The multiplier is the ratio to this power (1: as it is; below 1: shrunk toward 1, for
    # the ratio's own estimation noise and the forecasts' own response to the same returns).
    power: float = 1.0
    # Divide the multiplier by the long-half-life EWMA mean of the multipliers before it, so
    # that over the long run it moves risk between regimes without raising or lowering it on
    # average (the mean of a ratio of EWMAs is not 1).
    debias: bool = False

    @classmethod
    def calibrated(cls) -> RegimeParams:
        """The settings measured best (docs/decisions/risk-forecast.md, the second layer)."""
        return cls()

    def __post_init__(self) -> None:
        decay(self.factor_halflife)
        decay(self.specific_halflife)
        if self.long_halflife is not None:
            decay(self.long_halflife)
        if self.limit is not None and not self.limit > 0:
            raise ValueError("limit must be positive")
        if not 0.0 <= self.power <= 1.0:
            raise ValueError("power must be within [0, 1]")
        if self.min_obs < 1:
            raise ValueError("min_obs must be >= 1")


@dataclass
class RegimeState:
    """EWMA sums of B^2 (factor, specific), their weight sums and counts."""

    session: int
    sums: np.ndarray  # (2, 2): short and long half-life x factor and specific
    weights: np.ndarray  # (2, 2)
    count: np.ndarray  # (2,)
    # (2, 2): EWMA sums (long half-life) of the multipliers before the debiasing and their
    # weight sums x factor and specific (`RegimeParams.debias`); None without it
    past: np.ndarray | None = None

    @classmethod
    def empty(cls) -> RegimeState:
        return cls(0, np.zeros((2, 2)), np.zeros((2, 2)), np.zeros(2))

    def copy(self) -> RegimeState:
        past = None if self.past is None else self.past.copy()
        return RegimeState(
            self.session, self.sums.copy(), self.weights.copy(), self.count.copy(), past
        )

    def to_arrays(self) -> dict[str, np.ndarray]:
        past = {} if self.past is None else {"past": self.past}
        return past | {
            "session": np.array([self.session]),
            "sums": self.sums,
            "weights": self.weights,
            "count": self.count,
        }

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray]) -> RegimeState:
        past = a["past"].copy() if "past" in a else None
        return cls(
            int(a["session"][0]), a["sums"].copy(), a["weights"].copy(), a["count"].copy(), past
        )


@dataclass(frozen=True)
class Regime:
    """Per forecast session the multipliers of F and D, the observed B^2, and the state."""

    factor: np.ndarray  # (sessions,)
    specific: np.ndarray  # (sessions,)
    factor_b2: np.ndarray  # (sessions,) NaN where no factor had a forecast and a return
    specific_b2: np.ndarray  # (sessions,)
    state: RegimeState


def bias_squared(
    realised: np.ndarray, variance: np.ndarray, limit: float | None = None
) -> np.ndarray:
    """Per session (columns), the mean over rows of realised^2 / variance where both exist
    (each term at most limit^2)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        z2 = realised * realised / variance
    if limit is not None:
        z2 = np.minimum(z2, limit * limit)
    ok = np.isfinite(z2)
    count = ok.sum(axis=0)
    total = np.where(ok, z2, 0.0).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def regime_multipliers(
    factor_b2: np.ndarray,
    specific_b2: np.ndarray,
    params: RegimeParams,
    *,
    state: RegimeState | None = None,
) -> Regime:
    """The multipliers of the sessions state.session .. state.session + len - 1 from the B^2 of
    those sessions (the multiplier of a session uses the B^2 before it)."""
    st = RegimeState.empty() if state is None else state.copy()
    long = params.long_halflife
    lam = np.array(
        [
            [decay(params.factor_halflife), decay(params.specific_halflife)],
            [decay(long) if long is not None else 1.0] * 2,
        ]
    )
    n_s = len(factor_b2)
    mult = np.ones((2, n_s))
    if params.debias and st.past is None:
        st.past = np.zeros((2, 2))
    lam_long = decay(long) if long is not None else 1.0
    for t in range(n_s):
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = st.sums / st.weights
            ratio = mean[0] / mean[1] if long is not None else mean[0]
        if params.power != 1.0:
            ratio = ratio**params.power
        ready = (st.count >= params.min_obs) & np.isfinite(ratio)
        mult[:, t] = np.where(ready, ratio, 1.0)
        if st.past is not None:
            with np.errstate(invalid="ignore", divide="ignore"):
                level = st.past[0] / st.past[1]
            mult[:, t] = np.where(ready & (st.past[1] > 0), ratio / level, mult[:, t])
            st.past[0] = lam_long * st.past[0] + np.where(ready, ratio, 0.0)
            st.past[1] = lam_long * st.past[1] + ready
        x = np.array([factor_b2[t], specific_b2[t]])
        seen = np.isfinite(x)
        st.sums = lam * st.sums + np.where(seen, x, 0.0)
        st.weights = lam * st.weights + seen
        st.count += seen
    st.session += n_s
    return Regime(mult[0], mult[1], factor_b2, specific_b2, st)

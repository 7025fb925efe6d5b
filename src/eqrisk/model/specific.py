"""The specific variances D of the risk model: per stock, the EWMA mean of its squared
out-of-sample residual returns (the previous session's hedge on the session's return), shrunk
toward the mean of similar stocks (Bayesian shrinkage), with a floor. Pure: arrays in and out.

- The raw variance of session t uses residuals up to t-1 (pandas' `ewm(halflife=h).mean()` of
  the squared residuals, shifted by one session; optional Newey-West terms as for F); a stock is
  forecast once it has `min_obs` residuals.
- Bayesian shrinkage, per session and group g (sector, or a size band) of the stocks forecast
  that day: the stock's EWMA variance v_i is the evidence of n_i observations (its effective
  number, (sum w)^2 / sum w^2 of its EWMA weights: few for a new listing), the group's mean
  variance m_g a prior worth n0 = `prior_obs` observations, and D_i = (n_i v_i + n0 m_g) /
  (n_i + n0), the mean of the posterior of a normal variance with a conjugate prior. A group
  needs `MIN_GROUP` members; stocks in no group or a smaller one use the whole cross-section.
- Floor: s_i* >= `floor` (daily volatility).

Resumable like the factor covariance: `SpecificState` after session T-1 continues with T.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eqrisk.model.covariance import bartlett, decay

MIN_GROUP = 5


@dataclass(frozen=True)
class SpecificParams:
    """How D is estimated: half-life, Newey-West lags, observations, shrinkage, floor."""

    halflife: float = 42.0
    nw_lags: int = 0
    min_obs: int = 42
    prior_obs: float = 10.0
    floor: float = 0.002  # daily specific volatility (about 3% annualised)

    def __post_init__(self) -> None:
        decay(self.halflife)
        if self.nw_lags < 0 or self.min_obs < 2 or self.prior_obs < 0 or self.floor < 0:
            raise ValueError("nw_lags, prior_obs and floor must be >= 0, min_obs >= 2")


@dataclass
class SpecificState:
    """EWMA sums per stock and lag, weight sums, sums of squared lag-0 weights, counts, the
    last residuals: resume with it."""

    session: int
    sums: np.ndarray  # (L+1, n)
    weights: np.ndarray  # (L+1, n)
    squares: np.ndarray  # (n,)
    count: np.ndarray  # (n,)
    lagged: np.ndarray  # (L, n)

    @classmethod
    def empty(cls, n: int, nw_lags: int) -> SpecificState:
        return cls(
            0,
            np.zeros((nw_lags + 1, n)),
            np.zeros((nw_lags + 1, n)),
            np.zeros(n),
            np.zeros(n),
            np.full((nw_lags, n), np.nan),
        )

    def copy(self) -> SpecificState:
        return SpecificState(
            self.session,
            self.sums.copy(),
            self.weights.copy(),
            self.squares.copy(),
            self.count.copy(),
            self.lagged.copy(),
        )

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {
            "session": np.array([self.session]),
            "sums": self.sums,
            "weights": self.weights,
            "squares": self.squares,
            "count": self.count,
            "lagged": self.lagged,
        }

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray]) -> SpecificState:
        return cls(
            int(a["session"][0]),
            a["sums"].copy(),
            a["weights"].copy(),
            a["squares"].copy(),
            a["count"].copy(),
            a["lagged"].copy(),
        )


@dataclass(frozen=True)
class SpecificVariance:
    """D per forecast session: column t - start is the forecast of session t."""

    start: int
    raw: np.ndarray  # (n, T - start) EWMA variance before shrinkage, NaN before min_obs
    evidence: np.ndarray  # (n, T - start) effective number of observations behind `raw`
    var: np.ndarray  # (n, T - start) shrunk and floored: the published D
    state: SpecificState


def specific_variance(
    residuals: np.ndarray,
    groups: np.ndarray,
    params: SpecificParams,
    *,
    state: SpecificState | None = None,
    first_column: int = 0,
) -> SpecificVariance:
    """D for sessions state.session .. T-1 (all of them without a state); the new state
    continues with session T. `residuals` (n x columns, NaN = none): column c is session
    first_column + c (a resumed run needs only the sessions from the state's on); `groups` (n,)
    or (n x columns, the same sessions): each stock's group (-1 = none)."""
    e = np.asarray(residuals, dtype=np.float64)
    n, n_cols = e.shape
    n_t = first_column + n_cols
    g = np.asarray(groups)
    if g.shape not in ((n,), (n, n_cols)):
        raise ValueError(f"groups must be of shape ({n},) or ({n}, {n_cols})")
    st = SpecificState.empty(n, params.nw_lags) if state is None else state.copy()
    if st.count.shape != (n,) or st.lagged.shape != (params.nw_lags, n):
        raise ValueError("the state is of another universe or another number of lags")
    start = st.session
    if not first_column <= start <= n_t:
        raise ValueError(f"the state's session {start} is outside {first_column}..{n_t}")
    from eqrisk.model.risk_kernel import parallel_blocks  # numba: builds only
    from eqrisk.model.specific_kernel import specific_kernel

    raw = np.full((n, n_t - start), np.nan)
    evidence = np.zeros((n, n_t - start))
    var = np.full((n, n_t - start), np.nan)
    g2 = (g[:, None] if g.ndim == 1 else g).astype(np.int64)
    n_groups = max(int(g2.max(initial=-1)) + 1, 0)
    specific_kernel(
        np.ascontiguousarray(e[:, start - first_column :]), start, start, g2 if g.ndim == 1
        else np.ascontiguousarray(g2[:, start - first_column :]), n_groups, MIN_GROUP,
        decay(params.halflife), bartlett(params.nw_lags), params.min_obs,
        float(params.prior_obs), params.floor**2, st.sums, st.weights, st.squares, st.count,
        st.lagged, raw, evidence, var, parallel_blocks(n),
    )  # fmt: skip
    st.session = n_t
    return SpecificVariance(start=start, raw=raw, evidence=evidence, var=var, state=st)

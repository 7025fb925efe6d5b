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

from eqrisk.model.covariance import bartlett, decay, newey_west_variance

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
    lam = decay(params.halflife)
    nw = bartlett(params.nw_lags)
    raw = np.full((n, n_t - start), np.nan)
    evidence = np.zeros((n, n_t - start))
    for t in range(start, n_t):
        raw[:, t - start] = newey_west_variance(st.sums, st.weights, st.count, nw, params.min_obs)
        with np.errstate(invalid="ignore", divide="ignore"):
            evidence[:, t - start] = np.where(st.squares > 0, st.weights[0] ** 2 / st.squares, 0.0)
        x = e[:, t - first_column]
        for lag, y in enumerate([x, *st.lagged]):
            prod = x * y
            seen = np.isfinite(prod)
            st.sums[lag] = lam * st.sums[lag] + np.where(seen, prod, 0.0)
            st.weights[lag] = lam * st.weights[lag] + seen
            if lag == 0:
                st.squares = lam * lam * st.squares + seen
                st.count += seen
        if params.nw_lags:
            st.lagged = np.vstack([x[None, :], st.lagged[:-1]])
    st.session = n_t
    var = np.empty_like(raw)
    for t in range(start, n_t):
        day_groups = g if g.ndim == 1 else g[:, t - first_column]
        var[:, t - start] = shrink(raw[:, t - start], evidence[:, t - start], day_groups, params)
    return SpecificVariance(start=start, raw=raw, evidence=evidence, var=var, state=st)


def shrink(
    var: np.ndarray, evidence: np.ndarray, groups: np.ndarray, params: SpecificParams
) -> np.ndarray:
    """One session's specific variances (n,), NaN = not forecast, shrunk toward their group's
    mean variance by the weight of their evidence (see the module docstring) and floored."""
    ok = np.isfinite(var)
    out = np.full(var.shape, np.nan)
    if not ok.any():
        return out
    g = np.where(ok, groups, -1).astype(np.int64)
    sizes = np.bincount(g[g >= 0], minlength=1)
    rest = len(sizes)  # stocks in no group or a small one: shrunk toward the cross-section
    in_group = g >= 0
    in_group[in_group] = sizes[g[in_group]] >= MIN_GROUP
    g = np.where(in_group, g, rest)[ok]
    x = var[ok]
    count = np.bincount(g, minlength=rest + 1)
    mean = np.bincount(g, weights=x, minlength=rest + 1) / np.maximum(count, 1)
    mean[rest] = x.mean()
    n_i = evidence[ok]
    n0 = params.prior_obs
    post = (n_i * x + n0 * mean[g]) / (n_i + n0) if n0 > 0 else x
    out[ok] = np.maximum(post, params.floor**2)
    return out

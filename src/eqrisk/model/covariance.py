"""The factor covariance F of the risk model: EWMA moments of the factor returns (the ETF or
group series the cascade hedges with), volatilities and correlations with separate half-lives,
optional Newey-West terms, positive semi-definite on every session. Pure: arrays in, arrays out.

Conventions (docs/decisions/risk-forecast.md):
- F[t] is the forecast for session t's returns: it uses factor returns up to t-1 only.
- Moments are zero-mean EWMA means, the weights of pandas' `ewm(halflife=h).mean()` (adjust,
  absolute positions): a missing return skips its day but still ages the others. Each moment is
  the mean of a product over the days both of its returns exist.
- Volatility of factor k: sqrt(V_k), V_k the EWMA mean of f_k^2 with the volatility half-life.
  Correlation of j and k, with the correlation half-life, over the days both exist:
  sum w f_j f_k / sqrt(sum w f_j^2 sum w f_k^2) (within [-1, 1] whatever the two spans, so that a
  factor listed years after the others does not meet their older days); F_jk = rho_jk s_j s_k.
- Newey-West (`nw_lags` L > 0, Bartlett weights c_l = 1 - l / (L + 1)): V_k becomes
  V_k + 2 sum_l c_l A_k,l with A_k,l the EWMA mean of f_k,t f_k,t-l: the per-session variance of
  a multi-session sum, for forecasts over a horizon. Correlations keep their lag-0 value.
- Positive definite: where pairwise correlations over different spans are not jointly
  (a factor listed years after the others), the late factor's correlations shrink just enough
  (`psd.make_positive_definite`); untouched otherwise.

The recursion is resumable: `CovarianceState` after session T-1, given back with the answer,
continues with session T, and the result equals one run over all sessions bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from eqrisk.model.psd import make_positive_definite


def decay(halflife: float) -> float:
    """Per-session decay factor of EWMA weights with this half-life (pandas' 1 - alpha)."""
    if not halflife > 0:
        raise ValueError(f"a half-life must be positive; got {halflife}")
    return float(0.5 ** (1.0 / halflife))


def bartlett(nw_lags: int) -> np.ndarray:
    """Newey-West weights of lags 1..L: 1 - l / (L + 1)."""
    return 1.0 - np.arange(1, nw_lags + 1) / (nw_lags + 1.0)


@dataclass(frozen=True)
class CovarianceParams:
    """How F is estimated: half-lives in sessions, Newey-West lags, observations needed."""

    vol_halflife: float = 42.0
    corr_halflife: float = 504.0
    nw_lags: int = 0
    min_obs: int = 63
    # Correlations of the returns each divided by its own volatility forecast for that session
    # (made before it, from the sums up to the day before), not of the raw returns: every day
    # weighs by its decay alone, not also by how volatile it was (docs/decisions/risk-forecast.md)
    corr_standardised: bool = False

    def __post_init__(self) -> None:
        decay(self.vol_halflife)
        decay(self.corr_halflife)
        if self.nw_lags < 0 or self.min_obs < 2:
            raise ValueError("nw_lags must be >= 0 and min_obs >= 2")


@dataclass
class OwnMoments:
    """EWMA sums of f_k,t f_k,t-l for lags 0..L and their weight sums; lag-0 day counts."""

    sums: np.ndarray  # (L+1, K)
    weights: np.ndarray  # (L+1, K)
    count: np.ndarray  # (K,)

    @classmethod
    def empty(cls, lags: int, k: int) -> OwnMoments:
        return cls(np.zeros((lags + 1, k)), np.zeros((lags + 1, k)), np.zeros(k))

    def copy(self) -> OwnMoments:
        return OwnMoments(self.sums.copy(), self.weights.copy(), self.count.copy())


@dataclass
class PairMoments:
    """EWMA sums over the days both of a pair exist: f_j f_k (`cross`), f_j^2 (`own`, row j
    column k) and the number of such days. The weights cancel in a correlation."""

    cross: np.ndarray  # (K, K)
    own: np.ndarray  # (K, K)
    count: np.ndarray  # (K, K)

    @classmethod
    def empty(cls, k: int) -> PairMoments:
        return cls(np.zeros((k, k)), np.zeros((k, k)), np.zeros((k, k)))

    def copy(self) -> PairMoments:
        return PairMoments(self.cross.copy(), self.own.copy(), self.count.copy())


@dataclass
class CovarianceState:
    """Everything the recursion carries from one session to the next: resume with it."""

    session: int  # the next session to process
    vol: OwnMoments
    corr: PairMoments
    lagged: np.ndarray = field(repr=False)  # (L, K): returns of sessions session-1 .. session-L
    # (K,): EWMA sums (volatility half-life, the weights of `vol`) of each session's estimation
    # noise variance, for the signal share; None until a run with noise
    noise: np.ndarray | None = None

    @classmethod
    def empty(cls, k: int, params: CovarianceParams) -> CovarianceState:
        lags = params.nw_lags
        return cls(
            0,
            OwnMoments.empty(lags, k),
            PairMoments.empty(k),
            np.full((lags, k), np.nan),
        )

    def copy(self) -> CovarianceState:
        noise = None if self.noise is None else self.noise.copy()
        return CovarianceState(
            self.session, self.vol.copy(), self.corr.copy(), self.lagged.copy(), noise
        )

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Plain arrays, to store beside a snapshot."""
        noise = {} if self.noise is None else {"noise": self.noise}
        return noise | {
            "session": np.array([self.session]),
            "vol_sums": self.vol.sums,
            "vol_weights": self.vol.weights,
            "vol_count": self.vol.count,
            "corr_cross": self.corr.cross,
            "corr_own": self.corr.own,
            "corr_count": self.corr.count,
            "lagged": self.lagged,
        }

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray]) -> CovarianceState:
        return cls(
            int(a["session"][0]),
            OwnMoments(a["vol_sums"].copy(), a["vol_weights"].copy(), a["vol_count"].copy()),
            PairMoments(a["corr_cross"].copy(), a["corr_own"].copy(), a["corr_count"].copy()),
            a["lagged"].copy(),
            a["noise"].copy() if "noise" in a else None,
        )


@dataclass(frozen=True)
class FactorCovariance:
    """F per forecast session: `cov[t - start]` is the forecast of session t (data <= t-1)."""

    start: int
    cov: np.ndarray  # (T - start, K, K), NaN rows/columns where a factor has too few days
    vol: np.ndarray  # (T - start, K): sqrt of the diagonal
    obs: np.ndarray  # (T - start, K): returns of each factor up to t-1
    clipped: np.ndarray  # (T - start,) bool: the correlation matrix was clipped to be PSD
    state: CovarianceState  # after the last session: resume with it
    # (T - start, K): with `noise`, each factor's signal share kappa = (V - N) / V of its EWMA
    # second moment V and estimation-noise variance N up to t-1 (1 without noise)
    signal: np.ndarray | None = None


def factor_covariance(
    factor_returns: np.ndarray,
    params: CovarianceParams,
    *,
    state: CovarianceState | None = None,
    noise: np.ndarray | None = None,
) -> FactorCovariance:
    """F for sessions state.session .. T-1 (all of them without a state) of `factor_returns`
    (K x T, NaN = no return); the new state continues with session T. `noise` ((T - start) x
    K x K): the part of each session's second moments that is estimation error (factors
    estimated by a regression), taken out of the sums as the session joins them."""
    f = np.asarray(factor_returns, dtype=np.float64)
    k, n_t = f.shape
    st = CovarianceState.empty(k, params) if state is None else state.copy()
    if st.vol.count.shape != (k,) or st.lagged.shape != (params.nw_lags, k):
        raise ValueError("the state is of another factor set or another number of lags")
    if not 0 <= st.session <= n_t:
        raise ValueError(f"the state's session {st.session} is outside 0..{n_t}")
    start = st.session
    lam_v, lam_c = decay(params.vol_halflife), decay(params.corr_halflife)
    nw = bartlett(params.nw_lags)
    cov = np.full((n_t - start, k, k), np.nan)
    vol = np.full((n_t - start, k), np.nan)
    obs = np.zeros((n_t - start, k))
    signal = None if noise is None else np.ones((n_t - start, k))
    if noise is not None and st.noise is None:
        st.noise = np.zeros(k)
    from eqrisk.model.risk_kernel import covariance_kernel  # numba: builds only

    assert st.noise is not None or noise is None
    covariance_kernel(
        np.ascontiguousarray(f), start, lam_v, lam_c, nw, params.min_obs, params.corr_standardised,
        np.zeros((1, 1, 1)) if noise is None else np.ascontiguousarray(noise, dtype=np.float64),
        noise is not None, st.vol.sums, st.vol.weights, st.vol.count, st.corr.cross,
        st.corr.own, st.corr.count, st.lagged,
        np.zeros(k) if st.noise is None else st.noise, cov, vol, obs,
        np.ones((1, 1)) if signal is None else signal,
    )  # fmt: skip
    st.session = n_t
    clipped = _make_psd(cov, vol, obs)
    return FactorCovariance(start, cov, vol, obs, clipped, st, signal)


def signal_share(corrected: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """kappa = (V - N) / V per factor from the EWMA sums of its second moment net of the noise
    (V - N) and of the noise (N), clipped to [0, 1]; 1 where there is no noise or no moment."""
    total = corrected + noise
    with np.errstate(invalid="ignore", divide="ignore"):
        kappa = np.clip(corrected / total, 0.0, 1.0)
    out: np.ndarray = np.where((noise > 0) & (total > 0), kappa, 1.0)
    return out


def _make_psd(cov: np.ndarray, vol: np.ndarray, obs: np.ndarray) -> np.ndarray:
    """Make, in place, each session's correlation matrix of its usable factors positive
    definite (`psd.make_positive_definite`: only a late factor's correlations shrink); the
    sessions it changed. Sessions with the same usable factors are done together."""
    clipped = np.zeros(len(cov), dtype=bool)
    patterns, which = np.unique(np.isfinite(vol), axis=0, return_inverse=True)
    for p, pattern in enumerate(patterns):
        keep = np.flatnonzero(pattern)
        days = np.flatnonzero(which.ravel() == p)
        if len(keep) < 2:
            continue
        s = vol[np.ix_(days, keep)]
        scale = s[:, :, None] * s[:, None, :]
        rho = cov[np.ix_(days, keep, keep)] / scale
        changed = make_positive_definite(rho, obs[np.ix_(days, keep)])
        if changed.any():
            cov[np.ix_(days[changed], keep, keep)] = rho[changed] * scale[changed]
            clipped[days[changed]] = True
    return clipped

"""The covariance forecast on the ETF hierarchy: Sigma_t = H_t F_t H_t' + D_t for every session t,
from data up to t-1 only. Pure: arrays in, arrays out.

- Factors: the published factor rows of the layout (market, sector and subsector ETFs, or
  group portfolios where the data has no ETF).
- Exposures H_t: a stock's hedge ratios at the model's level (L3 by default) published on
  session t-1, on its own market, sector and subsector factors, so that selling those ETFs in
  those amounts removes exactly that exposure. Where the level is not published that day, the
  deepest level above it that is (L2, then L1). A row that is itself a factor series (SPY, XLK
  ...) has exposure 1 to that factor and no specific risk.
- Specific returns: r_t - sum_j H_t,j f_t,j: the return left after the previous session's
  hedge, which is the cascade's `lk_rr` of the level used (bit for bit where the factors are
  ETFs; a stock in a group portfolio is regressed on its group without itself, `lk_rr` uses
  that row while the risk model uses the published group, a difference of one member's weight).
- F: `covariance.factor_covariance`; D: `specific.specific_variance` on those specific returns,
  grouped by sector unless the caller gives groups (size bands, say).

`risk_model(..., state=...)` resumes at `state.session` and gives the same numbers bit for bit
as one run over every session.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from eqrisk.model.covariance import CovarianceParams, CovarianceState, FactorCovariance
from eqrisk.model.covariance import factor_covariance as estimate_factor_covariance
from eqrisk.model.regime import (
    Regime,
    RegimeParams,
    RegimeState,
    bias_squared,
    regime_multipliers,
)
from eqrisk.model.run import LEVEL_HR
from eqrisk.model.specific import SpecificParams, SpecificState, SpecificVariance
from eqrisk.model.specific import specific_variance as estimate_specific_variance
from eqrisk.model.style_regression import (
    StyleInputs as StyleInputs,  # re-exported: the callers of risk_model import it here
)
from eqrisk.model.style_regression import (
    StyleReturns,
    cap_before,
    estimation_noise,
    leverage_adjusted,
    second_layer,
)
from eqrisk.model.styles import STYLE_TEXT, StyleParams

ANNUALIZATION = np.sqrt(252.0)
LEVEL_NAMES = ("market", "sector", "subsector")
# The level of the second-layer factors in `factor_level` ("style"; the portfolio answer does
# not split it out yet: docs/decisions/risk-forecast.md, the second layer).
STYLE_LEVEL = 4
MIN_SIGNAL = 0.01  # a second-layer factor with a smaller signal share has no forecast


@dataclass(frozen=True)
class RiskParams:
    """The risk model's settings: the hedge level of the exposures, F's and D's estimators."""

    level: int = 3
    covariance: CovarianceParams = field(default_factory=CovarianceParams)
    specific: SpecificParams = field(default_factory=SpecificParams)
    styles: StyleParams | None = None  # the second factor layer (None: the ETF layer only)
    regime: RegimeParams | None = None  # the volatility regime adjustment (None: none)

    @classmethod
    def served(cls) -> RiskParams:
        """Both layers, regime, standardised correlations (docs/decisions/risk-forecast.md)."""
        styles, regime = StyleParams.calibrated(), RegimeParams.calibrated()
        return cls(
            covariance=CovarianceParams(corr_standardised=True), styles=styles, regime=regime
        )

    def __post_init__(self) -> None:
        if self.level not in LEVEL_HR:
            raise ValueError(f"level must be 1, 2 or 3; got {self.level}")

    def describe(self) -> dict[str, Any]:
        c, s = self.covariance, self.specific
        return {
            "exposures": f"L{self.level} hedge ratios of the previous session",
            "factor_vol_halflife": c.vol_halflife,
            "factor_corr_halflife": c.corr_halflife,
            "factor_corr_standardised": c.corr_standardised,
            "factor_min_obs": c.min_obs,
            "specific_halflife": s.halflife,
            "specific_min_obs": s.min_obs,
            "specific_prior_obs": s.prior_obs,
            "specific_floor_daily": s.floor,
            "newey_west_lags": c.nw_lags,
            "style_factors": None
            if self.styles is None
            else {
                name: STYLE_TEXT.get(name, "cross-sectional mean of the L3 residuals")
                for name in self.styles.factor_names
            },
            "regime_adjustment": None
            if self.regime is None
            else {
                "factor_halflife": self.regime.factor_halflife,
                "specific_halflife": self.regime.specific_halflife,
                "long_halflife": self.regime.long_halflife,
                "limit": self.regime.limit,
                "power": self.regime.power,
                "debias": self.regime.debias,
            },
        } | ({} if self.styles is None else {
            "style_shrink_power": self.styles.shrink_power if self.styles.shrink else None,
            "specific_leverage_adjusted": self.styles.leverage,
        })  # fmt: skip


@dataclass(frozen=True)
class RiskState:
    """Where a run stopped: resume `risk_model` with it for the sessions after."""

    covariance: CovarianceState
    specific: SpecificState
    regime: RegimeState | None = None

    @property
    def session(self) -> int:
        return self.covariance.session

    def moved(self, by: int) -> RiskState:
        """This state with its sessions counted `by` further (negative: from a later first
        column): how a run over the columns [c, T) of the arrays resumes it (`by` = -c), and
        how its answer's state is put back (`by` = c). The sums do not depend on the origin."""
        covariance = self.covariance.copy()
        covariance.session += by
        specific = self.specific.copy()
        specific.session += by
        regime = None if self.regime is None else self.regime.copy()
        if regime is not None:
            regime.session += by
        return RiskState(covariance, specific, regime)


@dataclass(frozen=True)
class Exposures:
    """Each row's factors and exposures per forecast session."""

    index: np.ndarray  # (n, 3) factor row of the market, sector, subsector slot; -1 = none
    values: np.ndarray  # (3, n, T - start): hedge of t-1 (0 in an unused slot, NaN = none)
    level: np.ndarray  # (n, T - start) int8: level of the hedge used, 0 = none
    # (S, n, T - start): second-layer exposures (factor rows K .. K + S - 1), 0 = none
    style: np.ndarray | None = None


def factor_levels(factor_index: np.ndarray, n_factors: int) -> np.ndarray:
    """The level (1 market, 2 sector, 3 subsector) of each factor row: the first column of the
    layout's factor index it appears in (0 for a row no symbol uses)."""
    level = np.zeros(n_factors, dtype=np.int64)
    for j in (2, 1, 0):
        rows = factor_index[:, j]
        level[rows[rows >= 0]] = j + 1
    return level


def hedge_exposures(
    hedge_ratios: Mapping[str, np.ndarray],
    factor_index: np.ndarray,
    own_factor: np.ndarray,
    level: int,
    start: int = 0,
    n_t: int | None = None,
) -> Exposures:
    """Exposures of sessions start..T-1 from the published hedge ratios (n x T each, the
    `lk_*_hr` fields; columns start-1 .. T-1 are read). `own_factor` (n,): the factor row each
    row is (-1 for a stock). With `n_t` = T, the hedge ratios may hold their last columns only
    (those read, at least)."""
    n, width = next(iter(hedge_ratios.values())).shape
    n_t = width if n_t is None else n_t
    skip = n_t - width  # the sessions before the arrays' first column (never read)
    if skip < 0 or max(start, 1) - 1 < skip:
        raise ValueError(f"the hedge ratios hold {width} of {n_t} sessions, from start-1 on")
    index = np.where(own_factor[:, None] >= 0, -1, factor_index).astype(np.int64)
    index[own_factor >= 0, 0] = own_factor[own_factor >= 0]
    values = np.full((3, n, n_t - start), np.nan)
    used = np.zeros((n, n_t - start), dtype=np.int8)
    lo = max(start, 1)
    # The deepest level a row has a factor at (no subsector ETF: 2; market only: 1): its
    # hedge "at level 3" is its level-2 hedge, and is reported as such. A level below it
    # holds no factor, so the numbers are the same either way.
    has = index >= 0
    depth = np.select([has[:, 2], has[:, 1], has[:, 0]], [3, 2, 1], default=3).astype(np.int8)
    for lev in range(level, 0, -1):
        names = LEVEL_HR[lev]
        prev = [hedge_ratios[name][:, lo - 1 - skip : n_t - 1 - skip] for name in names]
        ok = np.ones((n, n_t - lo), dtype=bool)
        for j, hr in enumerate(prev):
            ok &= np.isfinite(hr) | (index[:, j] < 0)[:, None]
        take = ok & (used[:, lo - start :] == 0)
        for j in range(3):
            slot = values[j, :, lo - start :]
            source = prev[j] if j < len(prev) else np.zeros((n, n_t - lo))
            # A slot the row has no factor for (or the level does not reach) holds 0.
            source = np.where((index[:, j] >= 0)[:, None] & (j < lev), source, 0.0)
            np.copyto(slot, source, where=take)
        np.copyto(used[:, lo - start :], np.minimum(depth, lev)[:, None], where=take)
    own = own_factor >= 0
    values[:, own] = 0.0
    values[0, own] = 1.0
    used[own] = 1
    return Exposures(index=index, values=values, level=used)


def specific_returns(
    returns: np.ndarray, factor_returns: np.ndarray, exposures: Exposures, start: int = 0
) -> np.ndarray:
    """r_t - sum_j H_t,j f_t,j for sessions start..T-1 (the cascade's order of operations,
    so that it equals `lk_rr` bit for bit where the factors are the published rows)."""
    r = returns[:, start:]
    total = np.zeros(r.shape)
    level = exposures.level
    for j in range(3):
        idx = exposures.index[:, j]
        has = idx >= 0
        # Only the slots of the level used: a slot below it holds 0, whose product with a
        # missing factor return (an ETF not listed yet) would be NaN.
        term = exposures.values[j, has] * factor_returns[idx[has], start:]
        total[has] += np.where(level[has] > j, term, 0.0)
    total[level == 0] = np.nan
    out: np.ndarray = r - total
    return out


def served_factors(cov: np.ndarray, n_etf: int) -> np.ndarray:
    """(K,) bool: the factors of a session's F (K x K) its answers carry: every first-layer
    factor (an ETF with too few returns yet has a row of NaN, and the stocks it hedges no
    forecast) and the second-layer factors with a forecast that session. A style factor without
    one weighs nothing (its exposures are 0): it is left out of F, H and the portfolio's factors
    that session (docs/decisions/risk-forecast.md)."""
    out: np.ndarray = np.isfinite(np.diag(cov))
    out[:n_etf] = True
    return out


@dataclass(frozen=True)
class RiskModelDay:
    """The model of one forecast session: what a portfolio's risk needs."""

    session: int
    symbols: np.ndarray  # (n,)
    factor_keys: list[str]  # (K,)
    factor_level: np.ndarray  # (K,)
    cov: np.ndarray  # (K, K)
    index: np.ndarray  # (n, 3) factor rows of the slots used that session, -1 = none
    values: np.ndarray  # (n, 3) exposures (0 in a slot not used)
    level: np.ndarray  # (n,) level of the hedge used, 0 = no exposures
    specific_var: np.ndarray  # (n,)
    # (n, S): exposures to the second-layer factors, the last S rows of `cov` (0 = none)
    style: np.ndarray | None = None

    @property
    def n_etf(self) -> int:
        """The first-layer (ETF hierarchy) factors: the first rows of `cov`."""
        return len(self.factor_keys) - (0 if self.style is None else self.style.shape[1])

    @cached_property
    def row_of(self) -> dict[str, int]:
        return {str(s): i for i, s in enumerate(self.symbols.tolist())}

    @cached_property
    def served(self) -> np.ndarray:
        """(K,) bool: the factors this session's answers carry (`served_factors`)."""
        return served_factors(self.cov, self.n_etf)

    @cached_property
    def usable(self) -> np.ndarray:
        """(n,) bool: the rows with a forecast this session."""
        factor_ok = np.isfinite(np.diag(self.cov))
        slots_ok = (self.index < 0) | factor_ok[np.clip(self.index, 0, None)]
        ok: np.ndarray = (self.level > 0) & slots_ok.all(axis=1) & np.isfinite(self.specific_var)
        return ok

    @cached_property
    def problems(self) -> list[str | None]:
        """Why each row has no forecast this session (None: it has one)."""
        factor_ok = np.isfinite(np.diag(self.cov))
        out: list[str | None] = []
        for i in range(len(self.symbols)):
            idx = self.index[i]
            if self.level[i] == 0:
                out.append("no hedge ratios published for the previous session")
            elif not all(factor_ok[j] for j in idx.tolist() if j >= 0):
                out.append("too few returns of its ETFs for their covariance")
            elif not np.isfinite(self.specific_var[i]):
                out.append("too few out-of-sample residual returns for its specific risk")
            else:
                out.append(None)
        return out


@dataclass(frozen=True)
class RiskModel:
    """The risk model of sessions start..T-1 (arrays hold those sessions only)."""

    start: int
    symbols: np.ndarray
    factor_keys: list[str]
    factor_level: np.ndarray
    exposures: Exposures
    factor_cov: FactorCovariance
    specific: SpecificVariance
    params: RiskParams
    style: StyleReturns | None = None  # the second layer's regression (sessions start..T-1)
    regime: Regime | None = None

    @property
    def n_etf(self) -> int:
        return len(self.factor_keys) - (
            0 if self.exposures.style is None else len(self.exposures.style)
        )

    @property
    def state(self) -> RiskState:
        regime = None if self.regime is None else self.regime.state
        return RiskState(self.factor_cov.state, self.specific.state, regime)

    def day(self, t: int) -> RiskModelDay:
        """The model of forecast session t (an index of the whole calendar)."""
        k = t - self.start
        if not 0 <= k < self.factor_cov.cov.shape[0]:
            raise IndexError(
                f"session {t} is outside {self.start}..{self.factor_cov.state.session}"
            )
        level = self.exposures.level[:, k]
        # Only the slots of the level used that session.
        index = np.where(level[:, None] > np.arange(3)[None, :], self.exposures.index, -1)
        return RiskModelDay(
            session=t,
            symbols=self.symbols,
            factor_keys=self.factor_keys,
            factor_level=self.factor_level,
            cov=self.factor_cov.cov[k],
            index=index,
            values=np.where(index >= 0, self.exposures.values[:, :, k].T, 0.0),
            level=level,
            specific_var=self.specific.var[:, k],
            style=None if self.exposures.style is None else self.exposures.style[:, :, k].T,
        )

    @cached_property
    def factor_var(self) -> np.ndarray:
        """(n, T - start): h' F h of each row and session over the slots of the level used
        (NaN where the row has no exposures or a factor of it no covariance)."""
        from eqrisk.model.risk_kernel import factor_var_kernel, parallel_blocks  # numba: builds

        ex = self.exposures
        out = np.empty(ex.level.shape)
        style = np.zeros((0, 0, 0)) if ex.style is None else ex.style
        factor_var_kernel(
            ex.index, ex.values, ex.level, self.factor_cov.cov, style, self.n_etf, out,
            parallel_blocks(len(out)),
        )  # fmt: skip
        return out

    @cached_property
    def predicted(self) -> dict[str, np.ndarray]:
        """Per row and session, daily volatilities: total, factor and specific (NaN where the
        row has no forecast)."""
        factor = self.factor_var
        spec = self.specific.var
        total = factor + spec
        return {
            "risk_total_vol": np.sqrt(total),
            "risk_factor_vol": np.sqrt(np.where(np.isfinite(total), factor, np.nan)),
            "risk_specific_vol": np.sqrt(np.where(np.isfinite(total), spec, np.nan)),
        }


def shrink_styles(cov: FactorCovariance, k0: int, power: float = 1.0) -> None:
    """Scale, in place, the rows and columns of the second-layer factors (k0 on) of every
    session's F by sqrt(kappa), kappa the factor's signal share (`FactorCovariance.signal`): its
    variance becomes kappa (V - N) = kappa^2 V, the variance of its return shrunk toward zero by
    kappa (James-Stein), correlations unchanged. A factor whose return is mostly estimation
    noise weighs almost nothing; one with a clear signal (kappa near 1) is left as it was. The
    positive-part estimate V - N alone is biased up where it is small (its negative draws have
    no forecast, its positive ones are kept); its square over V is not, but leaves out the
    posterior variance kappa N. `power` p scales by kappa^(p / 2) instead: variance
    kappa^p (V - N), between the two."""
    if cov.signal is None:
        return
    a = np.ones(cov.signal.shape)
    a[:, k0:] = cov.signal[:, k0:] ** (0.5 * power)
    # Below MIN_SIGNAL a factor has no forecast that session (its exposures weigh 0), as one
    # whose V - N is not positive: its variance would be numerically 0 and F singular.
    a[:, k0:][cov.signal[:, k0:] < MIN_SIGNAL] = np.nan
    cov.cov[:] *= a[:, :, None] * a[:, None, :]
    cov.vol[:] *= a


def _check(params: RiskParams, state: RiskState | None, style_inputs: StyleInputs | None) -> int:
    """The first session to run (`state.session`, 0 without a state), once the state and the
    settings agree."""
    start = 0 if state is None else state.session
    if state is not None and state.specific.session != start:
        raise ValueError("the state's factor and specific parts stop at different sessions")
    if params.styles is not None and style_inputs is None:
        raise ValueError("a model with style factors needs the caps (style_inputs)")
    if state is not None and (params.regime is None) != (state.regime is None):
        raise ValueError("the state and the settings disagree on the regime adjustment")
    return start


@dataclass(frozen=True)
class _Layers:
    """The factors of both layers: keys, levels, returns (K + S, T), the second layer's
    exposures and regression (None without it) and the specific returns after both."""

    keys: list[str]
    levels: np.ndarray
    returns: np.ndarray
    resid: np.ndarray
    style: np.ndarray | None = None
    regression: StyleReturns | None = None
    # `_session_major` of the style exposures and the regression weights (`estimation_noise`)
    session_major: tuple[np.ndarray, np.ndarray] | None = None


def _layers(
    returns: np.ndarray,
    factor_returns: np.ndarray,
    factor_index: np.ndarray,
    factor_keys: list[str],
    resid: np.ndarray,
    params: RiskParams,
    style_inputs: StyleInputs | None,
    start: int,
) -> _Layers:
    levels = factor_levels(factor_index, len(factor_keys))
    if params.styles is None or style_inputs is None:
        return _Layers(list(factor_keys), levels, factor_returns, resid)
    layer = second_layer(
        returns, factor_returns, factor_index, resid, params.styles, style_inputs, start
    )
    regression = layer.regression
    names = params.styles.factor_names
    g = np.full((len(names), returns.shape[1]), np.nan)
    g[:, start:] = regression.returns
    return _Layers(
        [*factor_keys, *names],
        np.concatenate([levels, np.full(len(names), STYLE_LEVEL)]),
        np.vstack([factor_returns, g]),
        regression.residuals,
        layer.exposures,
        regression,
        layer.session_major,
    )


def _noise(
    layers: _Layers,
    k0: int,
    params: StyleParams,
    inputs: StyleInputs,
    specific_var: np.ndarray,
    start: int,
) -> np.ndarray | None:
    """(T - start, K + S, K + S): each session's estimation noise of the second layer's factor
    returns (0 in the ETF rows), to take out of F's sums; None where not asked for."""
    if layers.style is None or layers.regression is None or not params.noise:
        return None
    k_all = len(layers.keys)
    noise = np.zeros((layers.returns.shape[1] - start, k_all, k_all))
    noise[:, k0:, k0:] = estimation_noise(
        layers.style,
        cap_before(inputs.cap, start),
        layers.regression,
        specific_var,
        params.weight_power,
        session_major=layers.session_major,
    )
    return noise


def _adjust_regime(
    cov: FactorCovariance,
    spec: SpecificVariance,
    factor_returns: np.ndarray,
    spec_resid: np.ndarray,
    params: RegimeParams,
    state: RegimeState | None,
    start: int,
) -> Regime:
    """Scale, in place, F and D by the regime multipliers of their recent bias. The factor
    regime is read from the first layer's factors, whose returns are observed (a second-layer
    return is an estimate; a weak one's tiny variance would dominate)."""
    k0 = len(factor_returns)
    diag = np.diagonal(cov.cov, axis1=1, axis2=2).T[:k0]
    regime = regime_multipliers(
        bias_squared(factor_returns[:, start:], diag, params.limit),
        bias_squared(spec_resid, spec.var, params.limit),
        params,
        state=state,
    )
    cov.cov[:] *= regime.factor[:, None, None]
    cov.vol[:] *= np.sqrt(regime.factor)[:, None]
    spec.var[:] *= regime.specific[None, :]
    return regime


def risk_model(
    returns: np.ndarray,
    factor_returns: np.ndarray,
    factor_index: np.ndarray,
    factor_keys: list[str],
    symbols: np.ndarray,
    hedge_ratios: Mapping[str, np.ndarray],
    params: RiskParams,
    *,
    groups: np.ndarray | None = None,
    state: RiskState | None = None,
    style_inputs: StyleInputs | None = None,
) -> RiskModel:
    """The risk model of every session from `state.session` on (all of them without a state).

    `returns` (n x T), `factor_returns` (K x T, the layout's published rows), `factor_index`
    (n x 3, into them), `hedge_ratios`: the cascade's `lk_*_hr` fields (n x T, or their last
    columns from the session before the first forecast one: `hedge_exposures`). `groups` (n,) or
    (n x T): each row's shrinkage group for D, default its sector factor row. With
    `params.styles`, `style_inputs` (caps, turnover) and the sessions' history before `start`
    (StyleParams.history) in the arrays: the second layer's factors follow the K ETF-layer ones.
    """
    start = _check(params, state, style_inputs)
    own = np.array([factor_keys.index(s) if s in factor_keys else -1 for s in symbols.tolist()])
    n_t = returns.shape[1]
    exposures = hedge_exposures(hedge_ratios, factor_index, own, params.level, start, n_t)
    resid = specific_returns(returns, factor_returns, exposures, start)
    resid[own >= 0] = np.nan  # a factor's own row has no specific risk, and joins no group
    layers = _layers(
        returns, factor_returns, factor_index, factor_keys, resid, params, style_inputs, start
    )
    if groups is None:
        groups = factor_index[:, 1]
    spec_resid = layers.resid
    if layers.regression is not None and params.styles is not None and params.styles.leverage:
        spec_resid = leverage_adjusted(layers.resid, layers.regression)
    spec = estimate_specific_variance(
        spec_resid,
        groups if groups.ndim == 1 else groups[:, start:],
        params.specific,
        state=None if state is None else state.specific,
        first_column=start,
    )
    spec.var[own >= 0] = 0.0
    k0 = len(factor_keys)
    noise = None
    if params.styles is not None and style_inputs is not None:
        noise = _noise(layers, k0, params.styles, style_inputs, spec.var, start)
    cov = estimate_factor_covariance(
        layers.returns,
        params.covariance,
        state=None if state is None else state.covariance,
        noise=noise,
    )
    if layers.style is not None and params.styles is not None and params.styles.shrink:
        shrink_styles(cov, k0, params.styles.shrink_power)
    if layers.style is not None:
        # A second-layer factor weighs nothing in a session before it has a covariance.
        ready = np.isfinite(np.diagonal(cov.cov, axis1=1, axis2=2)[:, k0:])
        # In place: the layers' exposures are not read after this (`_noise` has run).
        style = np.nan_to_num(layers.style, copy=False)
        np.copyto(style, 0.0, where=~ready.T[:, None, :])
        exposures = Exposures(exposures.index, exposures.values, exposures.level, style)
    regime: Regime | None = None
    if params.regime is not None:
        regime = _adjust_regime(
            cov, spec, factor_returns, spec_resid, params.regime,
            None if state is None else state.regime, start,
        )  # fmt: skip
    return RiskModel(
        start=start,
        symbols=symbols,
        factor_keys=layers.keys,
        factor_level=layers.levels,
        exposures=exposures,
        factor_cov=cov,
        specific=spec,
        params=params,
        style=layers.regression,
        regime=regime,
    )

"""The whole risk model over a panel: returns, volatility, the L3 cascade, combined factor and
residual returns per level, and Service A's flat market + sector factor model. Pure: arrays in,
arrays out, no I/O.

A run has two halves: `plan_model` does what needs the whole universe (returns, the factor
layout, the flat model's factors: small series every row is hedged with), and `run_block` does
the per-symbol work on a block of rows, given those series. The local build runs the blocks in
this process; the Dask build (eqrisk.build.distributed) runs the same function on workers.
A full build computes the plan one slice of sessions at a time instead (`plan_slices`: the
same numbers, bit for bit, without a universe-sized array).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any, Protocol

import numpy as np
import pandas as pd

from eqrisk.data.panel import Panel
from eqrisk.model.cascade import CASCADE_FIELDS, rolling_cascade, rolling_std
from eqrisk.model.flat_own import flat_betas, own_sector_factors
from eqrisk.model.layout import FactorLayout, LayoutKeys, factor_layout, hierarchy
from eqrisk.model.quality import hedge_quality
from eqrisk.model.rank_kernel import rank_kernel
from eqrisk.model.returns import log_returns, simple_returns

ANNUALIZATION = np.sqrt(252.0)
VOL_SHORT_WINDOW = 23
VOL_SHORT_MIN_OBS = 16
MARKET_FACTOR = "Mkt"
LEVEL_HR = {
    1: ("l1_mkt_hr",),
    2: ("l2_mkt_hr", "l2_sec_hr"),
    3: ("l3_mkt_hr", "l3_sec_hr", "l3_sub_hr"),
}


@dataclass(frozen=True)
class ModelParams:
    """Estimation settings, reported with every answer as `_metadata.method`."""

    window: int = 252
    min_obs: int = 126
    halflife: float | None = None

    def __post_init__(self) -> None:
        if self.min_obs > self.window:
            raise ValueError(f"min_obs ({self.min_obs}) cannot exceed window ({self.window})")

    @property
    def weighting(self) -> str:
        return "equal" if self.halflife is None else "ewma"

    def describe(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "min_obs": self.min_obs,
            "weighting": self.weighting,
            "halflife": self.halflife,
            "returns": "simple, consecutive sessions only",
            "vol_23d_min_obs": VOL_SHORT_MIN_OBS,
        }


class MetricArray(Protocol):
    """An (n x T) float64 field of a result as the version's writer reads it: a dense array,
    or one an incremental build splices from its new sessions and the previous version's
    (`eqrisk.snapshot.spliced.Spliced`). It indexes, slices and converts (`np.asarray`)."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    def __getitem__(self, key: Any, /) -> Any: ...

    def __array__(self, dtype: Any = None, /, *, copy: Any = None) -> np.ndarray: ...


@dataclass
class ModelResult:
    """Per-symbol metric arrays (n x T) plus the factor series and each symbol's hierarchy."""

    symbols: np.ndarray
    sessions: np.ndarray
    metrics: dict[str, MetricArray]
    # The series each symbol is hedged with: market/sector/subsector names ("SPY", "XLK", or
    # "group:<level>:<name>" for a cap-weighted group portfolio where the data has no ETF).
    hierarchy: pd.DataFrame
    flat: FlatModel
    factor_keys: list[str]  # name of each factor row (ETF symbol or group portfolio key)
    params: ModelParams
    # What the build did beyond the arithmetic (leave-one-out rows, caps given by the
    # missing-cap rule), for the build's output and the manifest.
    notes: dict[str, Any] = field(default_factory=dict)

    def arrays(self) -> dict[str, np.ndarray]:
        """The metrics as dense arrays, what the risk model and the evaluations compute on (a
        full build's as they are; a spliced field read whole)."""
        return {name: np.asarray(values) for name, values in self.metrics.items()}


@dataclass(frozen=True)
class SharedFactors:
    """What every block of rows needs, computed once for the universe and broadcast to the
    blocks: the published factor rows (ETF series, group portfolios) and the flat model's
    factor returns. Small (F x T and K x T), whatever the number of symbols."""

    factors: np.ndarray  # (F x T) published factor rows
    market: np.ndarray  # (T,) the flat model's Mkt factor
    flat_returns: np.ndarray  # (K x T) the flat model's factor returns
    params: ModelParams
    # Rows of `factors` that are published (the rest: leave-one-out rows, `in_process`);
    # None: every row.
    published: int | None = None


@dataclass(frozen=True)
class BlockInput:
    """One block of rows [start, stop): its returns, its own leave-one-out factor rows and its
    indexes into them; nothing of any other row, so a block's work is bounded by its size."""

    start: int
    stop: int
    returns: np.ndarray  # (b x T)
    own_factors: np.ndarray  # (L_b x T) leave-one-out rows of this block's stocks
    model_fidx: np.ndarray  # (b x 3) into [SharedFactors.factors; own_factors], -1 = none
    exposure: np.ndarray  # (b,) flat-model sector factor of each row, -1 = Mkt only


@dataclass(frozen=True)
class ModelPlan:
    """The universe-wide part of a model run (returns, factor layout, flat factors), from which
    blocks of rows are cut and to which their results are joined."""

    symbols: np.ndarray
    sessions: np.ndarray
    returns: np.ndarray  # (n x T) with the excluded returns null
    layout: FactorLayout
    flat: FlatFactors
    shared: SharedFactors
    panel: Panel  # the prices the metrics read straight off prices come from
    is_stock: np.ndarray  # (n,) rows the cap rank ranks
    returns_excluded: int

    @property
    def size(self) -> int:
        return len(self.symbols)

    @cached_property
    def price_metrics(self) -> dict[str, np.ndarray]:
        """The metrics read straight off prices (the cap rank: universe-wide), whole history;
        computed on first use: an incremental build needs only `price_metrics_from`."""
        return _price_metrics(self.panel, self.returns, self.is_stock)

    def price_metrics_from(self, start: int) -> dict[str, np.ndarray]:
        """`price_metrics` on sessions >= `start` only, bit for bit the same values: each is
        elementwise or, for the cap rank, per session."""
        if "price_metrics" in self.__dict__:
            return {name: arr[:, start:] for name, arr in self.price_metrics.items()}
        return _price_metrics(self.panel, self.returns, self.is_stock, start)

    def price_rows(self, start: int, stop: int) -> PriceRows:
        """The price inputs of rows [start, stop) (views, no copy)."""
        p = self.panel
        p.require("close_raw", "volume")
        return PriceRows(
            close=p.close[start:stop],
            close_raw=p.field("close_raw")[start:stop],
            volume=p.field("volume")[start:stop],
            market_cap=p.market_cap[start:stop],
            returns=self.returns[start:stop],
        )

    def cap_ranks(self) -> np.ndarray | None:
        """The cap rank of every row (universe-wide, so the one price metric no block can
        compute); None when no stock has a cap on any session (the rank is all NaN then)."""
        if "price_metrics" in self.__dict__:
            return self.price_metrics["mktcap_rank"]
        if not np.isfinite(self.panel.market_cap[self.is_stock]).any():
            return None
        return cap_rank(self.panel.market_cap, self.is_stock)

    def in_process(self) -> SharedFactors:
        """The shared series for blocks run in this process: every factor row of the layout,
        leave-one-out rows included, as they are (blocks from `block(..., own_rows=False)`
        index into them without a copy)."""
        return replace(
            self.shared, factors=self.layout.model_factors, published=len(self.layout.factors)
        )

    def block(self, start: int, stop: int, *, own_rows: bool = True) -> BlockInput:
        """Rows [start, stop) with only the leave-one-out rows they regress on (renumbered);
        without `own_rows`, indexes into `in_process()`'s rows instead."""
        published = self.shared.factors.shape[0]
        fidx = self.layout.model_fidx[start:stop]
        if not own_rows:
            return BlockInput(
                start=start,
                stop=stop,
                returns=self.returns[start:stop],
                own_factors=np.empty((0, self.returns.shape[1])),
                model_fidx=fidx,
                exposure=self.flat.exposure[start:stop],
            )
        own = np.unique(fidx[fidx >= published])
        local = fidx.copy()
        loo = local >= published
        local[loo] = published + np.searchsorted(own, local[loo])
        return BlockInput(
            start=start,
            stop=stop,
            returns=self.returns[start:stop],
            own_factors=self.layout.model_factors[own],
            model_fidx=local,
            exposure=self.flat.exposure[start:stop],
        )

    def blocks(self, rows: int) -> list[tuple[int, int]]:
        """The [start, stop) bounds of consecutive blocks of at most `rows` rows."""
        if rows < 1:
            raise ValueError(f"a block needs at least one row; got {rows}")
        return [(a, min(a + rows, self.size)) for a in range(0, self.size, rows)]


def plan_model(
    panel: Panel,
    master: pd.DataFrame,
    params: ModelParams,
    *,
    exclude: np.ndarray | None = None,
) -> ModelPlan:
    """Returns, the factor layout and the flat model's factors: what needs the whole universe.

    `exclude` (n x T bool) marks returns that are no returns (an unadjusted split found at
    ingest): they are null everywhere, as a missing price's are, so that one missing adjustment
    reaches neither the stock's hedge ratios nor its peers' group factors.
    """
    info = master.set_index("symbol").reindex(panel.symbols)
    is_stock = info["asset_type"].fillna("stock").to_numpy() == "stock"
    r = simple_returns(panel.close)
    if exclude is not None:
        r[exclude] = np.nan
    layout = factor_layout(panel, info, r)
    flat = flat_factors(
        layout.factors,
        layout.fidx,
        info["gics_sector"].to_numpy(dtype=object),
        info["factor_name"].to_numpy(dtype=object),
        params,
    )
    return ModelPlan(
        symbols=panel.symbols,
        sessions=panel.sessions,
        returns=r,
        layout=layout,
        flat=flat,
        shared=SharedFactors(
            factors=layout.factors, market=flat.market, flat_returns=flat.returns, params=params
        ),
        panel=panel,
        is_stock=is_stock,
        returns_excluded=int(exclude.sum()) if exclude is not None else 0,
    )


def _price_metrics(
    panel: Panel, r: np.ndarray, is_stock: np.ndarray, start: int = 0
) -> dict[str, np.ndarray]:
    """The metrics read straight off prices and returns, on sessions >= `start`: returns,
    close, cap and its rank (across the universe, so never in a block), turnover."""
    panel.require("close_raw", "volume")
    cap = panel.market_cap[:, start:]
    return row_price_metrics(
        PriceRows(
            close=panel.close[:, start:],
            close_raw=panel.field("close_raw", start),
            volume=panel.field("volume", start),
            market_cap=cap,
            returns=r[:, start:],
        ),
        cap_rank(cap, is_stock),
    )


@dataclass(frozen=True)
class PriceRows:
    """The price inputs of some rows (b x T each): what the metrics read straight off prices
    need, besides the cap rank (universe-wide)."""

    close: np.ndarray
    close_raw: np.ndarray
    volume: np.ndarray
    market_cap: np.ndarray
    returns: np.ndarray


def row_price_metrics(rows: PriceRows, rank: np.ndarray) -> dict[str, np.ndarray]:
    """The price metrics of some rows, in the published order, given their cap rank: every
    one but the rank is elementwise, so a block computes its own (a Dask worker does)."""
    traded = np.where(np.isnan(rows.close_raw), rows.close, rows.close_raw)
    return {
        "return": rows.returns,
        "log_return": log_returns(rows.returns),
        "price_close": rows.close,
        "market_cap": rows.market_cap,
        "mktcap_rank": rank,
        "turnover": traded * rows.volume,
    }


def join_metrics(
    block: dict[str, np.ndarray], price: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """The published order of a run's metrics: the cascade's, the price metrics, then the rest
    of `run_block`'s (volatility, level metrics, the flat model's)."""
    rest = dict(block)
    metrics = {name: rest.pop(name) for name in CASCADE_FIELDS}
    metrics.update(price)
    metrics.update(rest)
    return metrics


def run_block(shared: SharedFactors, block: BlockInput, *, start: int = 0) -> dict[str, np.ndarray]:
    """The per-symbol work on one block of rows: the cascade, volatility, level metrics and the
    flat model's betas and residuals. Every row depends on its own returns and the factor rows
    it is hedged with only, so blocks give the same numbers, bit for bit, as one whole run.

    With `start` > 0 (an incremental build's tail), the block's column 0 must be a
    re-anchoring point of the whole calendar (a multiple of the window) at least two windows
    before `start`: the arrays returned hold sessions t >= `start` only, bitwise those of a run
    over the whole calendar, and each series is computed from the point it needs (the cascade
    one window before the hedge quality's first window, the flat model one session before
    `start`), not from column 0. `vol_23d` is left out then: its 23-session anchors are not the
    window's, so the caller computes it on its own slice (`resume.run_from`)."""
    params = shared.params
    w = params.window
    r = block.returns
    if start and start < 2 * w:
        raise ValueError(f"a tail run starts two windows ({2 * w}) after column 0; got {start}")
    model_factors = (
        np.vstack([shared.factors, block.own_factors]) if len(block.own_factors) else shared.factors
    )
    # The hedge quality's windows for t >= start begin after hq0 (a re-anchoring point); their
    # residuals use the hedge of the day before, so the cascade is needed from hq0 on.
    hq0 = (start // w - 1) * w if start else 0
    cascade_out: dict[str, np.ndarray] | None = None
    if hq0:
        scratch = np.empty((len(CASCADE_FIELDS), *r.shape))
        cascade_out = {name: scratch[f] for f, name in enumerate(CASCADE_FIELDS)}
    cascade = rolling_cascade(
        r,
        model_factors,
        block.model_fidx,
        window=w,
        min_obs=params.min_obs,
        halflife=params.halflife,
        out=cascade_out,
        start=hq0,
    )
    out = {name: arr[:, start:] for name, arr in cascade.items()}
    if not start:
        out["vol_23d"] = rolling_std(r, window=VOL_SHORT_WINDOW, min_obs=VOL_SHORT_MIN_OBS) * (
            ANNUALIZATION
        )
    vol = np.empty(r.shape) if start else None
    out["vol_252d_ann"] = (
        rolling_std(r, window=w, min_obs=params.min_obs, out=vol, start=start)[:, start:]
        * ANNUALIZATION
    )
    r_hq, f_hq, k = r[:, hq0:], model_factors[:, hq0:], start - hq0
    for level, hr_names in LEVEL_HR.items():
        cfr = combined_factor_returns(
            [cascade[h][:, hq0:] for h in hr_names], f_hq, block.model_fidx[:, : len(hr_names)]
        )
        rr = r_hq - cfr
        out[f"l{level}_cfr"] = cfr[:, k:]
        out[f"l{level}_rr"] = rr[:, k:]
        out[f"l{level}_hq"] = hedge_quality(r_hq, rr, window=w, min_obs=params.min_obs, start=k)
    f0 = start - 1 if start else 0  # a residual uses the previous session's betas
    # Members of a sector group portfolio: the sector factor their b_sec was estimated on.
    own = own_sector_factors(
        len(shared.factors) if shared.published is None else shared.published,
        block.model_fidx,
        block.exposure,
        model_factors,
        shared.market,
        (w, params.min_obs, params.halflife),
        hq0,
    )
    betas = flat_betas(
        r[:, f0:],
        cascade["l1_mkt_hr"][:, f0:],
        cascade["l2_sec_hr"][:, f0:],
        block.exposure,
        shared.market[f0:],
        shared.flat_returns[:, f0:],
        own=(own[0], own[1][:, f0:]),
    )
    out["beta_mkt"], out["beta_sec"], out["resid_return"] = (b[:, start - f0 :] for b in betas)
    return out


def finish_model(plan: ModelPlan, blocks: list[tuple[int, dict[str, np.ndarray]]]) -> ModelResult:
    """Join the blocks' arrays (in any order; together they cover every row once) with the
    metrics read straight off prices, which need the whole universe (the cap rank)."""
    n, n_t = plan.returns.shape
    covered = np.zeros(n, dtype=np.int64)
    for start, arrays in blocks:
        covered[start : start + len(next(iter(arrays.values())))] += 1
    if not (covered == 1).all():
        raise ValueError("the blocks must cover every row exactly once")
    if len(blocks) == 1:
        joined = dict(blocks[0][1])
    else:
        joined = {name: np.empty((n, n_t)) for name in blocks[0][1]}
        for start, arrays in blocks:
            for name, arr in arrays.items():
                joined[name][start : start + len(arr)] = arr
    return result_of(plan, join_metrics(joined, plan.price_metrics))


class PlanParts(Protocol):
    """What a result is assembled from beside its metrics: a `ModelPlan`, or the outline of
    one planned a slice of sessions at a time (`plan_slices.PlanOutline`)."""

    @property
    def symbols(self) -> np.ndarray: ...
    @property
    def sessions(self) -> np.ndarray: ...
    @property
    def layout(self) -> LayoutKeys: ...
    @property
    def flat(self) -> FlatFactors: ...
    @property
    def shared(self) -> SharedFactors: ...
    @property
    def returns_excluded(self) -> int: ...


def result_of(plan: PlanParts, metrics: Mapping[str, MetricArray]) -> ModelResult:
    """The ModelResult of a plan and its metrics (whole arrays, or an incremental build's
    arrays of new sessions over the previous version's): the one place it is assembled."""
    layout = plan.layout
    flat = plan.flat
    return ModelResult(
        symbols=plan.symbols,
        sessions=plan.sessions,
        metrics=dict(metrics),
        hierarchy=hierarchy(plan.symbols, layout),
        flat=FlatModel(
            **{f.name: getattr(flat, f.name) for f in fields(FlatFactors)},
            beta_mkt=metrics["beta_mkt"],
            beta_sec=metrics["beta_sec"],
            resid_return=metrics["resid_return"],
        ),
        factor_keys=layout.keys,
        params=plan.shared.params,
        notes={
            "returns_excluded": plan.returns_excluded,
            "leave_one_out_rows": layout.leave_one_out_rows,
            "caps_imputed": len(layout.caps_imputed),
            "caps_imputed_symbols": layout.caps_imputed,
        },
    )


def run_model(
    panel: Panel,
    master: pd.DataFrame,
    params: ModelParams,
    *,
    exclude: np.ndarray | None = None,
    block_rows: int | None = None,
) -> ModelResult:
    """Build every published metric from a panel and a classified security master, in this
    process: the plan, then `run_block` on blocks of `block_rows` rows (default: one block of
    every row), joined. A distributed build runs the same `run_block` on the same blocks."""
    plan = plan_model(panel, master, params, exclude=exclude)
    shared = plan.in_process()
    bounds = plan.blocks(block_rows or max(plan.size, 1))
    return finish_model(
        plan, [(a, run_block(shared, plan.block(a, b, own_rows=False))) for a, b in bounds]
    )


def cap_rank(market_cap: np.ndarray, eligible: np.ndarray) -> np.ndarray:
    """Per session, the rank of each eligible row by market cap (1 = largest); NaN where the
    row has no cap that day or is not eligible (ETFs are not ranked)."""
    caps = np.ascontiguousarray(market_cap, dtype=np.float64)
    ranks = np.empty(caps.shape)
    rank_kernel(caps, np.ascontiguousarray(eligible, dtype=np.bool_), ranks)
    return ranks


def combined_factor_returns(
    hedge_ratios: list[np.ndarray], factors: np.ndarray, fidx: np.ndarray
) -> np.ndarray:
    """Sum over levels of HR_{t-1} x factor_t: the return the hedge of day t-1 earns on day t.

    A level the symbol does not have (no sector, no subsector factor), or has not yet (its
    ETF's sample is still short of min_obs: the level's hedge ratio is null beside a published
    market hedge ratio), is no part of its hedge: the symbol's level-k columns carry the hedge
    of the levels it has, so its `lk_cfr` is that of its deepest published level. NaN where the
    symbol has no market factor or where yesterday's market hedge ratio of the level is not
    published (including a collinear level, published as null whole).
    """
    n, n_t = hedge_ratios[0].shape
    total = np.zeros((n, n_t))
    total[:, 0] = np.nan
    total[fidx[:, 0] < 0] = np.nan
    market_hr = hedge_ratios[0]
    for j, hr in enumerate(hedge_ratios):
        idx = fidx[:, j]
        has = idx >= 0
        with np.errstate(invalid="ignore"):
            term = hr[has, :-1] * factors[idx[has], 1:]
        if j > 0:
            carried = np.isnan(hr[has, :-1]) & np.isfinite(market_hr[has, :-1])
            term[carried] = 0.0
        total[has, 1:] += term
    return total


@dataclass(frozen=True)
class FlatFactors:
    """The universe-wide half of Service A's factor model: the factors and who is exposed."""

    names: list[str]  # "Mkt", then sector factor names
    returns: np.ndarray  # (K x T)
    sources: list[int]  # factor row behind each factor
    sector_market_beta: np.ndarray  # (K-1 x T) g_t of each sector series on the market
    exposure: np.ndarray  # (n,) index of the stock's sector factor, -1 = Mkt only
    market: np.ndarray  # (T,) the market factor (NaN where the data has none)


@dataclass(frozen=True)
class FlatModel(FlatFactors):
    """Service A's factor model: its factors, and per-stock betas and residuals."""

    beta_mkt: MetricArray  # (n x T)
    beta_sec: MetricArray  # (n x T)
    resid_return: MetricArray  # (n x T)


def flat_factors(
    factors: np.ndarray,
    fidx: np.ndarray,
    sectors: np.ndarray,
    factor_names: np.ndarray,
    params: ModelParams,
) -> FlatFactors:
    """Service A: factor Mkt = the market return; one factor per GICS sector, the sector series
    cleaned of the market with the link beta known the day before: f_sec,t = s_t - g_{t-1} m_t.
    """
    n = fidx.shape[0]
    n_t = factors.shape[1]
    has_market = fidx[:, 0] >= 0
    market_idx = int(fidx[has_market, 0][0]) if has_market.any() else -1
    m = factors[market_idx] if market_idx >= 0 else np.full(n_t, np.nan)
    sector_of: dict[str, tuple[int, str]] = {}
    for i in range(n):
        sec = sectors[i]
        if fidx[i, 1] >= 0 and isinstance(sec, str):
            name = factor_names[i] if isinstance(factor_names[i], str) else sec.replace(" ", "_")
            sector_of.setdefault(sec, (int(fidx[i, 1]), name))
    ordered = sorted(sector_of.items(), key=lambda item: item[1][1])
    rows = np.array([row for _, (row, _) in ordered], dtype=np.int64)
    link = np.empty((0, n_t))
    if len(rows):
        link_idx = np.full((len(rows), 3), -1, dtype=np.int64)
        link_idx[:, 0] = market_idx
        link = rolling_cascade(
            factors[rows],
            factors,
            link_idx,
            window=params.window,
            min_obs=params.min_obs,
            halflife=params.halflife,
        )["l1_mkt_hr"]
    link_prev = np.full(link.shape, np.nan)
    link_prev[:, 1:] = link[:, :-1]
    returns = np.vstack([m[None, :], factors[rows] - link_prev * m[None, :]])
    position = {sec: 1 + j for j, (sec, _) in enumerate(ordered)}
    exposure = np.full(n, -1, dtype=np.int64)
    for i in range(n):
        if fidx[i, 1] >= 0 and sectors[i] in position:
            exposure[i] = position[sectors[i]]
    return FlatFactors(
        names=[MARKET_FACTOR] + [name for _, (_, name) in ordered],
        returns=returns,
        sources=[market_idx, *rows.tolist()],
        sector_market_beta=link,
        exposure=exposure,
        market=m,
    )

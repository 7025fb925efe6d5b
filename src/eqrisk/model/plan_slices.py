"""The model's plan one time slice at a time, for a build that never holds a universe-sized
(n x T) array: the plan's structure from the master alone (`plan_shape`), its numbers per
slice of sessions (`slice_rows`: returns, the factor rows, the cap rank, each only as wide as
the slice), and its outline from the whole factor series once every slice is done
(`plan_outline`: the flat model's factors need the whole F x T series, which is small).

Every number of the plan at a session depends on that session and the LEAD sessions before
it only: a return on the session before; a group portfolio's weights on the previous
session's caps and its winsorising band on each member's previous MEMBER_VOL_WINDOW returns;
the cap rank on the session alone. A slice read with LEAD sessions before its first one
(fewer at the start of the calendar) gives, on its own sessions, the whole run's values bit
for bit (tests/model/test_plan_slices.py). Pure: arrays in, arrays out, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from eqrisk.model.layout import LayoutShape, layout_rows, layout_shape
from eqrisk.model.returns import MEMBER_VOL_WINDOW, simple_returns
from eqrisk.model.run import FlatFactors, ModelParams, SharedFactors, cap_rank, flat_factors

# Sessions a slice is read with before its first one: the member vol's window, and the
# return into its first session.
LEAD = MEMBER_VOL_WINDOW + 1


@dataclass(frozen=True)
class PlanShape:
    """What the master and the universe decide of a plan, before any price is read."""

    symbols: np.ndarray  # (n,)
    sessions: np.ndarray  # (T,) datetime64[D]
    layout: LayoutShape
    is_stock: np.ndarray  # (n,) the rows the cap rank ranks
    sectors: np.ndarray  # (n,) GICS sector (object), for the flat model
    factor_names: np.ndarray  # (n,) the flat model's sector factor name (object)
    params: ModelParams

    @property
    def size(self) -> int:
        return len(self.symbols)


def plan_shape(
    symbols: np.ndarray, sessions: np.ndarray, master: pd.DataFrame, params: ModelParams
) -> PlanShape:
    """The structure of `plan_model`'s plan on this universe and calendar."""
    info = master.set_index("symbol").reindex(symbols)
    return PlanShape(
        symbols=symbols,
        sessions=np.asarray(sessions).astype("datetime64[D]"),
        layout=layout_shape(symbols, info),
        is_stock=info["asset_type"].fillna("stock").to_numpy() == "stock",
        sectors=info["gics_sector"].to_numpy(dtype=object),
        factor_names=info["factor_name"].to_numpy(dtype=object),
        params=params,
    )


@dataclass(frozen=True)
class SliceRows:
    """The plan's numbers on one slice of sessions (c of them)."""

    returns: np.ndarray  # (n x c), the excluded returns null
    model_factors: np.ndarray  # ((F + L) x c): the published rows, then the leave-one-out rows
    rank: np.ndarray  # (n x c) the cap rank
    imputed: set[int]  # rows weighted by the missing-cap rule in some group on these sessions


def slice_rows(
    shape: PlanShape,
    close: np.ndarray,
    market_cap: np.ndarray,
    lead: int,
    exclude: np.ndarray | None = None,
) -> SliceRows:
    """The plan's numbers on the sessions of `close` and `market_cap` (n x (lead + c)) after
    their first `lead` columns: `lead` is LEAD, or every session before the slice when the
    calendar has fewer. `exclude` (same shape, bool) marks the returns that are no returns."""
    if close.shape != market_cap.shape:
        raise ValueError(f"close {close.shape} and market cap {market_cap.shape} differ")
    r = simple_returns(close)
    if exclude is not None:
        r[exclude] = np.nan
    _factors, model_factors, imputed = layout_rows(shape.layout, r, market_cap)
    return SliceRows(
        returns=np.ascontiguousarray(r[:, lead:]),
        model_factors=np.ascontiguousarray(model_factors[:, lead:]),
        rank=cap_rank(market_cap[:, lead:], shape.is_stock),
        imputed=imputed,
    )


@dataclass(frozen=True)
class LayoutOutline:
    """A layout without its leave-one-out rows (held elsewhere, a block's at a time)."""

    factors: np.ndarray  # (F x T) the published rows
    keys: list[str]
    fidx: np.ndarray  # (n x 3)
    model_fidx: np.ndarray  # (n x 3)
    caps_imputed: list[str]
    leave_one_out_rows: int


@dataclass(frozen=True)
class PlanOutline:
    """What a run's result is assembled from beside its metrics (`run.result_of`), and what
    every block shares: no (n x T) array."""

    symbols: np.ndarray
    sessions: np.ndarray
    layout: LayoutOutline
    flat: FlatFactors
    shared: SharedFactors
    returns_excluded: int
    is_stock: np.ndarray  # (n,) the master's stocks (`PlanShape.is_stock`)


def plan_outline(
    shape: PlanShape, factors: np.ndarray, imputed: set[int], returns_excluded: int
) -> PlanOutline:
    """The outline of a plan whose slices gave the published factor rows `factors` (F x T,
    joined along time) and the rows weighted by the missing-cap rule on some session."""
    layout = shape.layout
    flat = flat_factors(factors, layout.fidx, shape.sectors, shape.factor_names, shape.params)
    return PlanOutline(
        symbols=shape.symbols,
        sessions=shape.sessions,
        layout=LayoutOutline(
            factors=factors,
            keys=list(layout.keys),
            fidx=layout.fidx,
            model_fidx=layout.model_fidx,
            caps_imputed=sorted(str(shape.symbols[i]) for i in imputed),
            leave_one_out_rows=len(layout.loo),
        ),
        flat=flat,
        shared=SharedFactors(
            factors=factors, market=flat.market, flat_returns=flat.returns, params=shape.params
        ),
        returns_excluded=returns_excluded,
        is_stock=shape.is_stock,
    )

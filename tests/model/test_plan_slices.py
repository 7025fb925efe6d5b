"""The plan one time slice at a time equals the whole plan, bit for bit, on real prices: with
ETFs and group portfolios, caps missing for some stocks (the missing-cap rule), returns left
out, and slices of any width."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from eqrisk.data.panel import Panel
from eqrisk.model.plan_slices import LEAD, plan_outline, plan_shape, slice_rows
from eqrisk.model.run import ModelParams, ModelPlan, cap_rank, plan_model
from helpers import shared_file

PARAMS = ModelParams(120, 60)


def _capped(panel: Panel, uncapped: set[str]) -> Panel:
    """The panel with caps = shares x adjusted close, none for `uncapped` and the ETFs."""
    fin = pd.read_csv(shared_file("constituents_financials.csv"))
    shares = dict(zip(fin["Symbol"], fin["Market Cap"] / fin["Price"], strict=True))
    counts = np.array(
        [np.nan if s in uncapped else shares.get(s, np.nan) for s in panel.symbols.tolist()]
    )
    return Panel(**{**panel.__dict__, "market_cap": counts[:, None] * panel.close})


def _sliced(
    panel: Panel, master: pd.DataFrame, exclude: np.ndarray | None, width: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, set[int], np.ndarray]:
    """returns, model factors, rank, imputed rows and published factors, slice by slice."""
    shape = plan_shape(panel.symbols, panel.sessions, master, PARAMS)
    parts = []
    imputed: set[int] = set()
    n_t = panel.shape[1]
    for t0 in range(0, n_t, width):
        t1 = min(t0 + width, n_t)
        lead = min(LEAD, t0)
        cols = slice(t0 - lead, t1)
        part = slice_rows(
            shape,
            panel.close[:, cols],
            panel.market_cap[:, cols],
            lead,
            None if exclude is None else exclude[:, cols],
        )
        assert part.returns.shape == (panel.shape[0], t1 - t0)
        parts.append(part)
        imputed |= part.imputed
    returns = np.hstack([p.returns for p in parts])
    model_factors = np.hstack([p.model_factors for p in parts])
    rank = np.hstack([p.rank for p in parts])
    return returns, model_factors, rank, imputed, model_factors[: shape.layout.published]


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def _check(panel: Panel, master: pd.DataFrame, exclude: np.ndarray | None, width: int) -> None:
    plan: ModelPlan = plan_model(panel, master, PARAMS, exclude=exclude)
    returns, model_factors, rank, imputed, factors = _sliced(panel, master, exclude, width)
    assert _same(returns, plan.returns)
    assert _same(model_factors, plan.layout.model_factors)
    assert _same(rank, cap_rank(panel.market_cap, plan.is_stock))
    assert _same(factors, plan.layout.factors)
    shape = plan_shape(panel.symbols, panel.sessions, master, PARAMS)
    outline = plan_outline(shape, factors, imputed, plan.returns_excluded)
    assert outline.layout.keys == plan.layout.keys
    assert _same(outline.layout.fidx, plan.layout.fidx)
    assert _same(outline.layout.model_fidx, plan.layout.model_fidx)
    assert outline.layout.caps_imputed == plan.layout.caps_imputed
    assert outline.layout.leave_one_out_rows == plan.layout.leave_one_out_rows
    assert outline.flat.names == plan.flat.names and outline.flat.sources == plan.flat.sources
    assert _same(outline.flat.returns, plan.flat.returns)
    assert _same(outline.flat.sector_market_beta, plan.flat.sector_market_beta)
    assert _same(outline.flat.exposure, plan.flat.exposure)


@pytest.mark.parametrize("width", [128 * 4, 97])
def test_slices_of_the_real_universe_give_the_whole_plan(real_universe, width: int) -> None:
    """ETFs for the market, sectors and some subsectors, group portfolios for the rest, three
    stocks without a cap (weighted by the rule), returns left out here and there."""
    panel, master = real_universe
    panel = _capped(panel, {"AMD", "BAC", "COP"})
    exclude = np.zeros(panel.shape, dtype=bool)
    rng = np.random.default_rng(7)
    exclude[rng.integers(0, panel.shape[0], 40), rng.integers(1, panel.shape[1], 40)] = True
    _check(panel, master, exclude, width)


def test_slices_of_a_universe_of_group_portfolios_give_the_whole_plan(real_universe) -> None:
    """No ETF at all: every level a group portfolio, every stock with leave-one-out rows."""
    panel, master = real_universe
    stocks = master.loc[master["asset_type"].fillna("stock") == "stock", "symbol"]
    keep = np.isin(panel.symbols, stocks.to_numpy()[::3])
    sub = Panel(
        **{
            **panel.__dict__,
            **{
                k: v[keep]
                for k, v in panel.__dict__.items()
                if isinstance(v, np.ndarray) and v.ndim == 2
            },
            "symbols": panel.symbols[keep],
        }
    )
    sub = _capped(sub, set())
    plan = plan_model(sub, master, PARAMS)
    assert not any(k in sub.symbols for k in plan.layout.keys)  # groups only
    assert plan.layout.leave_one_out_rows > sub.shape[0]
    _check(sub, master, None, 128 * 3)

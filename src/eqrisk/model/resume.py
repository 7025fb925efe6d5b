"""The model's time axis: a run from any session, bit for bit the full run's from there.

The per-symbol kernels are causal and re-anchor from scratch at multiples of the window (the
cascade's sums, the flat model's link betas), so a run's state at a session is the inputs
since the anchor before it: `run_from` runs the plan from `start` on, reading its inputs from
the re-anchoring point two windows earlier (`anchors`) and computing each series from the point
it needs only (the cascade from one window before `start`, the flat model from `start` - 1,
the 23-session volatility from its own anchor), so a one-session update costs about one
window. `warmup` is how much history before a session a caller hands in for that (a plan that
begins at its session `base`, `base` a multiple of the window).

A metric with a window of its own says here how far back it reads; the build asks nothing
else of the model's time axis.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from eqrisk.model.cascade import rolling_std
from eqrisk.model.returns import MEMBER_VOL_WINDOW
from eqrisk.model.run import (
    ANNUALIZATION,
    VOL_SHORT_MIN_OBS,
    VOL_SHORT_WINDOW,
    BlockInput,
    ModelPlan,
    SharedFactors,
    run_block,
)

# Windows a run from a session reads before it, besides the winsorisation's look-back: the
# run's two (`anchors`) and the link betas' one.
WARMUP_WINDOWS = 3
ROWS = 512  # rows run at a time: memory holds one block's series over the window

# Where the blocks of a run run: map(task, shared, items, make) yields (item, answer) for every
# item, answer = task(shared, make(item), threads) (the build's executors; default: `here`).
BlockMap = Callable[
    [Callable[[Any, Any, Any], Any], Any, Sequence[Any], Callable[[Any], Any]],
    Iterable[tuple[Any, Any]],
]


def here(
    task: Callable[[Any, Any, Any], Any],
    shared: Any,
    items: Sequence[Any],
    make: Callable[[Any], Any],
) -> Iterator[tuple[Any, Any]]:
    """The blocks in this process, one after the other."""
    for item in items:
        yield item, task(shared, make(item), None)


def warmup(window: int) -> int:
    """Sessions of history a plan needs before the first session a run computes: the run's
    anchors and the link betas' window (`WARMUP_WINDOWS`), and the group portfolios'
    winsorisation, which looks back MEMBER_VOL_WINDOW sessions."""
    return WARMUP_WINDOWS * window + MEMBER_VOL_WINDOW + 2


def anchors(start: int, window: int) -> tuple[int, int]:
    """Where a run from `start` reads its inputs from, for the window-long series and for the
    23-session vol: a multiple of the window (the kernels re-anchor there, from scratch), early
    enough that every series is exact from `start` on: the cascade from one window past it,
    the residuals one session later, the hedge quality (a rolling series of residuals) from the
    next anchor, so two windows."""
    long_from = ((start - 2 * window) // window) * window if start >= 2 * window else 0
    short_from = (
        ((start - VOL_SHORT_WINDOW) // VOL_SHORT_WINDOW) * VOL_SHORT_WINDOW
        if start >= VOL_SHORT_WINDOW
        else 0
    )
    return long_from, short_from


def run_from(
    plan: ModelPlan, start: int, *, base: int = 0, rows: int = ROWS, on: BlockMap = here
) -> dict[str, np.ndarray]:
    """Every metric at sessions t >= `start`, as (n x (T - start)) arrays, bitwise equal to a
    full run's (`run_model`) from `start` on.

    `start` counts sessions of the whole calendar; `plan`'s arrays begin at its session `base`
    (the anchors are the calendar's, so `base` is a multiple of the window, at least
    `warmup(window)` sessions before `start` rounded down to it). The rows run `rows` at a
    time, on `on` (the build's executor). Raises ValueError when the plan begins too late for
    `start`."""
    params = plan.shared.params
    o, o_short = (x - base for x in anchors(start, params.window))
    s = start - base - o
    if o < 0 or o_short < 0 or (base and base % params.window):
        raise ValueError(f"a plan from session {base} cannot run from session {start}")
    computed = _per_symbol(plan, o, s, rows, on)
    short = np.ascontiguousarray(plan.returns[:, o_short:])
    vol_short = rolling_std(
        short,
        window=VOL_SHORT_WINDOW,
        min_obs=VOL_SHORT_MIN_OBS,
        out=np.empty(short.shape),
        start=start - base - o_short,
    )[:, start - base - o_short :]
    out: dict[str, np.ndarray] = {}
    for name, arr in computed.items():  # the order of a full run's metrics
        if name == "vol_252d_ann":
            out["vol_23d"] = vol_short * ANNUALIZATION
        if name != "vol_23d":
            out[name] = arr
    out.update(plan.price_metrics_from(start - base))
    return out


def from_column(shared: SharedFactors, o: int) -> SharedFactors:
    """`shared`'s inputs from plan column `o` on (the start of a run from an anchor)."""
    return SharedFactors(
        factors=np.ascontiguousarray(shared.factors[:, o:]),
        market=shared.market[o:],
        flat_returns=np.ascontiguousarray(shared.flat_returns[:, o:]),
        params=shared.params,
        published=shared.published,
    )


def _per_symbol(plan: ModelPlan, o: int, s: int, rows: int, on: BlockMap) -> dict[str, np.ndarray]:
    """`run_block`'s metrics from plan column `o` + `s` on, block by block, on the inputs
    from plan column `o` (an anchor)."""
    sliced = from_column(plan.in_process(), o)

    def block(bounds: tuple[int, int]) -> tuple[BlockInput, int]:
        a, b = bounds
        part = plan.block(a, b, own_rows=False)
        return BlockInput(
            start=a,
            stop=b,
            returns=np.ascontiguousarray(part.returns[:, o:]),
            own_factors=np.empty((0, len(plan.sessions) - o)),
            model_fidx=part.model_fidx,
            exposure=part.exposure,
        ), s

    computed: dict[str, np.ndarray] = {}
    for (a, b), found in on(tail_block, sliced, plan.blocks(rows), block):
        for name, arr in found.items():
            if name not in computed:
                computed[name] = np.empty((plan.size, arr.shape[1]))
            computed[name][a:b] = arr
    return computed


def tail_block(
    shared: SharedFactors, job: tuple[BlockInput, int], threads: int | None = None
) -> dict[str, np.ndarray]:
    """One block of a run from plan column `s` (`job`: the block's inputs from an anchor, s):
    each series from the point it needs (see run_block), the first two windows whole."""
    block, s = job
    if s >= 2 * shared.params.window:
        return run_block(shared, block, start=s)
    return {name: arr[:, s:] for name, arr in run_block(shared, block).items()}

"""`POST /api/portfolio/risk`: a portfolio's predicted volatility, tracking error, Euler
contributions per level, factor and position, and its ETF hedge, from the snapshot's risk model
(docs/decisions/portfolio-risk.md). Priced per position used."""

# No `from __future__ import annotations`: pydantic and FastAPI read these annotations.

import math
import re
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import Field, field_validator
from starlette.responses import Response

from eqrisk.api.answers import snap_headers
from eqrisk.api.endpoint import Call, Doc, Endpoint
from eqrisk.api.errors import ApiError
from eqrisk.api.formats import JSON, MEDIA_TYPES, dumps
from eqrisk.api.models import BODY_ERRORS, ERRORS
from eqrisk.api.params import BodyParams, IsoDate, VersionedParams
from eqrisk.api.records import Coded, Column, coded, records, splice, splice_marks
from eqrisk.api.risk_answers import (
    DATE_DESCRIPTION,
    PortfolioRiskResponse,
    risk_session,
    session_date,
)
from eqrisk.api.sizes import Size
from eqrisk.data.master import MAG7
from eqrisk.snapshot.portfolio import (
    ANNUAL,
    MODEL_TEXTS,
    Attribution,
    PortfolioAnswer,
    attribution_dict,
    model_codes,
    portfolio_answer,
)
from eqrisk.snapshot.risk_days import implied_etfs
from eqrisk.snapshot.style_hedge import StyleNeutral, style_dict, style_neutral
from eqrisk.snapshot.versions import Snapshot

MAX_POSITIONS = 5000
SENT_PER_UNIT = 50
"""A call is charged at least one unit per this many positions sent (the book's and the
benchmark's together): the positions the model cannot use are read, looked up and listed too,
so a book of thousands of unknown tickers is not a 0.01 USD call (docs/decisions/portfolio-risk.md)."""
MAX_ABS_POSITION = 1e15
"""The largest |position| (after the same ticker's entries add up): a book's arithmetic on
positions up to it cannot overflow a float64, and no real book is larger (weights or dollars)."""
LEVELS = {"L1": 1, "L2": 2, "L3": 3}
_SPACE = re.compile(r"\s")  # a ticker with white space anywhere is stripped one by one


def as_sent(tickers: list[str]) -> bool:
    """Whether every ticker is already upper-case and free of white space, told in a few
    passes in C over the tickers joined: joined with no separator, white space found is a
    ticker's own, and `str.upper` maps each character to one or more, so an unchanged whole
    means every ticker unchanged."""
    joined = "".join(tickers)
    return joined.upper() == joined and not _SPACE.search(joined)


class PortfolioRiskParams(BodyParams, VersionedParams):
    positions: dict[str, float] = Field(
        min_length=1,
        max_length=MAX_POSITIONS,
        description=(
            f"Ticker -> position (1 to {MAX_POSITIONS}), as weights or dollars (see `units`); "
            "shorts are negative; each a finite number of magnitude at most "
            f"{MAX_ABS_POSITION:.0e}. Tickers are case-insensitive; the same ticker twice adds up."
        ),
        examples=[{"AAPL": 0.4, "MSFT": 0.35, "NVDA": -0.25}],
    )
    units: Literal["weights", "dollars"] = Field(
        "weights",
        description="What the positions are; every figure of the answer is in their units.",
    )
    benchmark: str | dict[str, float] | None = Field(
        None,
        description=(
            "Optional benchmark for the tracking error: a ticker (for example SPY, held for "
            f"the net value of the positions used) or 1 to {MAX_POSITIONS} positions in the "
            "same units."
        ),
        examples=["SPY"],
    )
    date: IsoDate | None = Field(None, description=DATE_DESCRIPTION)
    level: Literal["L1", "L2", "L3"] = Field(
        "L3", description="Level of the ETF hedge: L1 market, L2 + sector, L3 + subsector."
    )
    style_neutral: bool = Field(
        False,
        description=(
            "Also a style-neutral hedge (`hedge.style_neutral`): legs in the factor ETFs of the "
            "data (MTUM, USMV, QUAL, VLUE, SIZE, IWM, IWD, IWF) that take the book's style "
            "exposure down as far as they allow, the ETF hedge of the book with those legs, "
            "the style exposure left and the volatility after. Same price."
        ),
    )

    @field_validator("positions")
    @classmethod
    def _upper(cls, value: dict[str, float]) -> dict[str, float]:
        # map() over str methods, not a Python loop per position: a book of 5,000 positions
        # and its benchmark are read in well under a millisecond.
        given = list(value)
        # Already upper-case and stripped (the usual book): one pass, in C.
        keys = given if as_sent(given) else list(map(str.upper, map(str.strip, given)))
        if not all(keys) or max(map(len, keys)) > 32:
            ticker = next(t for t, k in zip(given, keys, strict=True) if not k or len(k) > 32)
            raise ValueError(f"{ticker!r} is not a ticker")
        out: dict[str, float]
        if keys is given or keys == given:  # upper-case and stripped, so each ticker once
            out = value
        else:  # the same ticker in other cases or padded: its entries add up
            out = {}
            for key, w in zip(keys, value.values(), strict=True):
                out[key] = out.get(key, 0.0) + float(w)
        weights = np.fromiter(out.values(), dtype=np.float64, count=len(out))
        with np.errstate(invalid="ignore"):
            bad = np.flatnonzero(~(np.abs(weights) <= MAX_ABS_POSITION))  # NaN and inf too
        if bad.size:
            ticker, w = list(out.items())[int(bad[0])]
            raise ValueError(
                f"the position of {ticker} ({w:.6g}) is not a finite number of magnitude at "
                f"most {MAX_ABS_POSITION:.0e}"
            )
        return out

    @field_validator("benchmark")
    @classmethod
    def _bench(cls, value: str | dict[str, float] | None) -> str | dict[str, float] | None:
        if isinstance(value, str):
            key = value.strip().upper()
            if not key or len(key) > 32:
                raise ValueError(f"{value!r} is not a ticker")
            return key
        if isinstance(value, dict):
            if not 1 <= len(value) <= MAX_POSITIONS:
                raise ValueError(f"a benchmark holds 1 to {MAX_POSITIONS} positions")
            return cls._upper(value)
        return value


@dataclass(frozen=True)
class PortfolioPlan:
    answer: PortfolioAnswer
    date: str
    used: int  # positions used (charged)
    sent: int  # positions given, the benchmark's included (a benchmark ticker: one)
    style: StyleNeutral | None = None  # the style-neutral hedge, when asked


def asked_tickers(p: PortfolioRiskParams) -> list[str]:
    """The tickers the request names (the demo key's first rule)."""
    bench = [p.benchmark] if isinstance(p.benchmark, str) else list(p.benchmark or {})
    return [*p.positions, *bench]


def plan_portfolio(snap: Snapshot, p: PortfolioRiskParams) -> PortfolioPlan:
    t = risk_session(snap, p.date)
    answer = portfolio_answer(
        snap, t, p.positions, benchmark=p.benchmark, hedge_level=LEVELS[p.level]
    )
    risk = answer.risk
    used = risk.portfolio.positions
    if not used.tickers:
        why = "; ".join(f"{u.ticker}: {u.reason}" for u in risk.unusable[:10])
        raise ApiError(
            "NO_DATA",
            f"no position has a risk forecast on {session_date(snap, t)} ({why})",
            unused=list(risk.unusable.tickers),
        )
    style = (
        style_neutral(snap, t, p.positions, hedge_level=LEVELS[p.level])
        if p.style_neutral
        else None
    )
    figures = [risk.portfolio.vol, answer.hedge.vol_after, *answer.hedge.notional]
    if style is not None:
        figures += [style.hedge.vol_after, *style.notional, *style.hedge.notional]
    if risk.active is not None:
        figures.append(risk.active.vol)
    if not all(math.isfinite(x) for x in figures):
        raise ApiError(
            "INVALID_PARAMETER",
            "the book's risk overflows a float64: scale the positions down (weights or "
            "dollars in millions)",
            parameter="positions",
        )
    return PortfolioPlan(answer, session_date(snap, t), len(used.tickers), positions_sent(p), style)


def positions_sent(p: PortfolioRiskParams) -> int:
    """The positions a call sends: the book's and the benchmark's (a ticker counts one)."""
    bench = p.benchmark
    return len(p.positions) + (len(bench) if isinstance(bench, dict) else int(bench is not None))


def demo_etfs(snap: Snapshot) -> list[str]:
    """What the demo key may also name here: the ETFs its seven tickers imply (SPY, their
    sector and subsector ETFs), so that its books have a benchmark and a hedge."""
    return implied_etfs(snap, MAG7)


def size(plan: PortfolioPlan, p: PortfolioRiskParams) -> Size:
    """One unit per position used, and at least one per `SENT_PER_UNIT` positions sent (the
    book's and the benchmark's): a position the model cannot use costs 1/50 of one used."""
    rows = plan.used
    floor = -(-plan.sent // SENT_PER_UNIT)
    note = f"charged per position used: {rows} of {len(p.positions)}"
    if floor > rows:
        note += (
            f"; at least one unit per {SENT_PER_UNIT} positions sent (benchmark included): "
            f"{floor} for {plan.sent}"
        )
    return Size(max(rows, floor), rows, 1500 + rows * 260, note)


def served(plan: PortfolioPlan) -> list[str]:
    risk = plan.answer.risk
    style = [] if plan.style is None else [*plan.style.keys, *plan.style.hedge.keys]
    return [*risk.portfolio.positions.tickers, *plan.answer.hedge.keys, *style]


def _positions(a: Attribution, answer: PortfolioAnswer) -> dict[str, Column]:
    """An attribution's positions as the columns of the answer's `positions` records."""
    pos = a.positions
    level, code = model_codes(a, answer)
    return {
        "ticker": pos.tickers,
        "position": pos.weights,
        "marginal": pos.marginal,
        "contribution": pos.contribution,
        "share": pos.share,
        "model_level": level,
        "model": Coded(code, MODEL_TEXTS),
    }


def render(call: Call[PortfolioRiskParams, PortfolioPlan]) -> Response:
    """The portfolio's risk (see the route's description). The positions (up to 5,000, twice
    with a benchmark) are written from their arrays (`records`) and spliced into the
    document: the bytes orjson writes for a dict per position, without the dicts."""
    a, p = call.plan.answer, call.params
    risk, hedge = a.risk, a.hedge
    books = [risk.portfolio] if risk.active is None else [risk.portfolio, risk.active]
    unused = [risk.unusable, risk.benchmark_unusable]
    marks = splice_marks(len(books) + len(unused))
    legs = [
        {"etf": k, "notional": n, "tradable": ok, "exposure_after": x}
        for k, n, ok, x in zip(
            hedge.keys, hedge.notional, hedge.tradable, hedge.exposure_after, strict=True
        )
    ]
    doc = {
        "date": call.plan.date,
        "units": p.units,
        "portfolio": attribution_dict(risk.portfolio, a, positions=marks[0]),
        "tracking_error": (
            None if risk.active is None else attribution_dict(risk.active, a, positions=marks[1])
        ),
        "hedge": {
            "level": p.level,
            "legs": legs,
            "vol_after_daily": hedge.vol_after,
            "vol_after_annual": hedge.vol_after * ANNUAL,
            "after": hedge.after,
            **({} if call.plan.style is None else {"style_neutral": style_dict(call.plan.style)}),
        },
        "unused": marks[-2],
        "benchmark_unused": marks[-1],
        "used_share": a.used_share,
        "partial": a.partial,
        "notes": a.notes,
    }
    snap = call.snap
    text = dumps({**doc, "_metadata": snap.metadata()})
    tables = [_positions(book, a) for book in books]
    tables += [{"ticker": u.tickers, "reason": coded(u.reasons)} for u in unused]
    body = splice(text, records(tables))
    return Response(body, media_type=MEDIA_TYPES[JSON], headers=snap_headers(snap))


ENDPOINT = Endpoint(
    path="/api/portfolio/risk",
    method="POST",
    service="risk",
    price_key="portfolio/risk",
    params=PortfolioRiskParams,
    plan=plan_portfolio,
    size=size,
    asked=asked_tickers,
    tickers=served,
    render=render,
    threaded=True,
    demo_also=demo_etfs,
    limits={
        "positions": MAX_POSITIONS,
        "benchmark_positions": MAX_POSITIONS,
        "abs_position": MAX_ABS_POSITION,
        "positions_sent_per_unit": SENT_PER_UNIT,
    },
    doc=Doc(
        name="portfolio_risk",
        summary="A portfolio's predicted risk, its attribution and its ETF hedge",
        description=(
            "From the snapshot's risk model of the session (Sigma = H F H' + D, forecast from "
            "data up to the session before; by default the next session, from data through the "
            "last close): predicted volatility daily and annualised, its "
            "factor / specific split, Euler contributions that add up to it per level (market, "
            "sector, subsector, style, specific), per factor (the ETFs and the second layer's "
            "style factors) and per position (marginal, "
            "contribution, share); with `benchmark`, the same for positions less the benchmark "
            "(its vol is the tracking error); the ETF hedge at `level` (notionals to buy, "
            "negative to sell: ETFs only) with the volatility left after it (`vol_after_daily`: "
            "the style and specific risk the ETFs do not remove) and its split by level "
            "(`after`); the tickers not used, with "
            "why; each position's `model_level` (1 market, 2 + sector, 3 + subsector) and "
            "`notes` naming a position that is neither a stock nor a factor (an ETF such as "
            "QQQ), modelled on the market factor alone. Charged per position used, and at least "
            f"one unit per {SENT_PER_UNIT} positions sent, the benchmark's included (see "
            "/api/estimate)."
        ),
        response_model=PortfolioRiskResponse,
        responses={**ERRORS, **BODY_ERRORS},
    ),
)

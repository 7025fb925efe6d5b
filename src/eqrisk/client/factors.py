"""The factor frames the notebook tools take, assembled from Service A's `/facts` and `/betas`.

- factor returns: one row per date, one column per factor (`Mkt`, then each sector factor);
- factor loadings: one row per (date, ticker), the same columns. A stock loads on `Mkt` and on
  its own sector's factor (the flat model); its loading on every other sector is 0.0. Where the
  model publishes no beta (before its minimum observations) the loading is NaN. On a style
  factor (level `style` in /factor_list: the risk model's second layer) a stock loads its style
  exposure on the sessions it is in the layer, 0.0 on the others.

The layout is the one pyfolio's and empyrical's `perf_attrib`, alphalens and skfolio's factor
models read. No I/O here: `Client` and `AsyncClient` send the calls (`FactorPlan`) and pass the
answers back, so the two clients cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import pandas as pd

from eqrisk.client.calls import Call, series
from eqrisk.client.frames import frame_of

MARKET_FACTOR = "Mkt"
MAX_SYMBOLS = 100  # symbols per Service A call (the route's limit)
STYLE_LEVEL = "style"


def _factor_records(response: httpx.Response) -> list[dict[str, Any]]:
    if response.headers.get("content-type", "").startswith("text/csv"):
        frame = frame_of(response).astype(object)
        records: Any = frame.where(frame.notna(), None).to_dict("records")
    else:
        records = response.json()
    if not isinstance(records, list) or not records:
        raise ValueError(f"the server listed no factors ({records!r})")
    return [dict(r) for r in records]


def factor_list(format: str | None = None) -> Call[list[dict[str, Any]]]:
    """GET /factor_list (free): one record per factor, `{fact, level, etf, sector}`."""
    return Call("GET", "/factor_list", _factor_records, {"format": format or "json"})


def factor_names(records: list[dict[str, Any]]) -> list[str]:
    """The factor names of a /factor_list answer, `Mkt` first."""
    names = [str(r["fact"]) for r in records]
    return sorted(names, key=lambda n: (n != MARKET_FACTOR, names.index(n)))


def facts_call(factor: str, start: str, end: str | None) -> Call[pd.DataFrame]:
    return series("/facts", None, start, end, None, fact=factor)


def betas_calls(
    tickers: Sequence[str], factor: str, start: str, end: str | None
) -> Iterator[Call[pd.DataFrame]]:
    """/betas of `tickers` on one factor, `MAX_SYMBOLS` tickers a call."""
    for i in range(0, len(tickers), MAX_SYMBOLS):
        chunk = list(tickers[i : i + MAX_SYMBOLS])
        yield series("/betas", chunk, start, end, None, fact=factor)


def style_factors(records: list[dict[str, Any]]) -> list[str]:
    """The style factors of a /factor_list answer (level `style`)."""
    return [str(r["fact"]) for r in records if r.get("level") == STYLE_LEVEL]


def tickers_of(tickers: str | Sequence[str]) -> list[str]:
    names = [tickers] if isinstance(tickers, str) else list(tickers)
    return list(dict.fromkeys(t.strip().upper() for t in names if t.strip()))


def returns_frame(parts: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """date x factor from one /facts answer per factor (columns in the order given)."""
    columns = []
    for name, part in parts.items():
        values = part.set_index(pd.to_datetime(part["teo"]))["factor_return"].astype(float)
        columns.append(values.rename(name))
    frame = pd.concat(columns, axis=1) if columns else pd.DataFrame()
    frame = frame.reindex(columns=list(parts)).sort_index()
    frame.index.name = "date"
    frame.columns.name = "factor"
    return frame


@dataclass
class LoadingParts:
    """The /betas answers of a loadings request, per factor."""

    factors: list[str]
    answers: dict[str, list[pd.DataFrame]]
    styles: frozenset[str] = frozenset()

    def frame(self) -> pd.DataFrame:
        """(date, ticker) x factor: the betas, 0.0 on the sectors a ticker is not in and on
        the style factors where it is outside the layer."""
        long = [a for parts in self.answers.values() for a in parts if len(a)]
        index = pd.MultiIndex.from_arrays([[], []], names=["date", "ticker"])
        if not long:
            return pd.DataFrame(index=index, columns=self.factors, dtype=float)
        rows = pd.concat(long, ignore_index=True)
        rows["date"] = pd.to_datetime(rows["teo"])
        wide = rows.pivot_table(
            index=["date", "symbol"], columns="fact", values="factor_beta", aggfunc="first"
        )
        wide = wide.reindex(columns=self.factors).astype(float)
        # Each ticker's own sector: the sector factor whose answer has its rows.
        sector = (rows["fact"] != MARKET_FACTOR) & ~rows["fact"].isin(self.styles)
        own = rows.loc[sector].groupby("symbol")["fact"].first()
        tickers = wide.index.get_level_values("symbol")
        for factor in self.factors:
            if factor == MARKET_FACTOR:
                continue
            if factor in self.styles:
                wide[factor] = wide[factor].fillna(0.0)
                continue
            elsewhere = (own.reindex(tickers) != factor).to_numpy()
            wide.loc[elsewhere, factor] = 0.0
        wide.index = wide.index.set_names(["date", "ticker"])
        wide.columns.name = "factor"
        return wide.sort_index()

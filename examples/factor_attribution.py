"""Attribute a book's daily returns to eqrisk's factors with pyfolio's `perf_attrib` (the
function lives in empyrical, which pyfolio calls): `pip install empyrical-reloaded`.

    python examples/factor_attribution.py NVDA=0.6 AAPL=0.25 MSFT=0.15

reads `EQRISK_URL` and `EQRISK_API_KEY` like `Client()` (Service A's routes are free).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

import empyrical
import pandas as pd

from eqrisk.client import Client


def attribute(
    client: Client, weights: Mapping[str, float], start: str, end: str | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(daily factor exposures, daily attribution) of a book held at constant `weights`.

    The model's beta at date t is estimated with data up to t, so the return of the next
    session is attributed with it (as `/resids` does): the loadings are shifted one session.
    """
    tickers = [t.upper() for t in weights]
    factor_returns = client.factor_returns(start, end)
    loadings = client.factor_loadings(tickers, start, end)
    held = loadings.groupby(level="ticker").shift(1).dropna()
    gross = client.gross(tickers, start, end)
    returns = gross.pivot(index="teo", columns="symbol", values="gross_return")
    returns.index = pd.DatetimeIndex(returns.index, name="date")
    dates = (
        returns.dropna()
        .index.intersection(
            held.index.get_level_values("date")
            .value_counts()
            .loc[lambda n: n == len(tickers)]
            .index
        )
        .sort_values()
    )
    weight = pd.Series({t.upper(): float(w) for t, w in weights.items()})
    book = returns.loc[dates, tickers].mul(weight[tickers], axis=1).sum(axis=1)
    positions = pd.Series(
        [weight[t] for _ in dates for t in tickers],
        index=pd.MultiIndex.from_product([dates, tickers], names=["date", "ticker"]),
    )
    return empyrical.perf_attrib(book, positions, factor_returns, held.loc[positions.index])


if __name__ == "__main__":
    book = {k: float(v) for k, v in (arg.split("=") for arg in sys.argv[1:])} or {"AAPL": 1.0}
    exposures, attribution = attribute(Client(), book, "2024-01-02")
    print(attribution[["total_returns", "common_returns", "specific_returns"]].tail())
    print(attribution.sum().to_string())

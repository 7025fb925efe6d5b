"""Market-cap coverage of an ingested data set: which stocks the missing-cap rule will weight.

Group portfolios (a level with no ETF in the data) are weighted by market cap. When only some
stocks have a cap, the model weights each stock without one by the median known cap of its
group that day (`eqrisk.model.returns.group_portfolio`); ingest names those stocks up front.
"""

from __future__ import annotations

import pandas as pd


def uncapped_stocks(symbols: pd.DataFrame, master: pd.DataFrame, etfs: set[str]) -> list[str]:
    """Priced stocks with no market cap at all (no `market_cap` cell, no master share count),
    in a data set where some other stock has one; empty when no stock has a cap (equal
    weights throughout) or every stock has one. `symbols`: per priced symbol (`symbol`) its
    count of rows with a market cap (`capped`)."""
    if symbols.empty:
        return []
    shares = pd.to_numeric(master.set_index("symbol")["shares"], errors="coerce")
    shares = shares[~shares.index.duplicated()]
    capped_rows = symbols.loc[symbols["capped"].to_numpy() > 0, "symbol"]
    kinds = master.drop_duplicates("symbol").set_index("symbol")["asset_type"]
    names = pd.Index(symbols["symbol"].astype(str))
    kind = kinds.reindex(names)
    # A stock: so said by the master, or no master row and no known ETF (unclassified stock).
    is_stock = kind.eq("stock").fillna(False).to_numpy(bool) | (
        kind.isna().to_numpy() & ~names.isin(etfs)
    )
    stocks = names[is_stock]
    has_cap = stocks.isin(capped_rows) | (shares.reindex(stocks).to_numpy() > 0)
    if not has_cap.any() or has_cap.all():
        return []
    return sorted(str(s) for s in stocks[~has_cap])

"""Market-cap coverage of an ingested data set: which stocks the missing-cap rule will weight.

Group portfolios (a level with no ETF in the data) are weighted by market cap. When only some
stocks have a cap, the model weights each stock without one by the median known cap of its
group that day (`eqrisk.model.returns.group_portfolio`); ingest names those stocks up front.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def uncapped_stocks(prices: pd.DataFrame, master: pd.DataFrame, etfs: set[str]) -> list[str]:
    """Priced stocks with no market cap at all (no `market_cap` cell, no master share count),
    in a data set where some other stock has one; empty when no stock has a cap (equal
    weights throughout) or every stock has one."""
    if prices.empty:
        return []
    shares = pd.to_numeric(master.set_index("symbol")["shares"], errors="coerce")
    shares = shares[~shares.index.duplicated()]
    capped_rows = prices.loc[np.isfinite(prices["market_cap"].to_numpy(float)), "symbol"]
    kinds = master.drop_duplicates("symbol").set_index("symbol")["asset_type"]
    symbols = pd.Index(prices["symbol"].unique())
    kind = kinds.reindex(symbols)
    # A stock: so said by the master, or no master row and no known ETF (unclassified stock).
    is_stock = kind.eq("stock").fillna(False).to_numpy(bool) | (
        kind.isna().to_numpy() & ~symbols.isin(etfs)
    )
    stocks = symbols[is_stock]
    has_cap = stocks.isin(capped_rows.unique()) | (shares.reindex(stocks).to_numpy() > 0)
    if not has_cap.any() or has_cap.all():
        return []
    return sorted(str(s) for s in stocks[~has_cap])

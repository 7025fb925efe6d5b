"""One index per snapshot version: built once by `Snapshot.index`, kept with the version, and
its lookups agree with the snapshot's own tables and arrays."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from eqrisk.snapshot.index import RECENT_SESSIONS, minus_years
from eqrisk.snapshot.versions import Snapshot, SnapshotStore


def test_the_index_is_built_once_per_snapshot_object(demo_home: Path) -> None:
    snap = SnapshotStore(demo_home).current()
    assert snap.index is snap.index
    again = Snapshot.open(snap.path)  # another reader of the same version builds its own
    assert again.index is not snap.index
    assert again.index.tickers == snap.index.tickers


def test_lookups_agree_with_the_symbols_table_and_arrays(demo_home: Path) -> None:
    snap = SnapshotStore(demo_home).current()
    idx = snap.index
    assert idx.row_of == snap.row_of
    table = snap.symbols
    for ticker, row in snap.row_of.items():
        assert idx.by_row.tickers[row] == ticker
        assert idx.by_row.is_stock[row] == (table.loc[ticker, "asset_type"] == "stock")
        sym = idx.symbols[ticker]
        priced = np.flatnonzero(np.isfinite(snap.array("price_close")[row]))
        assert (sym.first, sym.last) == ((priced[0], priced[-1]) if len(priced) else (-1, -1))
    assert idx.market_factor in idx.factor_names
    assert idx.data_as_of == snap.sessions[-1].astype(object)
    assert idx.day[-1] == str(idx.data_as_of)


def test_heatmap_order_is_recent_stocks_by_market_cap(demo_home: Path) -> None:
    idx = SnapshotStore(demo_home).current().index
    caps = idx.latest_cap[idx.heatmap_order]
    assert len(caps) > 0 and np.all(np.diff(caps) <= 0)
    for pos in idx.heatmap_order:
        sym = idx.symbols[idx.tickers[pos]]
        assert sym.asset_type == "stock" and sym.last >= idx.n_sessions - RECENT_SESSIONS


def test_year_windows_start_the_day_after_the_same_date_years_earlier(demo_home: Path) -> None:
    idx = SnapshotStore(demo_home).current().index
    assert idx.data_as_of is not None
    lo, hi, start, end = idx.window(1)
    first_day = minus_years(idx.data_as_of, 1)
    assert end == idx.data_as_of and hi == idx.n_sessions
    assert start.toordinal() == first_day.toordinal() + 1
    assert idx.sessions[lo] > np.datetime64(first_day)
    assert lo == 0 or idx.sessions[lo - 1] <= np.datetime64(first_day)

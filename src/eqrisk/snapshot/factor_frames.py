"""A version's factor returns and loadings as the two frames notebook tools take, for the whole
universe (`eqrisk export factors`).

The layout is the client's (`Client.factor_returns`, `Client.factor_loadings`, documented in
`eqrisk.client.factors`): date x factor, and (date, ticker) x factor with each symbol's beta to
`Mkt` and to its own sector's factor, 0.0 to the other sectors, NaN where no beta is published;
then, where the version has the risk model's second layer, a column per style factor (its
returns; a stock's loading is its style exposure, 0.0 on sessions it is outside the layer; see
`style_series` for the timing). Here the frames come from the version's arrays in one pass instead of per-route answers; the
tests hold the two equal.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from eqrisk.model.run import MARKET_FACTOR
from eqrisk.snapshot.style_series import in_layer, style_loadings, style_names, style_returns
from eqrisk.snapshot.versions import Snapshot

RETURNS_FILE, LOADINGS_FILE = "factor_returns.parquet", "factor_loadings.parquet"


def _order(names: list[str]) -> list[int]:
    """Factor positions with `Mkt` first, the others in the version's order."""
    return sorted(range(len(names)), key=lambda k: (names[k] != MARKET_FACTOR, k))


def factor_returns_frame(snap: Snapshot) -> pd.DataFrame:
    """date x factor over the sessions where any factor has a return."""
    names = snap.factor_names
    order = _order(names)
    styles = style_names(snap.manifest)
    values = np.asarray(snap.factor_returns, dtype=np.float64)[order].T
    if styles:
        values = np.hstack([values, style_returns(snap, 0, len(snap.sessions))])
    keep = np.isfinite(values).any(axis=1)
    frame = pd.DataFrame(
        values[keep],
        index=pd.DatetimeIndex(pd.to_datetime(snap.sessions)[np.flatnonzero(keep)], name="date"),
        columns=pd.Index([names[k] for k in order] + styles, name="factor"),
    )
    return frame


def factor_loadings_frame(snap: Snapshot) -> pd.DataFrame:
    """(date, ticker) x factor for every symbol on every session with a published beta or a
    style loading."""
    names = snap.factor_names
    order = _order(names)
    styles = style_names(snap.manifest)
    column_of = {k: j for j, k in enumerate(order)}
    index = snap.index
    exposure = index.by_row.exposure
    tickers = index.by_row.tickers
    rows = np.argsort(tickers.astype(str), kind="stable")  # tickers ascending
    mkt = np.asarray(snap.array("beta_mkt")[rows, :], dtype=np.float64)
    sec = np.asarray(snap.array("beta_sec")[rows, :], dtype=np.float64)
    own = exposure[rows]
    published = np.isfinite(mkt) | (np.isfinite(sec) & (own >= 0)[:, None])
    if styles:
        style = style_loadings(snap, rows, 0, mkt.shape[1])  # (symbols, sessions, S)
        styled = in_layer(style)
        published |= styled
    # Date-major, tickers ascending within a date: the order of a sorted (date, ticker) index.
    t, i = np.nonzero(published.T)
    values = np.zeros((len(t), len(names) + len(styles)), dtype=np.float64)
    values[:, column_of[names.index(MARKET_FACTOR)]] = mkt[i, t]
    exposed = own[i] >= 0
    cols = np.array([column_of[k] for k in own[i][exposed]], dtype=np.int64)
    values[np.flatnonzero(exposed), cols] = sec[i[exposed], t[exposed]]
    if styles:
        values[:, len(names) :] = np.where(styled[i, t][:, None], style[i, t], 0.0)
    dates = pd.to_datetime(snap.sessions)
    frame_index = pd.MultiIndex.from_arrays(
        [dates[t], tickers[rows][i].astype(object)], names=["date", "ticker"]
    )
    return pd.DataFrame(
        values,
        index=frame_index,
        columns=pd.Index([names[k] for k in order] + styles, name="factor"),
    )


def export_factors(snap: Snapshot, out: Path) -> list[Path]:
    """Both frames as Parquet files in the folder `out` (created); returns the files."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, frame in (
        (RETURNS_FILE, factor_returns_frame(snap)),
        (LOADINGS_FILE, factor_loadings_frame(snap)),
    ):
        target = out / name
        frame.to_parquet(target)
        written.append(target)
    return written

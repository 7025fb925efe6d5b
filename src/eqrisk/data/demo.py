"""A deterministic synthetic market with a known factor structure, for demos and model tests.

Why synthetic: the risk model must be checked against betas that are *known*, and the demo must
run without any vendor data. Every stock's daily simple return is built directly on the ETF
returns that the ETFs' own price series show,

    r = alpha + hr_mkt * SPY + hr_sec * sector_ETF + hr_sub * subsector_ETF + eps,

so `true_betas` are exactly the coefficients of a multiple regression of the stock's return on
(1, SPY, sector ETF, subsector ETF); only the noise `eps` (independent of the ETFs) separates an
estimate from the truth. The market factor has fat tails (Student-t, df 4) and GARCH(1,1)
volatility clustering; sector and subsector ETFs add their own factors on top of it.

The data also carries what real data carries and an ingest must handle: late listings,
delistings, isolated missing sessions (halts), NVDA and TSLA splits (raw prices jump, the
adjusted close does not), OHLC and volume. Everything comes from one `np.random.default_rng(seed)`
drawn in a fixed order, so a seed always gives identical frames.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from eqrisk.data.calendar import sessions_between
from eqrisk.data.demo_blocks import (
    MARKET_ETF,
    MAX_MOVE,
    VENDOR_COLUMNS,
    draw_betas,
    etf_returns,
    etf_start_prices,
    etf_table,
    halt_sessions,
    listing_windows,
    make_ohlcv,
    market_factor,
    price_targets,
    solve_alpha,
    split_factors,
    stock_table,
    t_shocks,
)
from eqrisk.data.master import Mappings
from eqrisk.data.panel import RAW_MASTER_COLUMNS

DATA_SOURCE = "demo-synthetic"


@dataclass(frozen=True)
class DemoMarket:
    """The synthetic market: long price frame, raw master and the betas that generated it."""

    # long: date, symbol, close (split-adjusted), open, high, low, close_raw, volume (raw columns
    # are "as traded"); sorted by symbol then date
    prices: pd.DataFrame
    # raw master, columns store.RAW_MASTER_COLUMNS; shares NaN for ETFs
    master: pd.DataFrame
    # one row per stock: symbol, market_etf, sector_etf, subsector_etf (None if none), hr_mkt,
    # hr_sec, hr_sub (NaN without subsector ETF), idio_vol (daily std of eps)
    true_betas: pd.DataFrame


def generate_demo(seed: int = 7, start: str = "2014-01-02", end: str = "2026-10-30") -> DemoMarket:
    """Build the synthetic market on the NYSE sessions from `start` to `end` (inclusive)."""
    rng = np.random.default_rng(seed)
    sessions = sessions_between(start, end)
    n_t = len(sessions)
    if n_t < 1000:
        raise ValueError(
            f"the demo needs at least 1000 sessions (about 4 years) for its late listings and "
            f"delistings; {start}..{end} has {n_t}"
        )
    mappings = Mappings.load()
    etfs = etf_table(mappings)
    market, regime = market_factor(rng, n_t)
    etf_ret, etf_mkt_beta = etf_returns(rng, etfs, market, regime)
    stocks = stock_table(rng, mappings, set(etfs["symbol"]))
    n_s = len(stocks)

    # Betas, then the stocks' returns on the ETF returns themselves.
    hr = draw_betas(rng, stocks, etfs, etf_mkt_beta)
    pos = {s: i for i, s in enumerate(etfs["symbol"])}
    mkt_i = np.full(n_s, pos[MARKET_ETF])
    sec_i = stocks["sector_etf"].map(pos).to_numpy(int)
    has_sub = stocks["subsector_etf"].notna().to_numpy()
    sub_i = np.where(has_sub, stocks["subsector_etf"].map(pos).fillna(0).to_numpy(int), 0)
    hr_sub_used = np.where(has_sub, hr[:, 2], 0.0)
    systematic = (
        hr[:, [0]] * etf_ret[mkt_i]
        + hr[:, [1]] * etf_ret[sec_i]
        + hr_sub_used[:, None] * etf_ret[sub_i]
    )
    idio = stocks["idio_vol"].to_numpy(float)
    eps = idio[:, None] * t_shocks(rng, (n_s, n_t), clip=10.0)
    # Cap the (practically never reached) extreme days; eps is then what makes the sum.
    x = np.clip(systematic + eps, -MAX_MOVE, MAX_MOVE)

    first, last = listing_windows(rng, stocks, n_t)
    halts = halt_sessions(rng, stocks, first, last, n_t)
    t_idx = np.arange(n_t)
    live = (t_idx[None, :] > first[:, None]) & (t_idx[None, :] <= last[:, None])  # has a return
    years = (last - first) / 252.0
    p0, p1, shares = price_targets(rng, stocks, years)
    stocks["shares"] = shares
    alpha = solve_alpha(x, live, np.log(p1 / p0))
    r = np.where(live, alpha[:, None] + x, 0.0)
    adj = p0[:, None] * np.cumprod(1.0 + r, axis=1)
    present = (t_idx[None, :] >= first[:, None]) & (t_idx[None, :] <= last[:, None])
    for i, days in halts.items():
        present[i, days] = False

    # ETFs: full history from the first session.
    etf_p0 = etf_start_prices(rng, etfs)
    etf_r = etf_ret.copy()
    etf_r[:, 0] = 0.0
    etf_adj = etf_p0[:, None] * np.cumprod(1.0 + etf_r, axis=1)

    symbols = np.concatenate([etfs["symbol"].to_numpy(object), stocks["symbol"].to_numpy(object)])
    factor = split_factors(symbols, sessions)
    # Prices as a vendor's file carries them (no float noise such as 160.00000000004465): the
    # traded close to 4 decimals, the adjusted close that close over the split factor, to 6.
    close_raw = np.round(np.vstack([etf_adj, adj]) * factor, 4)
    adj_all = np.round(close_raw / factor, 6)
    ret_all = np.vstack([etf_r, r])
    present_all = np.vstack([np.ones_like(etf_adj, dtype=bool), present])
    first_all = np.concatenate([np.zeros(len(etfs), int), first])
    vol_base = np.concatenate(
        [
            etfs["volume"].to_numpy(float),
            (stocks["shares"] * stocks["turnover"]).to_numpy(float),
        ]
    )
    ohlcv = make_ohlcv(rng, adj_all, close_raw, ret_all, first_all, factor, vol_base)

    order = np.argsort(symbols, kind="stable")
    mask = present_all[order]
    rows, cols = np.nonzero(mask)
    sym_sorted = symbols[order]
    prices = pd.DataFrame(
        {
            "date": sessions.to_numpy()[cols],
            "symbol": sym_sorted[rows],
            "close": adj_all[order][mask],
            "open": ohlcv["open"][order][mask],
            "high": ohlcv["high"][order][mask],
            "low": ohlcv["low"][order][mask],
            "close_raw": ohlcv["close_raw"][order][mask],
            "volume": ohlcv["volume"][order][mask],
        }
    )
    prices["symbol"] = prices["symbol"].astype(str)

    master = pd.concat(
        [
            pd.DataFrame(
                {
                    "symbol": etfs["symbol"],
                    "name": etfs["name"],
                    "asset_type": "etf",
                    "gics_sector": etfs["gics_sector"],
                    "gics_sub_industry": etfs["gics_sub_industry"],
                    "shares": np.nan,
                }
            ),
            pd.DataFrame(
                {
                    "symbol": stocks["symbol"],
                    "name": stocks["name"],
                    "asset_type": "stock",
                    "gics_sector": stocks["gics_sector"],
                    "gics_sub_industry": stocks["gics_sub_industry"],
                    "shares": stocks["shares"].astype(float),
                }
            ),
        ],
        ignore_index=True,
    )[RAW_MASTER_COLUMNS]
    true_betas = pd.DataFrame(
        {
            "symbol": stocks["symbol"],
            "market_etf": MARKET_ETF,
            "sector_etf": stocks["sector_etf"],
            "subsector_etf": stocks["subsector_etf"],
            "hr_mkt": hr[:, 0],
            "hr_sec": hr[:, 1],
            "hr_sub": np.where(has_sub, hr[:, 2], np.nan),
            "idio_vol": idio,
        }
    ).reset_index(drop=True)
    return DemoMarket(prices=prices, master=master, true_betas=true_betas)


def write_demo_files(market: DemoMarket, folder: Path) -> dict[str, Path]:
    """Write prices as a long CSV.gz (columns date,symbol,open,high,low,close,adjusted_close,volume:
    here `close` is the RAW close and `adjusted_close` the adjusted one, exactly like a vendor file)
    and the master as CSV (columns symbol,name,asset_type,gics_sector,gics_sub_industry,shares), so
    the demo goes through the same ingest path a user's file would. Returns {'prices': path,
    'master': path}.

    Floats are written at full precision (round-trip exact) and the gzip header carries no
    timestamp, so the same market always gives byte-identical files.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    prices_path = folder / "demo_prices.csv.gz"
    master_path = folder / "demo_master.csv"
    _write_prices(market.prices, prices_path)
    market.master[RAW_MASTER_COLUMNS].to_csv(master_path, index=False)
    return {"prices": prices_path, "master": master_path}


def _write_prices(p: pd.DataFrame, path: Path) -> None:
    """The long vendor layout (VENDOR_COLUMNS; `close` raw, `adjusted_close` adjusted), gzipped
    without a timestamp when `path` ends in .gz."""
    table = pa.table(
        {
            "date": pa.array(p["date"].to_numpy().astype("datetime64[D]")),  # ISO YYYY-MM-DD
            "symbol": pa.array(p["symbol"].to_numpy(object), pa.string()),
            "open": pa.array(p["open"].to_numpy(float)),
            "high": pa.array(p["high"].to_numpy(float)),
            "low": pa.array(p["low"].to_numpy(float)),
            "close": pa.array(p["close_raw"].to_numpy(float)),
            "adjusted_close": pa.array(p["close"].to_numpy(float)),
            "volume": pa.array(np.round(p["volume"].to_numpy(float)).astype(np.int64)),
        }
    )
    header = (",".join(VENDOR_COLUMNS) + "\n").encode()
    options = pacsv.WriteOptions(include_header=False, quoting_style="none")
    with path.open("wb") as raw:
        if path.suffix != ".gz":
            raw.write(header)
            pacsv.write_csv(table, cast(IO[bytes], raw), options)
            return
        # Arrow's CSV writer is ~10x faster than pandas' and writes the shortest round-trip
        # repr of each double; gzip level 3 trades a little size for speed.
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=3, mtime=0) as gz:
            gz.write(header)
            pacsv.write_csv(table, cast(IO[bytes], gz), options)


EXPORT_NEW_DAYS = 5  # sessions `export_demo_files` holds back for the daily-job example
EXPORT_FILES = {"prices": "prices.csv.gz", "new_days": "new_days.csv", "master": "master.csv"}


def export_demo_files(
    market: DemoMarket, folder: Path, new_days: int = EXPORT_NEW_DAYS
) -> dict[str, Path]:
    """The demo market as a user's own files, in the README's ingest layouts: `prices.csv.gz`
    (every session but the last `new_days`), `new_days.csv` (those last sessions: the file of a
    daily update) and `master.csv` (the security master). Ingesting `prices.csv.gz` and
    `new_days.csv` with `master.csv` gives the demo's data set. Returns {'prices', 'new_days',
    'master'} -> path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    p = market.prices
    if not 0 < new_days < p["date"].nunique():
        raise ValueError(f"new_days must be between 1 and the sessions less one, got {new_days}")
    cut = np.sort(p["date"].unique())[-new_days]
    paths = {name: folder / file for name, file in EXPORT_FILES.items()}
    _write_prices(p[p["date"] < cut], paths["prices"])
    _write_prices(p[p["date"] >= cut], paths["new_days"])
    market.master[RAW_MASTER_COLUMNS].to_csv(paths["master"], index=False)
    return paths

"""Security master: the project's own reference data and the classification of every symbol.

The reference tables (`reference/*.csv`) are data the project owns: GICS sector -> SPDR sector ETF
(with the GICS 2-digit code and the Service A factor name), GICS sub-industry -> subsector ETF, and
a registry of known ETFs that classify themselves. A user overrides either mapping with a CSV of
the same columns (settings `sector_map` / `subsector_map`). `gics_renames.csv` maps the GICS names
retired since 2016 (the 2018 Communication Services change, the 2023 sub-industry changes) to
their current names, so that an older master keeps its sector and subsector levels.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd

MAG7: tuple[str, ...] = ("AAPL", "MSFT", "GOOGL", "AMZN", "NVDA", "META", "TSLA")

MASTER_COLUMNS = [
    "symbol",
    "name",
    "asset_type",
    "gics_sector",
    "gics_sub_industry",
    "sector_code",
    "factor_name",
    "market_etf",
    "sector_etf",
    "subsector_etf",
    "shares",
]
ASSET_TYPES = ("stock", "etf", "index")


def _read_reference(name: str) -> pd.DataFrame:
    with resources.files("eqrisk.data").joinpath("reference", name).open("rb") as fh:
        return pd.read_csv(fh, dtype=str, keep_default_na=False)


@lru_cache(maxsize=1)
def etf_registry() -> pd.DataFrame:
    """Known ETFs: symbol, name, role (market/sector/subsector/industry/...), sector, sub-industry."""
    return _read_reference("etfs.csv")


@lru_cache(maxsize=1)
def sector_table() -> pd.DataFrame:
    """GICS sectors with their 2-digit code, Service A factor name and SPDR sector ETF."""
    table = _read_reference("sectors.csv")
    table["sector_code"] = table["sector_code"].astype(str)
    return table


@lru_cache(maxsize=1)
def gics_renames() -> dict[tuple[str, str], str]:
    """(level `sector`|`sub_industry`, retired name lower-cased) -> current GICS name."""
    table = _read_reference("gics_renames.csv")
    return {
        (level, old.strip().lower()): new.strip()
        for level, old, new in zip(
            table["level"], table["old_name"], table["current_name"], strict=True
        )
    }


def current_gics(level: str, name: str) -> str:
    """A sector or sub-industry name as GICS names it today (unchanged when not retired)."""
    return gics_renames().get((level, name.strip().lower()), name)


def group_keys(info: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Which group portfolio each row of a classified master joins where its ETF is not in the
    data: groups are per ETF, so that two names mapping to one ETF share one group. Sector: the
    sector ETF, else (no mapping) the sector name; subsector: the subsector ETF, else none (no
    subsector level). None where the row has no such level."""
    sectors = info["gics_sector"].to_numpy(dtype=object)
    sector_etfs = info["sector_etf"].to_numpy(dtype=object)
    sub_etfs = info["subsector_etf"].to_numpy(dtype=object)
    sector_key = np.array(
        [
            e if isinstance(e, str) and e else (s if isinstance(s, str) and s else None)
            for s, e in zip(sectors, sector_etfs, strict=True)
        ],
        dtype=object,
    )
    sub_key = np.array(
        [
            e if isinstance(e, str) and e and k is not None else None
            for e, k in zip(sub_etfs, sector_key, strict=True)
        ],
        dtype=object,
    )
    return sector_key, sub_key


@dataclass(frozen=True)
class Mappings:
    """The sector and sub-industry -> ETF mappings in force for one build."""

    sector_etf: dict[str, str]
    subsector_etf: dict[str, str]

    @classmethod
    def load(cls, sector_map: Path | None = None, subsector_map: Path | None = None) -> Mappings:
        sectors = sector_table()
        sector_etf = dict(zip(sectors["gics_sector"], sectors["etf"], strict=True))
        if sector_map is not None:
            sector_etf.update(_read_override(sector_map, "gics_sector"))
        sub = _read_reference("subindustry_etfs.csv")
        subsector_etf = dict(zip(sub["gics_sub_industry"], sub["etf"], strict=True))
        if subsector_map is not None:
            subsector_etf.update(_read_override(subsector_map, "gics_sub_industry"))
        # An empty ETF in an override removes the mapping (the level falls back or stops).
        return cls(
            sector_etf={k: v for k, v in sector_etf.items() if v},
            subsector_etf={k: v for k, v in subsector_etf.items() if v},
        )


def _read_override(path: Path, key: str) -> dict[str, str]:
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = {key, "etf"} - set(table.columns)
    if missing:
        raise ValueError(
            f"{path}: mapping override needs columns {key!r} and 'etf'; missing {sorted(missing)}"
        )
    return dict(zip(table[key].str.strip(), table["etf"].str.strip().str.upper(), strict=True))


def priced_master(master: pd.DataFrame, symbols: Iterable[str]) -> pd.DataFrame:
    """The raw master of the symbols that have prices: their rows, then a stock row for each
    priced symbol the master lacks (a registry ETF among them classifies itself; the others
    are unclassified stocks, market level only)."""
    present = pd.Index(sorted(set(symbols)))
    missing = present.difference(pd.Index(master["symbol"].astype(str)))
    if len(missing):
        extra = pd.DataFrame({"symbol": missing, "asset_type": "stock"})
        master = pd.concat([master, extra], ignore_index=True)
    return master[master["symbol"].isin(present)]


def classify(master: pd.DataFrame, mappings: Mappings, *, market_etf: str = "SPY") -> pd.DataFrame:
    """Complete a raw master (symbol, name, asset_type, gics_sector, gics_sub_industry, [shares])
    with sector code, factor name and the market/sector/subsector ETF of each symbol.

    Symbols of the ETF registry classify themselves, whatever the raw master says. The
    classification of the last master and mappings is kept: the daily job's ingest (its
    levels report) and its build ask for the same one, computed once (`_classified`).
    """
    rows = [_row_inputs(rec) for rec in _records(master)]
    key = (tuple(rows), tuple(sorted(mappings.sector_etf.items())),
           tuple(sorted(mappings.subsector_etf.items())))  # fmt: skip
    if _LAST.get("key") != key:
        _LAST.clear()
        _LAST.update(key=key, table=_classified(rows, mappings))
    out = cast(pd.DataFrame, _LAST["table"]).copy()
    etf = [market_etf if s != market_etf else None for s in out["symbol"]]
    out["market_etf"] = pd.Series(etf, index=out.index, dtype=object)
    return out


# The last classification: {"key": (the master's rows as read, the mappings), "table": ...}.
_LAST: dict[str, object] = {}

# What a master row says, as classification reads it.
_Row = tuple[str, str, str, str, str, float | None]


def _records(frame: pd.DataFrame) -> list[dict[Hashable, object]]:
    """The rows of `frame` as dicts of its columns' lists: `to_dict("records")` but for a
    missing string, pd.NA where it gives None (`_row_inputs` reads both as missing), without
    pandas boxing each cell on its own (0.02 s a call for a master of 5,000 rows)."""
    names = list(frame.columns)
    if not names:
        return [{} for _ in range(len(frame))]
    columns = [frame[c].tolist() for c in names]
    return [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]


def _row_inputs(rec: dict[Hashable, object]) -> _Row:
    return (
        _text(rec.get("symbol")).upper(),
        _text(rec.get("name")),
        _text(rec.get("asset_type")).lower() or "stock",
        current_gics("sector", _text(rec.get("gics_sector"))),
        current_gics("sub_industry", _text(rec.get("gics_sub_industry"))),
        _float_or_none(rec.get("shares")),
    )


def _classified(rows: list[_Row], mappings: Mappings) -> pd.DataFrame:
    """The classified master of `rows` (MASTER_COLUMNS; market_etf left to `classify`)."""
    # Plain dicts: a pandas lookup per row costs 5,000 symbols 0.4 s.
    registry = etf_registry().set_index("symbol")[["name", "gics_sector", "gics_sub_industry"]]
    etfs = {str(k): v for k, v in registry.to_dict("index").items()}
    table = sector_table()
    code_of = dict(zip(table["gics_sector"], table["sector_code"], strict=True))
    factor_of = dict(zip(table["gics_sector"], table["factor_name"], strict=True))
    out_rows = []
    for symbol, name, asset_type, sector, sub, shares in rows:
        if symbol in etfs:
            reg = etfs[symbol]
            asset_type = "etf"
            name = name or cast(str, reg["name"])
            sector = cast(str, reg["gics_sector"])
            sub = cast(str, reg["gics_sub_industry"])
        is_stock = asset_type == "stock"
        out_rows.append(
            {
                "symbol": symbol,
                "name": name or symbol,
                "asset_type": asset_type,
                "gics_sector": sector or None,
                "gics_sub_industry": sub or None,
                "sector_code": code_of.get(sector),
                "factor_name": factor_of.get(sector),
                "market_etf": None,
                "sector_etf": mappings.sector_etf.get(sector) if is_stock else None,
                "subsector_etf": mappings.subsector_etf.get(sub) if is_stock else None,
                "shares": shares,
            }
        )
    # Object columns keep None as None (the string dtype would turn it into NaN).
    out = pd.DataFrame(out_rows, columns=MASTER_COLUMNS, dtype=object)
    out["shares"] = out["shares"].astype(float)
    return out.drop_duplicates("symbol", keep="first").sort_values("symbol", ignore_index=True)


def _text(value: object) -> str:
    """A master cell as stripped text; missing (None, NaN, NA) is ''."""
    if value is None or (isinstance(value, float) and value != value) or value is pd.NA:
        return ""
    return str(value).strip()


def _float_or_none(value: object) -> float | None:
    try:
        out = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return out if out == out and out > 0 else None

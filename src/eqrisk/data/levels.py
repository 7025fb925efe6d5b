"""Which stocks will lack a sector (L2) or subsector (L3) level, and why: the ingest report lists
every one (`levels.csv`), so that no level is lost silently.

The rules are the model layout's (`model.layout.factor_layout`): a level is hedged with its ETF
when the prices hold it, else with a group portfolio of the stocks that map to that ETF
(`master.group_keys`: per ETF, not per name) when the group has at least two (sector) or three
(subsector) stocks; L3 needs L2. Whether a level is published at a date also needs `min_obs`
joint observations, which the build decides.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pandas as pd

from eqrisk.data.master import Mappings, classify, etf_registry, group_keys, priced_master

LEVEL_COLUMNS = ["symbol", "level", "gics_sector", "gics_sub_industry", "why"]
MIN_SECTOR_GROUP, MIN_SUBSECTOR_GROUP = 2, 3
NO_MASTER_ROW = "no row in the security master"  # reported as MISSING_FROM_MASTER too


def missing_levels(
    master: pd.DataFrame, price_symbols: set[str], mappings: Mappings
) -> pd.DataFrame:
    """One row per (stock with prices, level it will not have): LEVEL_COLUMNS."""
    registry = set(etf_registry()["symbol"])
    rows: list[dict[str, object]] = [
        {"symbol": s, "level": "L2+L3", "gics_sector": None, "gics_sub_industry": None,
         "why": NO_MASTER_ROW}
        for s in sorted(price_symbols - set(master["symbol"]) - registry)
    ]  # fmt: skip
    # The build's classification (`priced_master`): the daily job classifies the master once.
    info = classify(priced_master(master, price_symbols), mappings)
    info = info[(info["asset_type"] == "stock") & info["symbol"].isin(set(master["symbol"]))]
    info = info.reset_index(drop=True)
    sector_key, sub_key = group_keys(info)
    sector_size = Counter(k for k in sector_key if k is not None)
    sub_size = Counter(k for k in sub_key if k is not None)
    for i, rec in enumerate(info.to_dict("records")):
        sector, sub = rec["gics_sector"], rec["gics_sub_industry"]
        why_l2 = _sector_gap(sector, rec["sector_etf"], sector_size[sector_key[i]], price_symbols)
        if why_l2 is not None:
            rows.append(_row(rec, "L2+L3", why_l2))
            continue
        why_l3 = _subsector_gap(sub, rec["subsector_etf"], sub_size[sub_key[i]], price_symbols)
        if why_l3 is not None:
            rows.append(_row(rec, "L3", why_l3))
    return pd.DataFrame(rows, columns=LEVEL_COLUMNS)


def _row(rec: dict[Any, Any], level: str, why: str) -> dict[str, object]:
    return {
        "symbol": rec["symbol"],
        "level": level,
        "gics_sector": rec["gics_sector"],
        "gics_sub_industry": rec["gics_sub_industry"],
        "why": why,
    }


def _sector_gap(sector: object, etf: object, size: int, priced: set[str]) -> str | None:
    if not isinstance(sector, str):
        return "no GICS sector in the master"
    if isinstance(etf, str) and etf in priced:
        return None
    if size >= MIN_SECTOR_GROUP:
        return None
    if isinstance(etf, str):
        return f"sector ETF {etf} not in the prices and no other stock maps to it (no group)"
    return (
        f"sector {sector!r} is no GICS sector (no ETF; see gics_renames.csv) and no other "
        "stock has it (no group)"
    )


def _subsector_gap(sub: object, etf: object, size: int, priced: set[str]) -> str | None:
    if not isinstance(sub, str):
        return "no GICS sub-industry in the master"
    if not isinstance(etf, str):
        return f"sub-industry {sub!r} maps to no subsector ETF (subindustry_etfs.csv)"
    if etf in priced or size >= MIN_SUBSECTOR_GROUP:
        return None
    return (
        f"subsector ETF {etf} not in the prices and only {size} stock(s) map to it (a group "
        f"needs {MIN_SUBSECTOR_GROUP})"
    )


def level_issue(levels: pd.DataFrame) -> tuple[int, list[dict[str, object]]]:
    """The LEVEL_MISSING count (stocks of the master: those without a master row are
    MISSING_FROM_MASTER) and its examples."""
    classified = levels[levels["why"] != NO_MASTER_ROW]
    return classified["symbol"].nunique(), level_examples(classified)


def level_examples(levels: pd.DataFrame, k: int = 5) -> list[dict[str, object]]:
    """The report's examples: the first stocks of each distinct reason first."""
    if levels.empty:
        return []
    first = levels.drop_duplicates("why")
    rest = levels.drop(first.index)
    picked = pd.concat([first, rest]).head(k)
    return [
        {"symbol": r["symbol"], "level": r["level"], "why": r["why"]}
        for r in picked.replace({np.nan: None}).to_dict("records")
    ]

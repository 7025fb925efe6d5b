"""The factor layout: which factor series (an ETF, or a group portfolio of the stocks in a sector
or subsector) hedges each row at each level, and the leave-one-out rows a stock in a group
portfolio is regressed on. The first step of the model run; pure, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from eqrisk.data.master import group_keys
from eqrisk.data.panel import Panel
from eqrisk.model.returns import GroupPortfolio, group_portfolio


@dataclass(frozen=True)
class FactorLayout:
    """Which factor series each row is hedged with.

    `factors`/`fidx` are the published series: the ETFs, or a level's whole group portfolio.
    `model_factors`/`model_fidx` are what each row is regressed on: the same, except that a
    stock in a group portfolio is regressed on its group without itself (leave-one-out), so
    that its own return never explains itself.
    """

    factors: np.ndarray  # (F x T)
    keys: list[str]  # name of each published row (ETF symbol or "group:<level>:<name>")
    fidx: np.ndarray  # (n x 3) published row of each level, -1 = none
    model_factors: np.ndarray  # (F + L x T): published rows, then leave-one-out rows
    model_fidx: np.ndarray  # (n x 3)
    caps_imputed: list[str]  # stocks weighted by the missing-cap rule in some group


def factor_layout(panel: Panel, info: pd.DataFrame, r: np.ndarray) -> FactorLayout:
    """The hierarchy of every row: market, sector and subsector series (ETF or group)."""
    n, n_t = r.shape
    row_of = panel.index_of()
    rows: list[np.ndarray] = []
    keys: dict[str, int] = {}
    groups: dict[int, GroupPortfolio] = {}

    def factor(name: object, level: str, group_key: str | None, members: np.ndarray) -> int:
        if isinstance(name, str) and name in row_of:
            if name not in keys:
                keys[name] = len(rows)
                rows.append(r[row_of[name]])
            return keys[name]
        if group_key is None or members.size == 0:
            return -1
        key = f"group:{level}:{group_key}"
        if key not in keys:
            keys[key] = len(rows)
            group = group_portfolio(r, members, panel.market_cap)
            groups[keys[key]] = group
            rows.append(group.full())
        return keys[key]

    asset_type = info["asset_type"].fillna("stock").to_numpy()
    is_stock = asset_type == "stock"
    sectors = info["gics_sector"].to_numpy(dtype=object)
    subs = info["gics_sub_industry"].to_numpy(dtype=object)
    sector_etfs = info["sector_etf"].tolist()  # lists: a pandas lookup per row is slow
    subsector_etfs = info["subsector_etf"].tolist()
    stock_rows = np.flatnonzero(is_stock)
    market_idx = factor(_first_valid(info["market_etf"]) or "SPY", "market", "all", stock_rows)

    found: dict[tuple[str, str], np.ndarray] = {}
    sector_keys, sub_keys = group_keys(info)

    def members(level: str, keys: np.ndarray, key: str) -> np.ndarray:
        """The stocks of a sector or subsector group (per ETF: `master.group_keys`), found once
        per group (not once per row)."""
        if (level, key) not in found:
            found[(level, key)] = stock_rows[keys[stock_rows] == key]
        return found[(level, key)]

    def label(names: np.ndarray, rows: np.ndarray, key: str) -> str:
        """A group's name: its members' one GICS name, else (several names, one ETF) the ETF."""
        distinct = {str(v) for v in names[rows]}
        return distinct.pop() if len(distinct) == 1 else key

    fidx = np.full((n, 3), -1, dtype=np.int64)
    # Every row, the market's own included, has the market as its first level (the market's own
    # row comes out as beta 1 with all of its risk explained).
    fidx[:, 0] = market_idx
    for i in range(n):
        sec = sectors[i] if isinstance(sectors[i], str) else None
        if not is_stock[i] or sec is None:
            continue
        sec_key = sector_keys[i]
        sec_members = members("sector", sector_keys, sec_key)
        # A group of one is the stock itself: without it nothing is left, so no level.
        s_group = label(sectors, sec_members, sec_key) if len(sec_members) >= 2 else None
        s_idx = factor(sector_etfs[i], "sector", s_group, sec_members)
        if s_idx < 0:
            continue
        fidx[i, 1] = s_idx
        sub = subs[i] if isinstance(subs[i], str) else None
        sub_etf = subsector_etfs[i]
        if sub is None or not isinstance(sub_etf, str):
            continue  # no subsector ETF: the stock stops at L2
        sub_members = members("subsector", sub_keys, sub_etf)
        u_group = label(subs, sub_members, sub_etf) if len(sub_members) >= 3 else None
        u_idx = factor(sub_etf, "subsector", u_group, sub_members)
        if u_idx >= 0:
            fidx[i, 2] = u_idx
    factors = np.vstack(rows) if rows else np.empty((0, n_t))

    model_fidx, loo_rows, imputed = _leave_one_out(groups, fidx, len(rows))
    model_factors = np.vstack([factors, *loo_rows]) if loo_rows else factors
    key_list = [""] * len(keys)
    for key, j in keys.items():
        key_list[j] = key
    return FactorLayout(
        factors=factors,
        keys=key_list,
        fidx=fidx,
        model_factors=np.ascontiguousarray(model_factors),
        model_fidx=model_fidx,
        caps_imputed=sorted(str(panel.symbols[i]) for i in imputed),
    )


def _leave_one_out(
    groups: dict[int, GroupPortfolio], fidx: np.ndarray, n_published: int
) -> tuple[np.ndarray, list[np.ndarray], set[int]]:
    """One leave-one-out row per (stock, group level) that uses a group portfolio: the model's
    factor index of each row (pointing past the `n_published` rows), the extra rows, and the
    rows whose weight came from the missing-cap rule in some group."""
    model_fidx = fidx.copy()
    loo_rows: list[np.ndarray] = []
    imputed: set[int] = set()
    for idx, group in groups.items():
        members = group.members
        imputed.update(members[group.imputed].tolist())
        users = np.flatnonzero((fidx == idx).any(axis=1))
        position = {int(m): j for j, m in enumerate(members.tolist())}
        inside = [i for i in users.tolist() if i in position]
        if not inside:
            continue
        loo = group.leave_one_out()
        for i in inside:
            model_fidx[i, fidx[i] == idx] = n_published + len(loo_rows)
            loo_rows.append(loo[position[i]])
    return model_fidx, loo_rows, imputed


def _first_valid(series: pd.Series) -> str | None:
    for value in series:
        if isinstance(value, str) and value:
            return value
    return None

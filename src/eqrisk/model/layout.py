"""The factor layout: which factor series (an ETF, or a group portfolio of the stocks in a sector
or subsector) hedges each row at each level, and the leave-one-out rows a stock in a group
portfolio is regressed on. The first step of the model run; pure, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

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

    @property
    def leave_one_out_rows(self) -> int:
        return int(self.model_factors.shape[0] - self.factors.shape[0])


class LayoutKeys(Protocol):
    """What a run's result reads of a layout (its published rows' names and who is hedged
    with which): a `FactorLayout`, or one without its leave-one-out rows
    (`plan_slices.LayoutOutline`)."""

    @property
    def keys(self) -> list[str]: ...
    @property
    def fidx(self) -> np.ndarray: ...
    @property
    def caps_imputed(self) -> list[str]: ...
    @property
    def leave_one_out_rows(self) -> int: ...


def hierarchy(symbols: np.ndarray, layout: LayoutKeys) -> pd.DataFrame:
    """Each row's factor key per level (None where the level is absent)."""
    fidx = layout.fidx
    n = fidx.shape[0]
    names = np.full((n, 3), None, dtype=object)
    for i in range(n):
        for j in range(3):
            if fidx[i, j] >= 0:
                names[i, j] = layout.keys[fidx[i, j]]
    return pd.DataFrame(
        {
            "symbol": symbols,
            "market": names[:, 0],
            "sector": names[:, 1],
            "subsector": names[:, 2],
        },
        dtype=object,
    )


@dataclass(frozen=True)
class LayoutShape:
    """The layout without its numbers: what the master and the symbols decide (the factor rows
    and who is hedged with which), so that the rows can be computed one time slice at a time
    (`layout_rows`): a published row is an ETF's returns (`sources[j]` an int, its panel row)
    or a group portfolio (the members' rows); leave-one-out row k is member `loo[k][1]` of
    published row `loo[k][0]` left out."""

    keys: list[str]
    fidx: np.ndarray  # (n x 3)
    model_fidx: np.ndarray  # (n x 3)
    sources: list[int | np.ndarray]
    loo: list[tuple[int, int]]

    @property
    def published(self) -> int:
        return len(self.keys)


def factor_layout(panel: Panel, info: pd.DataFrame, r: np.ndarray) -> FactorLayout:
    """The hierarchy of every row: market, sector and subsector series (ETF or group)."""
    shape = layout_shape(panel.symbols, info)
    factors, model_factors, imputed = layout_rows(shape, r, panel.market_cap)
    return FactorLayout(
        factors=factors,
        keys=shape.keys,
        fidx=shape.fidx,
        model_factors=model_factors,
        model_fidx=shape.model_fidx,
        caps_imputed=sorted(str(panel.symbols[i]) for i in imputed),
    )


def layout_rows(
    shape: LayoutShape, r: np.ndarray, market_cap: np.ndarray
) -> tuple[np.ndarray, np.ndarray, set[int]]:
    """The layout's rows on the sessions of `r` and `market_cap` (n x T each): the published
    rows (F x T), every row the model regresses on ((F + L) x T: the published, then the
    leave-one-out rows) and the rows weighted by the missing-cap rule in some group. Every
    value of a session depends on that session and the MEMBER_VOL_WINDOW + 1 before it only
    (`returns.winsorised_members`), so a time slice with that many sessions of lead gives the
    whole run's values, bit for bit, on the sessions after its lead."""
    n_t = r.shape[1]
    rows: list[np.ndarray] = []
    groups: dict[int, GroupPortfolio] = {}
    imputed: set[int] = set()
    for j, source in enumerate(shape.sources):
        if isinstance(source, int):
            rows.append(r[source])
            continue
        group = group_portfolio(r, source, market_cap)
        groups[j] = group
        imputed.update(source[group.imputed].tolist())
        rows.append(group.full())
    factors = np.vstack(rows) if rows else np.empty((0, n_t))
    left_out: dict[int, np.ndarray] = {}
    loo_rows = []
    for j, position in shape.loo:
        if j not in left_out:
            left_out[j] = groups[j].leave_one_out()
        loo_rows.append(left_out[j][position])
    model_factors = np.vstack([factors, *loo_rows]) if loo_rows else factors
    return factors, np.ascontiguousarray(model_factors), imputed


def layout_shape(symbols: np.ndarray, info: pd.DataFrame) -> LayoutShape:
    """Which series hedges each row at each level (`info`: the classified master of
    `symbols`, in their order): an ETF where the data has it, else a group portfolio."""
    n = len(symbols)
    row_of = {s: i for i, s in enumerate(np.asarray(symbols).tolist())}
    sources: list[int | np.ndarray] = []
    keys: dict[str, int] = {}

    def factor(name: object, level: str, group_key: str | None, members: np.ndarray) -> int:
        if isinstance(name, str) and name in row_of:
            if name not in keys:
                keys[name] = len(sources)
                sources.append(row_of[name])
            return keys[name]
        if group_key is None or members.size == 0:
            return -1
        key = f"group:{level}:{group_key}"
        if key not in keys:
            keys[key] = len(sources)
            sources.append(members)
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

    labels: dict[tuple[str, str], str] = {}

    def label(level: str, names: np.ndarray, rows: np.ndarray, key: str) -> str:
        """A group's name: its members' one GICS name, else (several names, one ETF) the ETF;
        found once per group, like its `members`, not once per row."""
        if (level, key) not in labels:
            distinct = {str(v) for v in names[rows]}
            labels[(level, key)] = distinct.pop() if len(distinct) == 1 else key
        return labels[(level, key)]

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
        s_group = label("sector", sectors, sec_members, sec_key) if len(sec_members) >= 2 else None
        s_idx = factor(sector_etfs[i], "sector", s_group, sec_members)
        if s_idx < 0:
            continue
        fidx[i, 1] = s_idx
        sub = subs[i] if isinstance(subs[i], str) else None
        sub_etf = subsector_etfs[i]
        if sub is None or not isinstance(sub_etf, str):
            continue  # no subsector ETF: the stock stops at L2
        sub_members = members("subsector", sub_keys, sub_etf)
        u_group = label("subsector", subs, sub_members, sub_etf) if len(sub_members) >= 3 else None
        u_idx = factor(sub_etf, "subsector", u_group, sub_members)
        if u_idx >= 0:
            fidx[i, 2] = u_idx
    key_list = [""] * len(keys)
    for key, j in keys.items():
        key_list[j] = key
    model_fidx, loo = _leave_one_out(sources, fidx)
    return LayoutShape(keys=key_list, fidx=fidx, model_fidx=model_fidx, sources=sources, loo=loo)


def _leave_one_out(
    sources: list[int | np.ndarray], fidx: np.ndarray
) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """One leave-one-out row per (stock, group level) that uses a group portfolio: the model's
    factor index of each row (pointing past the published rows) and, per extra row, its group
    (published row) and the member it leaves out."""
    n_published = len(sources)
    model_fidx = fidx.copy()
    loo: list[tuple[int, int]] = []
    for idx, source in enumerate(sources):
        if isinstance(source, int):
            continue
        users = np.flatnonzero((fidx == idx).any(axis=1))
        position = {int(m): j for j, m in enumerate(source.tolist())}
        for i in users.tolist():
            if i in position:
                model_fidx[i, fidx[i] == idx] = n_published + len(loo)
                loo.append((idx, position[i]))
    return model_fidx, loo


def _first_valid(series: pd.Series) -> str | None:
    for value in series:
        if isinstance(value, str) and value:
            return value
    return None

"""`GET /factor_list`: the factors the model has, with their level and ETF (Service A, free).

What `/facts` and `/betas` take in `fact`, listed so that a client never has to provoke a 400 to
learn them: `Mkt` (level L1, the market ETF) first, then each sector factor (level L2) with the
ETF its stocks' sector level uses and the GICS sector it stands for, then, where the version has
the risk model's second layer, each style factor (level `style`, no ETF or sector), each with a
description.
"""

# No `from __future__ import annotations`: pydantic and FastAPI read these annotations.

from collections import Counter

import numpy as np
from starlette.responses import Response

from eqrisk.api.endpoint import Call, Doc, Endpoint
from eqrisk.api.models import FactorListRecord, daily_responses
from eqrisk.api.params import DAILY_FORMATS, FormatField, VersionedParams
from eqrisk.api.plans import market_etfs
from eqrisk.api.service_a import answer
from eqrisk.snapshot.style_series import style_names, style_text
from eqrisk.snapshot.versions import Snapshot

MARKET_LEVEL, SECTOR_LEVEL, STYLE_LEVEL = "L1", "L2", "style"
MARKET_TEXT = "the market: the market ETF's daily return"
SECTOR_TEXT = "GICS sector {}: its sector series cleaned of the market with the link beta"


class FactorListQuery(VersionedParams):
    format: FormatField = None


def _most_common(values: list[str | None]) -> str | None:
    counted = Counter(v for v in values if v)
    return counted.most_common(1)[0][0] if counted else None


def plan_factor_list(snap: Snapshot, q: FactorListQuery) -> dict[str, np.ndarray]:
    """One record per factor, in the model's order with `Mkt` first, the style factors last."""
    universe = snap.index
    members: dict[int, list[tuple[str | None, str | None]]] = {}
    for sym in universe.symbols.values():
        k = int(universe.by_row.exposure[sym.row])
        if k >= 0 and sym.asset_type == "stock":
            members.setdefault(k, []).append((sym.sector_etf, sym.sector))
    names: list[str] = []
    levels: list[str] = []
    etfs: list[str | None] = []
    sectors: list[str | None] = []
    market = market_etfs(universe)
    for k, name in enumerate(universe.factor_names):
        names.append(name)
        if name == universe.market_factor:
            levels.append(MARKET_LEVEL)
            etfs.append(market[0] if market else None)
            sectors.append(None)
            continue
        pairs = members.get(k, [])
        levels.append(SECTOR_LEVEL)
        etfs.append(_most_common([etf for etf, _ in pairs]))
        sectors.append(_most_common([sector for _, sector in pairs]))
    order = sorted(range(len(names)), key=lambda i: levels[i] != MARKET_LEVEL)
    text = [
        MARKET_TEXT if levels[i] == MARKET_LEVEL else SECTOR_TEXT.format(sectors[i] or names[i])
        for i in order
    ]
    styles = style_names(snap.manifest)
    style_words = style_text(snap.manifest)
    return {
        "fact": np.array([names[i] for i in order] + styles, dtype=object),
        "level": np.array([levels[i] for i in order] + [STYLE_LEVEL] * len(styles), dtype=object),
        "etf": np.array([etfs[i] for i in order] + [None] * len(styles), dtype=object),
        "sector": np.array([sectors[i] for i in order] + [None] * len(styles), dtype=object),
        "description": np.array(text + [style_words.get(s, s) for s in styles], dtype=object),
    }


def render(call: Call[FactorListQuery, dict[str, np.ndarray]]) -> Response:
    """One record per factor the model has, `Mkt` first: `fact` (the name `/facts` and
    `/betas` take), `level` (`L1` the market, `L2` a sector, `style` a style factor of the
    second layer), `etf` (the market ETF, or the sector ETF of the factor's stocks; null where
    the data set has none, and for the styles), `sector` (the GICS sector a sector factor stands
    for; null otherwise) and `description`."""
    return answer(call.request, call.fmt, call.snap.index, call.plan, "factor_list")


ENDPOINT = Endpoint(
    path="/factor_list",
    service="daily",
    price_key="factor_list",
    params=FactorListQuery,
    plan=plan_factor_list,
    formats=DAILY_FORMATS,
    render=render,
    doc=Doc(
        name="factor_list",
        operation_id="factor_list",
        summary="The factors of the model, with their level and ETF",
        response_model=list[FactorListRecord],
        responses=daily_responses(not_found=False),
    ),
)

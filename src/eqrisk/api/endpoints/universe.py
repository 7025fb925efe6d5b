"""`GET /api/industry-panel` and `GET /api/universe/{name}/members`: per GICS sub-industry the
spread of its members' hedge ratios, and the largest-N universes by market cap or dollar volume,
in the real Service B's shapes (docs/decisions/drop-in-routes.md)."""

# No `from __future__ import annotations`: pydantic and FastAPI read these annotations.

import re
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import Field
from starlette.responses import Response

from eqrisk.api.answers import document
from eqrisk.api.endpoint import Call, Doc, Endpoint
from eqrisk.api.endpoints.l3_decomposition import check_market_etf
from eqrisk.api.endpoints.rankings import latest_session
from eqrisk.api.errors import ApiError
from eqrisk.api.models import ERRORS_NO_TICKER
from eqrisk.api.params import IsoDate, Ticker, VersionedParams, path_and_query
from eqrisk.api.plans import NO_CAPS_HINT
from eqrisk.api.sizes import Size
from eqrisk.data.master import MAG7
from eqrisk.snapshot.versions import Snapshot

# level -> the hedge ratio of that level's own ETF
LEVEL_HR = {"market": "l1_mkt_hr", "sector": "l2_sec_hr", "subsector": "l3_sub_hr"}
DOLLAR_VOLUME_SESSIONS = 21
_UNIVERSE = re.compile(r"^uni_(mc|dv)_(50|500|1000|3000)$")


def _stocks_on(snap: Snapshot, t: int) -> list[Any]:
    price = snap.array("price_close")
    return [
        s
        for s in (snap.index.symbols[k] for k in snap.index.tickers)
        if s.asset_type == "stock" and s.first <= t <= s.last and np.isfinite(price[s.row, t])
    ]


class PanelParams(VersionedParams):
    market_factor_etf: Ticker | None = Field(None, description="Only SPY is served.")
    teo: IsoDate | None = Field(None, description="Session (default: data_as_of).")
    level: Literal["market", "sector", "subsector"] | None = Field(
        None, description="One level (default: all three)."
    )
    min_peers: int = Field(1, ge=1, le=10000, description="Leave out smaller industries.")
    by: Literal["level"] = Field("level", description="Only `level` is served (not `fact`).")


@dataclass(frozen=True)
class PanelPlan:
    t: int
    levels: tuple[str, ...]


def plan_panel(snap: Snapshot, p: PanelParams) -> PanelPlan:
    check_market_etf(snap.index, p.market_factor_etf)
    levels = (p.level,) if p.level else tuple(LEVEL_HR)
    return PanelPlan(latest_session(snap, p.teo), levels)


def size_panel(plan: PanelPlan, p: PanelParams) -> Size:
    rows = 160 * len(plan.levels)  # about the GICS sub-industries of a large universe
    return Size(1, rows, 300 + 150 * rows)


def panel_rows(snap: Snapshot, plan: PanelPlan, min_peers: int) -> list[dict[str, Any]]:
    """Per (sub-industry, level): mean and sample variance (ddof 1) of the members' hedge
    ratios, their count and the sum of their log market caps (members with a value only)."""
    stocks = [s for s in _stocks_on(snap, plan.t) if s.industry]
    rows_of = np.array([s.row for s in stocks], dtype=np.int64)
    industry = np.array([s.industry for s in stocks], dtype=object)
    cap = np.asarray(snap.array("market_cap")[rows_of, plan.t], dtype=np.float64)
    out: list[dict[str, Any]] = []
    for level in plan.levels:
        hr = np.asarray(snap.array(LEVEL_HR[level])[rows_of, plan.t], dtype=np.float64)
        for code in sorted(set(industry.tolist())):
            members = (industry == code) & np.isfinite(hr)
            n = int(members.sum())
            if n < min_peers or n == 0:
                continue
            values = hr[members]
            caps = cap[members]
            out.append(
                {
                    "industry_code": code,
                    "level": level,
                    "beta_mean": float(values.mean()),
                    "beta_variance": float(values.var(ddof=1)) if n > 1 else None,
                    "n_companies": n,
                    "total_log_mcap_weight": float(np.log(caps[caps > 0]).sum()),
                }
            )
    return out


def render_panel(call: Call[PanelParams, PanelPlan]) -> Response:
    snap, plan, p = call.snap, call.plan, call.params
    teo = snap.sessions[plan.t].astype(object)
    doc = {
        "industries": panel_rows(snap, plan, p.min_peers),
        "teo": teo,
        "by": p.by,
        "panel_key": f"{p.level or 'all'}:{teo}",
    }
    return document(snap, doc)


PANEL = Endpoint(
    path="/api/industry-panel",
    service="risk",
    price_key="industry-panel",
    params=PanelParams,
    plan=plan_panel,
    size=size_panel,
    render=render_panel,
    threaded=True,
    doc=Doc(
        name="industry_panel",
        summary="Per GICS sub-industry, the spread of its members' hedge ratios",
        description=(
            "Rows `{industry_code, level, beta_mean, beta_variance, n_companies, "
            "total_log_mcap_weight}` on `teo`: per sub-industry and level the mean and sample "
            "variance of the members' hedge ratio on that level's ETF (market l1_mkt_hr, "
            "sector l2_sec_hr, subsector l3_sub_hr), how many have one, and the sum of their "
            "log market caps."
        ),
        responses=ERRORS_NO_TICKER,
    ),
)


class MembersQuery(VersionedParams):
    teo: IsoDate | None = Field(None, description="Session (default: data_as_of).")


class MembersParams(MembersQuery):
    name: str = Field(
        min_length=1, max_length=32, description="uni_mc_N or uni_dv_N, N in 50, 500, 1000, 3000."
    )


@dataclass(frozen=True)
class MembersPlan:
    kind: str  # mc or dv
    size: int
    t: int


def plan_members(snap: Snapshot, p: MembersParams) -> MembersPlan:
    found = _UNIVERSE.match(p.name.strip().lower())
    if found is None:
        raise ApiError(
            "INVALID_PARAMETER",
            f"unknown universe {p.name!r}; accepted: uni_mc_N (largest market caps) or "
            "uni_dv_N (largest dollar volumes), N = 50, 500, 1000 or 3000",
            parameter="name",
        )
    kind, n = found.group(1), int(found.group(2))
    if kind == "mc" and snap.index.stocks_with_cap == 0:
        raise ApiError("NO_DATA", f"the data set has no market caps: {NO_CAPS_HINT}")
    return MembersPlan(kind, n, latest_session(snap, p.teo))


def size_members(plan: MembersPlan, p: MembersParams) -> Size:
    return Size(1, plan.size, 400 + 12 * plan.size)


def ranked_members(snap: Snapshot, plan: MembersPlan) -> tuple[list[str], int]:
    """The universe's tickers, largest first (ties by ticker), and the count of stocks priced
    on the session without a value (no cap, no volume)."""
    stocks = _stocks_on(snap, plan.t)
    rows = np.array([s.row for s in stocks], dtype=np.int64)
    if plan.kind == "mc":
        value = np.asarray(snap.array("market_cap")[rows, plan.t], dtype=np.float64)
    else:
        lo = max(0, plan.t + 1 - DOLLAR_VOLUME_SESSIONS)
        traded = np.asarray(snap.array("turnover")[rows, lo : plan.t + 1], dtype=np.float64)
        with np.errstate(invalid="ignore"):
            value = np.nanmean(np.where(np.isfinite(traded), traded, np.nan), axis=1)
    tickers = np.array([s.ticker for s in stocks], dtype=str)
    ok = np.isfinite(value)
    order = np.lexsort((tickers[ok], -value[ok]))
    return tickers[ok][order][: plan.size].tolist(), int((~ok).sum())


def render_members(call: Call[MembersParams, MembersPlan]) -> Response:
    snap, plan = call.snap, call.plan
    members, without = ranked_members(snap, plan)
    if not members:
        raise ApiError("NO_DATA", "no stock priced on the session has the ranking value")
    teo = snap.sessions[plan.t].astype(object)
    if call.caller.is_demo:  # the demo key sees its seven tickers (gate.demo_rules)
        members = [m for m in members if m in MAG7]
    doc = {
        "universe": f"uni_{plan.kind}_{plan.size}",
        "teo": teo,
        "mask_as_of": teo,
        "members": members,
        "counts": {
            "active": len(members),
            "in_universe_mask": len(members),
            "inactive_from_validity": without,
        },
    }
    return document(snap, doc)


MEMBERS = Endpoint(
    path="/api/universe/{name}/members",
    service="risk",
    price_key="universe/members",
    params=MembersParams,
    reader=path_and_query(MembersQuery, MembersParams, "name", "Universe name."),
    plan=plan_members,
    size=size_members,
    render=render_members,
    threaded=True,
    doc=Doc(
        name="universe_members",
        summary="The largest N stocks by market cap or dollar volume on a session",
        description=(
            "`uni_mc_N`: the N stocks with the largest market cap on `teo`; `uni_dv_N`: the "
            f"largest mean traded value (close x volume) over the {DOLLAR_VOLUME_SESSIONS} "
            "sessions to `teo`; N = 50, 500, 1000 or 3000; stocks priced on `teo` only, "
            "largest first. Membership is of that session (no monthly mask)."
        ),
        responses=ERRORS_NO_TICKER,
    ),
)

"""Response models of both services: what the OpenAPI document promises each answer holds.

The rows themselves are rendered by `formats` from the snapshot's arrays; these models document
them (and name the schemas clients generate code from). Field descriptions come from the one
field table (`fields.FIELDS`).
"""

# No `from __future__ import annotations`: pydantic reads these annotations at runtime.

import keyword
from collections.abc import Mapping
from datetime import date
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from eqrisk.api import formats
from eqrisk.api.errors import problem_responses
from eqrisk.api.fields import (
    DAILY_FIELDS,
    HEDGE_RATIO_COLUMNS,
    L3_COLUMNS,
    LONG_NAMES,
    METRICS_FIELDS,
    RETURNS_COLUMNS,
    TICKER_RETURNS_COLUMNS,
    describe,
)

# --------------------------------------------------------------------------- Service B


class Metadata(BaseModel):
    model_version: str = Field(description="The snapshot version that answered.")
    data_as_of: date | None = Field(description="Last session of the snapshot.")
    universe_size: int
    data_source: str
    method: dict[str, Any] = Field(description="Estimation settings: window, min_obs, weighting.")


class Enveloped(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    metadata: Metadata = Field(alias="_metadata")


def _row_model(name: str, columns: Mapping[str, str]) -> type[BaseModel]:
    fields: dict[str, Any] = {"date": (date, Field(description="Session date, YYYY-MM-DD."))}
    for column in columns:
        fields[column] = (float | None, Field(description=describe(column)))
    return create_model(name, **fields)


TickerReturnsRow = _row_model("TickerReturnsRow", TICKER_RETURNS_COLUMNS)
ReturnsRow = _row_model("ReturnsRow", RETURNS_COLUMNS)
L3Row = _row_model("L3DecompositionRow", L3_COLUMNS)
HedgeRatioRow = _row_model("HedgeRatioRow", HEDGE_RATIO_COLUMNS)
_METRIC_VALUES: dict[str, Any] = {
    name: (float | None, Field(description=describe(name))) for name in METRICS_FIELDS
}
MetricValues = create_model("MetricValues", **_METRIC_VALUES)


class SymbolMeta(BaseModel):
    company_name: str
    sector: str | None
    industry: str | None
    asset_type: str
    market_etf: str | None
    sector_etf: str | None
    subsector_etf: str | None


class SeriesMeta(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    ticker: str
    company_name: str
    asset_type: str
    market_etf: str | None
    sector_etf: str | None
    subsector_etf: str | None
    years: int | None = Field(None, description="The `years` asked for (year-based routes).")
    from_: date = Field(alias="from", description="First calendar date covered, inclusive.")
    to: date = Field(description="Last calendar date covered, inclusive.")
    rows: int = Field(description="Rows in `data`: sessions in the range with a price.")
    note: str | None = Field(None, description="Present when there are no rows, says why.")


class TickerReturnsResponse(Enveloped):
    data: list[TickerReturnsRow]  # type: ignore[valid-type]
    asset_type: str = Field(
        description="stock or etf (also in meta), where the real service has it."
    )
    meta: SeriesMeta


class ReturnsResponse(Enveloped):
    data: list[ReturnsRow]  # type: ignore[valid-type]
    meta: SeriesMeta


def _l3_arrays() -> dict[str, Any]:
    return {
        long: (list[float | None], Field(description=f"{describe(short)} One per date."))
        for short, long in LONG_NAMES.items()
    }


L3Columns = create_model(
    "L3Columns",
    __doc__="The real Service B's column layout: `dates` and one array per long-named field.",
    dates=(list[date], Field(description="Session dates, oldest first (the rows of `data`).")),
    **_l3_arrays(),
)


class L3Response(L3Columns, Enveloped):
    data: list[L3Row]  # type: ignore[valid-type]
    meta: SeriesMeta


STALE_DOC = "True when the symbol's last price is older than the snapshot's data_as_of."
BEHIND_DOC = "Sessions of the data set after the symbol's last price (0 = priced on data_as_of)."


class HedgeEtfs(BaseModel):
    market: str | None
    sector: str | None
    subsector: str | None


class HedgeLevel(BaseModel):
    market_hr: float | None = Field(description="Dollars of the market ETF per $1 of stock.")
    sector_hr: float | None
    subsector_hr: float | None
    market_er: float | None
    sector_er: float | None
    subsector_er: float | None
    residual_er: float | None
    hedge_etfs: HedgeEtfs


class HedgeLevels(BaseModel):
    """The real Service B's `hedge_levels`: a block per level the symbol has (HR = dollars of
    ETF per $1 of stock, the regression-coefficient sign: market HR at L2/L3 may be negative)."""

    L1: HedgeLevel | None = None
    L2: HedgeLevel | None = None
    L3: HedgeLevel | None = None
    statistical_lstar: str | None = Field(
        description="L*: the level whose out-of-sample hedge left the least residual variance "
        "on the latest session (docs/decisions/drop-in-routes.md); null without its quality."
    )
    recommended_level: str | None = Field(description="The deepest level the symbol has.")


class MetricsBody(BaseModel):
    ticker: str
    teo: date = Field(description="Session of these values: the symbol's last price.")
    stale: bool = Field(description=STALE_DOC)
    last_session: date = Field(description="The symbol's last priced session (= teo).")
    sessions_behind: int = Field(ge=0, description=BEHIND_DOC)
    metrics: MetricValues
    hedge_levels: HedgeLevels
    meta: SymbolMeta


class MetricsResponse(MetricsBody, Enveloped):
    pass


class TickerInfo(SymbolMeta):
    ticker: str


class TickerList(Enveloped):
    tickers: list[str] | list[TickerInfo] = Field(
        description="Symbols; objects with their ETFs when include_metadata=true."
    )
    count: int


class SearchHit(BaseModel):
    ticker: str
    company_name: str
    sector: str | None
    asset_type: str


class SearchResults(Enveloped):
    query: str
    results: list[SearchHit] | list[TickerInfo]
    tickers: list[SearchHit] | list[TickerInfo] = Field(
        description="The same hits, where the real Service B's readers look for them."
    )
    count: int


class HeatmapRow(BaseModel):
    ticker: str
    company_name: str
    sector: str | None
    industry: str | None
    market_cap: float | None
    return_1d: float | None = Field(description=describe("return_1d"))
    teo: date = Field(description="Session of the values (the stock's last price).")
    stale: bool = Field(description=STALE_DOC)
    sessions_behind: int = Field(ge=0, description=BEHIND_DOC)


class HeatmapMeta(BaseModel):
    limit: int
    rows: int
    eligible: int = Field(description="Stocks that qualify (priced in the last sessions).")


class HeatmapResponse(Enveloped):
    data: list[HeatmapRow]
    meta: HeatmapMeta


class ReturnPoint(BaseModel):
    date: date
    returns_gross: float | None


class BatchReturns(BaseModel):
    """Column-wise returns: `l1`/`l2`/`l3` are the L3 market/sector/subsector hedge-ratio
    series (the real service's legacy names), also under their explicit names."""

    dates: list[date]
    values: list[float | None] = Field(description=describe("returns_gross"))
    l1: list[float | None]
    l2: list[float | None]
    l3: list[float | None]
    l3_market_hr: list[float | None]
    l3_sector_hr: list[float | None]
    l3_subsector_hr: list[float | None]


class LatestHedgeRatios(BaseModel):
    l1_market: float | None
    l2_market: float | None
    l2_sector: float | None
    l3_market: float | None
    l3_sector: float | None
    l3_subsector: float | None


class EntryMeta(SymbolMeta):
    ticker: str
    name: str
    subsector_etf_symbol: str | None
    universe: str | None


class BatchItem(BaseModel):
    model_config = ConfigDict(extra="allow")  # a failure carries its error's context

    status: Literal["success", "error"]
    ticker: str
    error: str | None = Field(None, description="A failure's sentence.")
    code: str | None = Field(None, description="A failure's machine code, e.g. NO_DATA.")
    returns: BatchReturns | None = None
    hedge_ratios: LatestHedgeRatios | None = None
    full_metrics: dict[str, Any] | None = Field(
        None, description="Flat: the /api/metrics values plus ticker, date (= teo), stale."
    )
    l3_decomposition: L3Columns | None = None
    hedge_levels: HedgeLevels | None = None
    meta: EntryMeta | None = None


class BatchSummary(BaseModel):
    total: int
    succeeded: int
    failed: int


class BatchMeta(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    years: int
    metrics: list[str]
    from_: date = Field(alias="from")
    to: date


class BatchResponse(Enveloped):
    results: dict[str, BatchItem]
    summary: BatchSummary
    meta: BatchMeta


class EstimateResponse(Enveloped):
    endpoint: str
    estimated_cost_usd: float
    estimated_tokens: int = Field(description="Exactly what a successful call is charged.")
    estimated_rows: int
    estimated_bytes: int = Field(description="Approximate body size.")
    unit_cost_usd: float
    pricing_model: str
    note: str
    limits: dict[str, float] = Field(
        default_factory=dict,
        description="The route's caps where its price does not scale with the work (a larger "
        "request is a 400), e.g. portfolio/risk's positions; empty for a route without caps.",
    )


class HealthResponse(BaseModel):
    status: str
    model_version: str
    data_as_of: date | None
    risk_accuracy: dict[str, Any] | None = Field(
        None,
        description=(
            "The risk forecast's out-of-sample accuracy on the snapshot's data (bias statistic, "
            "12-month MAD and worst 12-month window per family of portfolios at 1 and 21 "
            "days, next to the baseline), which every build stores; null for a version built "
            "before builds stored it."
        ),
    )


ERRORS = problem_responses(400, 401, 402, 403, 404, 429, "4XX", 500, 503)
ERRORS_NO_TICKER = {k: v for k, v in ERRORS.items() if k != 404}
BODY_ERRORS = problem_responses(415)
_META_HEADERS = {
    "X-Model-Version": {"description": "Snapshot version.", "schema": {"type": "string"}},
    "X-Risk-Model-Version": {
        "description": "Snapshot version (the real Service B's name).",
        "schema": {"type": "string"},
    },
    "X-Data-As-Of": {"description": "Last session of the snapshot.", "schema": {"type": "string"}},
}
SERIES_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "JSON `{data, meta, _metadata}`, or CSV / Parquet rows (an attachment).",
        "content": {
            formats.COLUMNS_MEDIA_TYPE: {
                "schema": {
                    "type": "object",
                    "description": "Opt-in (Accept): the JSON answer with `data` as parallel "
                    "arrays `{name: [values]}`.",
                }
            },
            "text/csv": {"schema": {"type": "string"}},
            "application/vnd.apache.parquet": {"schema": {"type": "string", "format": "binary"}},
        },
        "headers": {**_META_HEADERS, "ETag": {"schema": {"type": "string"}}},
    },
    304: {"description": "Not modified: If-None-Match named the current ETag."},
    **ERRORS,
}
JSON_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "OK", "headers": _META_HEADERS},
    **ERRORS,
}


# --------------------------------------------------------------------------- Service A


def _daily_record() -> type[BaseModel]:
    """One symbol on one session: `symbol` and `teo`, then the /daily fields of the table."""
    spec: dict[str, Any] = {
        "symbol": (str, Field(description="Ticker.", examples=["AAPL"])),
        "teo": (str, Field(description="Session date, YYYY-MM-DD.", examples=["2024-03-28"])),
    }
    for name, array in DAILY_FIELDS.items():
        kind: Any = float | None if array is not None else str | None
        key = f"{name}_" if keyword.iskeyword(name) else name
        alias = name if key != name else None
        spec[key] = (kind, Field(None, alias=alias, description=describe(name)))
    model: type[BaseModel] = create_model(
        "DailyRecord",
        __config__=ConfigDict(populate_by_name=True),
        __doc__="One symbol on one session. `symbol` and `teo` always; the rest as asked in "
        "`fields`.",
        **spec,
    )
    return model


DailyRecord = _daily_record()


class BetaRecord(BaseModel):
    teo: str = Field(description="Session date, YYYY-MM-DD.", examples=["2024-03-28"])
    symbol: str = Field(description="Ticker.", examples=["AAPL"])
    factor_beta: float = Field(description="Exposure to the factor, estimated up to teo.")
    fact: str = Field(description="Factor name.", examples=["Mkt"])


class FactorReturnRecord(BaseModel):
    teo: str = Field(description="Session, YYYY-MM-DDT00:00:00.", examples=["2024-03-28T00:00:00"])
    fact: str = Field(description="Factor name.", examples=["Mkt"])
    factor_return: float = Field(description="Factor return of the session (decimal).")


class GrossReturnRecord(BaseModel):
    teo: str = Field(description="Session, YYYY-MM-DDT00:00:00.", examples=["2024-03-28T00:00:00"])
    symbol: str = Field(description="Ticker.", examples=["AAPL"])
    gross_return: float = Field(description="Simple daily return (decimal).")


class ResidualRecord(BaseModel):
    teo: str = Field(description="Session date, YYYY-MM-DD.", examples=["2024-03-28"])
    symbol: str = Field(description="Ticker.", examples=["AAPL"])
    residual_return: float = Field(
        description="gross_return - b_Mkt(t-1) f_Mkt(t) - b_sec(t-1) f_sec(t) (decimal)."
    )


class FactorListRecord(BaseModel):
    fact: str = Field(description="Factor name, as /facts and /betas take it.", examples=["Mkt"])
    level: str = Field(
        description="`L1` (the market), `L2` (a sector) or `style` (a style factor of the risk "
        "model's second layer).",
        examples=["L1"],
    )
    etf: str | None = Field(description="The ETF of the factor's level.", examples=["SPY"])
    sector: str | None = Field(
        description="The GICS sector of a sector factor; null for `Mkt` and the styles.",
        examples=[None],
    )
    description: str = Field(
        description="What the factor is.", examples=["the market ETF's daily return"]
    )


class SymbolList(BaseModel):
    symbols: list[str] = Field(description="Tickers, best first.", examples=[["AAPL", "MSFT"]])


DAILY_ERRORS = problem_responses(400, 401, "4XX", 500, 503)  # "4XX" replaces FastAPI's 422
DAILY_NOT_FOUND = problem_responses(404)
_CSV = {"text/csv": {"schema": {"type": "string", "description": "Header row, then the rows."}}}
_COLUMNS = {
    formats.COLUMNS_MEDIA_TYPE: {
        "schema": {
            "type": "object",
            "description": "Opt-in (Accept): the records as parallel arrays `{name: [values]}`.",
        }
    }
}


def daily_responses(not_found: bool = True) -> dict[int | str, Any]:
    out: dict[int | str, Any] = {
        200: {"content": {formats.MEDIA_TYPES[formats.JSON]: {}, **_COLUMNS, **_CSV}},
        **DAILY_ERRORS,
    }
    if not_found:
        out.update(DAILY_NOT_FOUND)
    return out

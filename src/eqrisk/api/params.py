"""The one way both services read parameters: a pydantic model per endpoint, read by `query_of`.

A model's fields are the endpoint's documented parameters. A parameter the model does not know is
a 400 naming it and listing the accepted ones, and a parameter given twice is a 400 that says to
give it once (lists are comma-separated), so that a typo or a repeated name never silently
changes an answer (`symbols=AAPL&symbols=MSFT` would otherwise keep only one of them).
"""

# No `from __future__ import annotations`: FastAPI reads the annotations of the query dependency
# that `query_of` builds at runtime.

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import date
from typing import Annotated, Any, Literal, TypeVar

from fastapi import Depends, Query, Request
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict

from eqrisk.api.errors import ApiError, validation_api_error
from eqrisk.api.fields import DAILY_FIELDS, TOP_BY
from eqrisk.snapshot.index import MAX_YEARS

MAX_BATCH_TICKERS = 100
BatchMetric = Literal["returns", "hedge_ratios", "full_metrics", "l3_decomposition"]
DEFAULT_BATCH_METRICS: tuple[BatchMetric, ...] = ("returns", "hedge_ratios")
HEATMAP_DEFAULT, HEATMAP_MAX = 50, 500
SEARCH_LIMIT = 10
FORMATS = ("json", "csv", "parquet")  # Service B
DAILY_FORMATS = ("json", "csv")  # Service A
MAX_SYMBOLS = 100
MAX_TOP_N = 500
DEFAULT_TOP_N = 10
_DATE_RE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")


class Params(BaseModel):
    """Parameters of one endpoint: unknown names are refused, not ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def accepted(cls) -> list[str]:
        return [f.alias or name for name, f in cls.model_fields.items()]


class BodyParams(Params):
    """A JSON body: unknown fields are refused with the list of accepted ones."""

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            unknown = sorted(set(data) - set(cls.accepted()))
            if unknown:
                raise ValueError(
                    f"unknown field(s): {', '.join(map(str, unknown))}; "
                    f"accepted: {', '.join(cls.accepted())}"
                )
        return data


def reject_unknown(model: type[Params], names: Iterable[str], what: str = "parameter") -> None:
    """400 naming the unknown parameters and listing the accepted ones."""
    accepted = model.accepted()
    unknown = sorted(set(names) - set(accepted))
    if unknown:
        takes = ", ".join(accepted) or f"none (this route takes no {what}s)"
        raise ApiError(
            "INVALID_PARAMETER",
            f"unknown {what}(s): {', '.join(unknown)}; accepted: {takes}",
            parameters=unknown,
            accepted=accepted,
        )


def reject_repeated(names: Iterable[str]) -> None:
    """400 naming the parameters given more than once (a list is one comma-separated value)."""
    repeated = sorted(name for name, count in Counter(names).items() if count > 1)
    if repeated:
        example = repeated[0]
        raise ApiError(
            "INVALID_PARAMETER",
            f"parameter(s) given more than once: {', '.join(repeated)}; give each parameter "
            f"once, a list as one comma-separated value (e.g. {example}=AAPL,MSFT)",
            parameters=repeated,
        )


P = TypeVar("P", bound=Params)


def query_of(model: type[P]) -> Any:
    """A dependency reading `model` from the query string: its fields are the documented
    parameters; an unknown or repeated parameter is a 400 (unknown first)."""

    class Loose(model):  # type: ignore[valid-type,misc]
        model_config = ConfigDict(extra="ignore")

    Loose.__name__ = Loose.__qualname__ = model.__name__

    async def known_names(request: Request) -> None:
        # A sub-dependency runs before the query model is validated, so a misspelt name is
        # reported as such, not as the required parameter it failed to give.
        names = [name for name, _ in request.query_params.multi_items()]
        reject_unknown(model, names)
        reject_repeated(names)

    async def dependency(
        _names: Annotated[None, Depends(known_names)], params: Annotated[Loose, Query()]
    ) -> P:
        return params

    return Depends(dependency)


def validate_params(
    model: type[P], params: Mapping[str, Any], where: tuple[str, ...] = ("body", "params")
) -> P:
    """Validate an endpoint's parameters given as a mapping (`null` = absent): the `params` of
    /api/estimate (`where` = body.params) or a route's path parameters (`where` = path)."""
    given = {k: v for k, v in params.items() if v is not None}
    reject_unknown(model, given)
    try:
        return model.model_validate(given)
    except ValidationError as exc:
        errors = [{**e, "loc": (*where, *e["loc"])} for e in exc.errors()]
        raise validation_api_error(errors) from None


# --------------------------------------------------------------------------- Service B models


def iso_date(text: str) -> date:
    """The one date parser of both services: `YYYY-MM-DD` and nothing else (no timestamps, no
    week dates). Raises ValueError saying what is accepted."""
    if not _DATE_RE.match(text):
        raise ValueError(f"{text!r} is not a date; expected YYYY-MM-DD")
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a valid calendar date; expected YYYY-MM-DD") from None


def _iso_date(value: Any) -> Any:
    if isinstance(value, date):
        return value
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a date; expected YYYY-MM-DD")
    return iso_date(value.strip())


def _lower(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


Ticker = Annotated[
    str,
    StringConstraints(strip_whitespace=True, to_upper=True, min_length=1, max_length=32),
]
IsoDate = Annotated[date, BeforeValidator(_iso_date)]
Format = Annotated[Literal["json", "csv", "parquet"], BeforeValidator(_lower)]
BatchFormat = Annotated[Literal["json", "csv", "parquet"], BeforeValidator(_lower)]
Years = Annotated[
    int,
    Field(
        ge=1,
        le=MAX_YEARS,
        description=(
            "Calendar years of history up to the snapshot's `data_as_of`: the sessions strictly "
            "after `data_as_of` minus `years` years. From 1 to the history the snapshot holds "
            f"(at most {MAX_YEARS}); a larger value is a 400 that names the maximum."
        ),
    ),
]
CSV_COMMENT_DESCRIPTION = (
    "true: a CSV answer starts with one comment line `# model_version=..., data_as_of=...` "
    "(read it with pandas.read_csv(..., comment='#')). Default false: the header row first. "
    "Parquet always carries both in its schema metadata."
)
FORMAT_DESCRIPTION = (
    "Response format: json (default), csv or parquet. Without it the Accept header decides "
    "(application/json, text/csv, application/vnd.apache.parquet)."
)


class TickersParams(Params):
    array: Literal["ticker"] | None = Field(
        None, description="`ticker`: list every ticker symbol (also the default)."
    )
    mag7: bool = Field(
        False, description="true: only the seven large caps AAPL MSFT GOOGL AMZN NVDA META TSLA."
    )
    search: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description=(
            f"Match on symbol or company name; up to {SEARCH_LIMIT} results, exact symbol first, "
            "then symbol prefixes, then names (word prefix, then substring)."
        ),
    )
    asset_type: Literal["stock", "etf", "index"] | None = Field(
        None, description="Only symbols of this asset type."
    )
    include_metadata: bool = Field(
        False,
        description=(
            "true: `tickers` holds objects `{ticker, company_name, sector, industry, asset_type, "
            "market_etf, sector_etf, subsector_etf}` instead of symbols."
        ),
    )


class NoQuery(Params):
    """A route whose parameters are all in its path: any query parameter is a 400."""


class MetricsParams(Params):
    ticker: Ticker = Field(description="Ticker symbol, case-insensitive.", examples=["NVDA"])


class TickerReturnsParams(Params):
    ticker: Ticker = Field(
        description="Ticker symbol (a stock or an ETF), case-insensitive.",
        examples=["NVDA", "AAPL", "SPY"],
    )
    years: Years = 1
    format: Format | None = Field(None, description=FORMAT_DESCRIPTION)
    csv_comment: bool = Field(False, description=CSV_COMMENT_DESCRIPTION)
    limit: int | None = Field(
        None,
        ge=1,
        description=(
            "Only the most recent `limit` rows of the window (the estimate counts the rows "
            "returned)."
        ),
    )
    nocache: bool = Field(
        False,
        description=(
            "true: render the answer anew, never a 304 or a cached body (the bytes are the "
            "same: answers are slices of the served snapshot, which never changes)."
        ),
    )


class ReturnsParams(Params):
    ticker: Ticker = Field(
        description="Stock ticker, case-insensitive (ETFs: /api/etf-returns).",
        examples=["NVDA", "AAPL"],
    )
    years: Years = 1
    format: Format | None = Field(None, description=FORMAT_DESCRIPTION)
    csv_comment: bool = Field(False, description=CSV_COMMENT_DESCRIPTION)


class EtfReturnsParams(Params):
    ticker: Ticker | None = Field(
        None, description="ETF ticker, case-insensitive.", examples=["SPY", "XLK"]
    )
    etf: Ticker | None = Field(None, description="Same as `ticker` (give one of the two).")
    years: Years = 1
    format: Format | None = Field(None, description=FORMAT_DESCRIPTION)
    csv_comment: bool = Field(False, description=CSV_COMMENT_DESCRIPTION)


class L3Params(Params):
    ticker: Ticker = Field(
        description="Ticker symbol, case-insensitive.", examples=["NVDA", "AAPL", "SPY"]
    )
    from_: IsoDate | None = Field(
        None,
        alias="from",
        description="First date, inclusive, YYYY-MM-DD (default: one year before data_as_of).",
    )
    to: IsoDate | None = Field(
        None, description="Last date, inclusive, YYYY-MM-DD (default: data_as_of)."
    )
    years: int | None = Field(
        None,
        ge=1,
        le=MAX_YEARS,
        description=(
            "The last `years` years up to data_as_of (as /api/ticker-returns); instead of "
            "`from` (give one of the two)."
        ),
    )
    market_factor_etf: Ticker | None = Field(
        None,
        description=(
            "The market ETF of the decomposition; only the snapshot's market ETF (SPY) is "
            "served, any other is a 400."
        ),
    )
    format: Format | None = Field(None, description=FORMAT_DESCRIPTION)
    csv_comment: bool = Field(False, description=CSV_COMMENT_DESCRIPTION)


class HeatmapParams(Params):
    limit: int = Field(
        HEATMAP_DEFAULT,
        ge=1,
        le=HEATMAP_MAX,
        description=f"How many stocks, largest market cap first (1 to {HEATMAP_MAX}).",
    )


class BatchParams(BodyParams):
    tickers: list[Ticker] = Field(
        min_length=1,
        max_length=MAX_BATCH_TICKERS,
        description=(
            f"1 to {MAX_BATCH_TICKERS} tickers, case-insensitive; duplicates are merged. An "
            "unknown ticker, or one without prices in the window (NO_DATA), fails alone "
            "(status error) and is not charged."
        ),
        examples=[["NVDA", "AAPL", "SPY", "NOPE"]],
    )
    metrics: list[BatchMetric] = Field(
        default=list(DEFAULT_BATCH_METRICS),
        min_length=1,
        description=(
            "What to return per ticker: returns (column-wise `{dates, values, l1, l2, l3, "
            "l3_market_hr, l3_sector_hr, l3_subsector_hr}`), hedge_ratios (the latest "
            "`{l1_market, l2_market, l2_sector, l3_market, l3_sector, l3_subsector}`), "
            "full_metrics (a flat object: /api/metrics' values plus ticker and date), "
            "l3_decomposition (column-wise as /api/l3-decomposition). Default: returns and "
            "hedge_ratios. Every succeeded entry also has hedge_levels and meta."
        ),
    )
    years: Years = 1
    format: BatchFormat = Field(
        "json",
        description=(
            "json (default): `{results: {T: entry}}`; parquet or csv: one long table, a row "
            "per (ticker, date): ticker, date, returns_gross, l3_market_hr, l3_sector_hr, "
            "l3_subsector_hr (failed tickers are named in X-Failed-Tickers)."
        ),
    )
    csv_comment: bool = Field(False, description=CSV_COMMENT_DESCRIPTION)

    @field_validator("tickers", "metrics")
    @classmethod
    def _dedupe(cls, values: list[str]) -> list[str]:
        return list(dict.fromkeys(values))


class EstimateRequest(BodyParams):
    endpoint: str = Field(
        min_length=1,
        max_length=200,
        description=(
            "The endpoint to price: ticker-returns, returns, etf-returns, metrics (or "
            "metrics/{ticker}), l3-decomposition, batch/analyze, heatmap, tickers; with or "
            "without the /api/ prefix."
        ),
        examples=["ticker-returns"],
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="That endpoint's parameters (query parameters; for batch/analyze its body).",
        examples=[{"ticker": "NVDA", "years": 5}],
    )


# --------------------------------------------------------------------------- Service A models
# Values stay text: what they mean depends on the snapshot (symbols, factors) and empty means
# absent, so the routes read them with the snapshot at hand.

SYMBOLS_DOC = (
    f"Comma-separated tickers, case-insensitive (at most {MAX_SYMBOLS}; duplicates are dropped). "
    "An unknown ticker is a 404 naming it; a ticker without a price in the range a 404 NO_DATA."
)
START_DOC = "First session, inclusive, YYYY-MM-DD."
END_DOC = "Last session, inclusive, YYYY-MM-DD; default: the latest session."
FORMAT_DOC = (
    "`json` (the default) or `csv` (a header row, then the rows). Without it the Accept header "
    "decides (text/csv), else JSON."
)
FACT_DOC = (
    "One factor name: `Mkt` or a GICS sector factor (Energy, Materials, Industrials, "
    "Consumer_Discretionary, Consumer_Staples, Health_Care, Financials, Information_Technology, "
    "Communication_Services, Utilities, Real_Estate); case-insensitive, spaces or underscores."
)
_DATE: JsonDict = {"format": "date"}
_FORMAT: JsonDict = {"enum": list(DAILY_FORMATS)}
_TOP_BY_ENUM: JsonDict = {"enum": list(TOP_BY)}


SymbolsField = Annotated[str, Field(description=SYMBOLS_DOC, examples=["AAPL,MSFT"])]
FactField = Annotated[str, Field(description=FACT_DOC, examples=["Mkt"])]
StartField = Annotated[
    str, Field(description=START_DOC, examples=["2024-01-02"], json_schema_extra=_DATE)
]
EndField = Annotated[
    str | None, Field(description=END_DOC, examples=["2024-12-31"], json_schema_extra=_DATE)
]
FormatField = Annotated[str | None, Field(description=FORMAT_DOC, json_schema_extra=_FORMAT)]


class DailyQuery(Params):
    symbols: SymbolsField
    start_time: StartField
    end_time: EndField = None
    fields: str | None = Field(
        None,
        description=(
            "Comma-separated fields besides `symbol` and `teo` (always present), in the order "
            f"wanted; default: all. Valid: {', '.join(DAILY_FIELDS)}. `close` is the adjusted "
            "close; `close_raw`, `open`, `high`, `low` and `volume` are as traded; `mktcap` in "
            "USD; `turnover` = close as traded x volume."
        ),
        examples=["close,volume"],
    )
    format: FormatField = None


class BetasQuery(Params):
    symbols: SymbolsField
    fact: FactField
    start_time: StartField
    end_time: EndField = None
    format: FormatField = None


class FactsQuery(Params):
    fact: FactField
    start_time: StartField
    end_time: EndField = None
    format: FormatField = None


class SymbolsQuery(Params):
    symbols: SymbolsField
    start_time: StartField
    end_time: EndField = None
    format: FormatField = None


class SymbolListQuery(Params):
    top_n: int = Field(
        DEFAULT_TOP_N, ge=1, le=MAX_TOP_N, description=f"How many symbols, 1 to {MAX_TOP_N}."
    )
    top_by: str = Field(
        "mktcap",
        description=(
            "Ranking value on the latest session: mktcap, mktcap_rank, close (adjusted), "
            "return (simple, that session), turnover, volume."
        ),
        json_schema_extra=_TOP_BY_ENUM,
    )
    ascending: bool = Field(False, description="Smallest value first (default: largest first).")
    sector_code: str | None = Field(
        None,
        description=(
            "Only this GICS sector: 10 Energy, 15 Materials, 20 Industrials, 25 Consumer "
            "Discretionary, 30 Consumer Staples, 35 Health Care, 40 Financials, "
            "45 Information Technology, 50 Communication Services, 55 Utilities, "
            "60 Real Estate."
        ),
        examples=["45"],
    )
    format: str | None = Field(
        None,
        description=(
            "`json` (`{symbols: [...]}`, the default) or `csv` (a header row `symbol`, then one "
            "symbol per row, best first). Without it the Accept header decides."
        ),
        json_schema_extra=_FORMAT,
    )

"""The one way both services read parameters: a pydantic model per endpoint (in its module under
`api/endpoints/`), read from the query string by `query_of` (a JSON body: `body.body_of`), and
the field types and descriptions the models share.

A model's fields are the endpoint's documented parameters. A parameter the model does not know is
a 400 naming it and listing the accepted ones, and a parameter given twice is a 400 that says to
give it once (lists are comma-separated), so that a typo or a repeated name never silently
changes an answer (`symbols=AAPL&symbols=MSFT` would otherwise keep only one of them).
"""

# No `from __future__ import annotations`: FastAPI reads the annotations of the query dependency
# that `query_of` builds at runtime.

import inspect
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import date
from typing import Annotated, Any, Literal, TypeVar

from fastapi import Depends, Query, Request
from fastapi import Path as PathParam
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)
from pydantic.config import JsonDict

from eqrisk.api.errors import ApiError, validation_api_error
from eqrisk.snapshot.index import MAX_YEARS

FORMATS = ("json", "csv", "parquet")  # Service B
DAILY_FORMATS = ("json", "csv")  # Service A
MAX_SYMBOLS = 100
_DATE_RE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")


class Params(BaseModel):
    """Parameters of one endpoint: unknown names are refused, not ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def accepted(cls) -> list[str]:
        return [f.alias or name for name, f in cls.model_fields.items()]


VERSION_DESCRIPTION = (
    "A kept snapshot version to answer from (its full name, e.g. `v3-20261121T120000Z`, as in "
    "`X-Model-Version`); default: the current one. The same request with the same `version` "
    "gives the same answer while the version is kept (`eqrisk snapshots pin` keeps it); an "
    "unknown version is a 404 VERSION_NOT_FOUND listing the kept ones."
)


class VersionedParams(Params):
    """A data route's parameters: `version` picks a kept snapshot version (blank is absent)."""

    version: str | None = Field(
        None, description=VERSION_DESCRIPTION, examples=["v3-20261121T120000Z"]
    )

    @classmethod
    def accepted(cls) -> list[str]:
        """The route's own parameters, then `version`."""
        names = super().accepted()
        return [n for n in names if n != "version"] + ["version"]


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


def path_and_query(
    query: type[Params],
    model: type[P],
    name: str = "ticker",
    description: str = "Ticker, case-insensitive.",
    examples: list[str] | None = None,
) -> Any:
    """A dependency reading `model` from one path parameter, `name`, and the query string read
    as `query` (`model` less that field, by `query_of`): the path's value is validated with the
    rest, a refusal located at `path`."""

    async def dependency(**given: Any) -> P:
        fields = {k: v for k, v in given["query"].model_dump().items() if v is not None}
        return validate_params(model, {name: given[name], **fields}, ("path",))

    segment = PathParam(min_length=1, max_length=32, description=description, examples=examples)
    dependency.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(
                "query",
                inspect.Parameter.KEYWORD_ONLY,
                annotation=Annotated[query, query_of(query)],
            ),
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[str, segment]
            ),
        ]
    )
    return Depends(dependency)


TICKER_FIELDS = ("ticker", "etf", "tickers", "symbols")


def named_tickers(params: Params) -> list[str]:
    """The tickers a request names in the conventional fields (`ticker` and `etf`: one each;
    `tickers`: a list; `symbols`: comma-separated), trimmed and upper-cased: what the demo key's
    first rule reads (`gate.demo_names`), for every endpoint whose model uses these names."""
    found: list[str] = []
    for name in TICKER_FIELDS:
        value = getattr(params, name, None)
        if isinstance(value, str):
            found.extend(value.split(",") if name == "symbols" else [value])
        elif isinstance(value, list):
            found.extend(v for v in value if isinstance(v, str))
    return [t.strip().upper() for t in found if t.strip()]


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
START_DESCRIPTION = (
    "First date, inclusive, YYYY-MM-DD: the rows from this date to `end` (instead of `years`; "
    "give one of the two). A start after the end is a 400."
)
END_DESCRIPTION = (
    "Last date, inclusive, YYYY-MM-DD (default: data_as_of); without `start`, the `years` "
    "years up to this date."
)
Start = Annotated[IsoDate | None, Field(description=START_DESCRIPTION, examples=["2024-01-02"])]
End = Annotated[IsoDate | None, Field(description=END_DESCRIPTION, examples=["2024-12-31"])]


def given_years(params: Params) -> int | None:
    """The `years` parameter when the request gave it, else None (its default then applies
    only when no `start` is given)."""
    value = getattr(params, "years", None)
    return value if "years" in params.model_fields_set else None


CSV_COMMENT_DESCRIPTION = (
    "true: a CSV answer starts with one comment line `# model_version=..., data_as_of=...` "
    "(read it with pandas.read_csv(..., comment='#')). Default false: the header row first. "
    "Parquet always carries both in its schema metadata."
)
FORMAT_DESCRIPTION = (
    "Response format: json (default), csv or parquet. Without it the Accept header decides "
    "(application/json, text/csv, application/vnd.apache.parquet)."
)


class NoQuery(Params):
    """A route whose parameters are all in its path: any query parameter is a 400."""


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


SymbolsField = Annotated[str, Field(description=SYMBOLS_DOC, examples=["AAPL,MSFT"])]
FactField = Annotated[str, Field(description=FACT_DOC, examples=["Mkt"])]
StartField = Annotated[
    str, Field(description=START_DOC, examples=["2024-01-02"], json_schema_extra=_DATE)
]
EndField = Annotated[
    str | None, Field(description=END_DOC, examples=["2024-12-31"], json_schema_extra=_DATE)
]
FormatField = Annotated[str | None, Field(description=FORMAT_DOC, json_schema_extra=_FORMAT)]

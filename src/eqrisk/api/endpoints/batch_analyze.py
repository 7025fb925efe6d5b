"""`POST /api/batch/analyze`: many tickers in one call, charged per succeeded ticker."""

# No `from __future__ import annotations`: pydantic and FastAPI read these annotations.

from typing import Literal
from urllib.parse import quote

from pydantic import Field, field_validator, model_validator
from starlette.responses import Response

from eqrisk.api import wire
from eqrisk.api.answers import snap_headers
from eqrisk.api.endpoint import Call, Doc, Endpoint
from eqrisk.api.errors import ApiError
from eqrisk.api.formats import JSON, MEDIA_TYPES, dumps, render
from eqrisk.api.models import BODY_ERRORS, ERRORS_NO_TICKER, BatchResponse
from eqrisk.api.params import (
    CSV_COMMENT_DESCRIPTION,
    BodyParams,
    Format,
    Ticker,
    VersionedParams,
    Years,
)
from eqrisk.api.plans import (
    BatchPlan,
    SeriesPlan,
    no_prices,
    resolve,
    series_plan,
    ticker_not_found,
    window,
)
from eqrisk.api.sizes import Size, approx_bytes
from eqrisk.snapshot.versions import Snapshot

MAX_BATCH_TICKERS = 100
# The price is per ticker and does not grow with `years`, while a series' rendering and
# compression do: with a series (returns, l3_decomposition; csv and parquet are one), at most
# this many ticker-years per ticker charged (docs/decisions/answers.md: on 100 tickers x 15
# years of returns the server spent 4.2-4.8x the median route's CPU per USD; at 5 years and
# brotli it is near 2x). A batch of fewer than `MIN_CHARGED_TICKERS` is charged that many.
SERIES_YEARS_PER_TICKER = 5
MIN_CHARGED_TICKERS = 5  # the default price table's minimum: 0.01 USD at 0.002 per ticker
SERIES_METRICS = ("returns", "l3_decomposition")
BatchMetric = Literal["returns", "hedge_ratios", "full_metrics", "l3_decomposition"]
DEFAULT_BATCH_METRICS: tuple[BatchMetric, ...] = ("returns", "hedge_ratios")


class BatchParams(BodyParams, VersionedParams):
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
    format: Format = Field(
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

    @model_validator(mode="after")
    def _series_cap(self) -> "BatchParams":
        asked, most = series_ticker_years(self)
        if asked > most:
            n, series = len(self.tickers), asked // (len(self.tickers) * self.years)
            fits = most // (n * series)
            raise ValueError(
                f"{n} tickers x {self.years} years x {series} series = {asked} ticker-years; "
                f"at most {SERIES_YEARS_PER_TICKER} per ticker charged ({most} for {n} "
                f"tickers), so years at most {fits} here: the price is per ticker, not per "
                "year. For longer histories ask /api/ticker-returns per ticker, or drop "
                "returns and l3_decomposition from metrics"
            )
        return self


def series_ticker_years(p: "BatchParams") -> tuple[int, int]:
    """The ticker-years of series a batch asks (tickers x years x series: returns and
    l3_decomposition in JSON, the long table in csv and parquet) and the most it may ask."""
    series = sum(m in SERIES_METRICS for m in p.metrics) if p.format == "json" else 1
    most = SERIES_YEARS_PER_TICKER * max(len(p.tickers), MIN_CHARGED_TICKERS)
    return len(p.tickers) * p.years * series, most


def plan_batch(snap: Snapshot, p: BatchParams) -> BatchPlan:
    idx = snap.index
    lo, hi, start, end = window(idx, p.years)
    items: dict[str, SeriesPlan | ApiError] = {}
    for ticker in p.tickers:
        sym = resolve(idx, ticker)
        if sym is None:
            items[ticker] = ticker_not_found(idx, [ticker])
            continue
        plan = series_plan(snap, sym, lo, hi, start, end, alone=True)
        series_asked = bool({"returns", "hedge_ratios", "l3_decomposition"} & set(p.metrics))
        if sym.last < 0 or (series_asked and plan.rows == 0):
            # fails alone and is not charged, like an unknown ticker
            items[ticker] = no_prices(idx, sym, start, end)
        else:
            items[ticker] = plan
    return BatchPlan(items, tuple(p.metrics), p.years, p.format)


def size(plan: BatchPlan, p: BatchParams) -> Size:
    """Rows: a day of a series (returns, l3_decomposition; the long table of csv / parquet)
    counts one, so does a latest-values object (full_metrics, hedge_ratios)."""
    rows = size = 0
    for item in plan.items.values():
        if isinstance(item, ApiError):
            size += 300
            continue
        if plan.format != "json":
            rows += item.rows
            size += approx_bytes(item.rows, 4, plan.format, 2)
            continue
        size += 1200  # hedge_levels and meta
        if "returns" in plan.metrics:
            rows += item.rows
            size += approx_bytes(item.rows, 7, "json")
        if "l3_decomposition" in plan.metrics:
            rows += item.rows
            size += approx_bytes(item.rows, 7, "json")
        for latest in ("hedge_ratios", "full_metrics"):
            if latest in plan.metrics:
                rows += 1
                size += 1500
    ok = plan.succeeded
    note = f"charged per succeeded ticker: {ok} of {len(plan.items)} requested tickers exist"
    return Size(ok, rows, size + 400, note)


def served_tickers(plan: BatchPlan) -> tuple[str, ...]:
    """Each asked ticker as served (a failed one: as asked), for the demo key's rule."""
    return tuple(
        item.symbol.ticker if isinstance(item, SeriesPlan) else asked
        for asked, item in plan.items.items()
    )


def render_batch(call: Call[BatchParams, BatchPlan]) -> Response:
    snap, plan = call.snap, call.plan
    if plan.format != JSON:
        # Percent-encoded: a header carries latin-1 only, and a ticker as asked may be anything.
        failed = [quote(t, safe="") for t, item in plan.items.items() if isinstance(item, ApiError)]
        return render(
            plan.format,
            wire.long_table(snap, plan),
            envelope={"_metadata": snap.metadata(), "csv_comment": call.params.csv_comment},
            headers={**snap_headers(snap), "X-Failed-Tickers": ",".join(failed)},
            filename=f"batch_{plan.years}y",
        )
    results = wire.batch_results(snap, plan)
    _, _, start, end = snap.index.window(plan.years)
    total, ok = len(plan.items), plan.succeeded
    rest = dumps(
        {
            "summary": {"total": total, "succeeded": ok, "failed": total - ok},
            "meta": {"years": plan.years, "metrics": list(plan.metrics), "from": start, "to": end},
            "_metadata": snap.metadata(),
        }
    )
    # The document `{results, summary, meta, _metadata}` (`answers.document`), written once.
    body = b"".join([b'{"results":', *results, b",", rest[1:]])
    return Response(body, media_type=MEDIA_TYPES[JSON], headers=snap_headers(snap))


ENDPOINT = Endpoint(
    path="/api/batch/analyze",
    method="POST",
    service="risk",
    price_key="batch/analyze",
    limits={
        "tickers": MAX_BATCH_TICKERS,
        "series_years_per_ticker": SERIES_YEARS_PER_TICKER,
        "series_min_charged_tickers": MIN_CHARGED_TICKERS,
    },
    params=BatchParams,
    plan=plan_batch,
    size=size,
    tickers=served_tickers,
    render=render_batch,
    threaded=True,
    doc=Doc(
        name="batch_analyze",
        summary="Analyze many tickers in one call",
        description=(
            "Per ticker (1 to 100, merged case-insensitively), in the real Service B's shape: "
            '`results` keyed by ticker; a succeeded entry has `status: "success"`, the asked '
            "`returns` (column-wise), `hedge_ratios` (latest), `full_metrics` (flat), "
            "`l3_decomposition`, and always `hedge_levels` and `meta`; a failed one `status: "
            '"error"`, `error` (the sentence) and `code`, and it is not charged. `format` '
            "parquet or csv answers one long table (ticker, date, returns_gross, L3 hedge "
            "ratios). Charged per succeeded ticker (minimum per call in the price table). "
            "With a series (returns, l3_decomposition, or csv / parquet), at most "
            f"{SERIES_YEARS_PER_TICKER} ticker-years per ticker charged (tickers x years x "
            f"series; a batch of fewer than {MIN_CHARGED_TICKERS} tickers counts as "
            f"{MIN_CHARGED_TICKERS}): 100 tickers of returns over at most 5 years, one ticker "
            "over the whole history; more is a 400, as from /api/estimate, whose `limits` "
            "say so."
        ),
        response_model=BatchResponse,
        responses={**ERRORS_NO_TICKER, **BODY_ERRORS},
    ),
)

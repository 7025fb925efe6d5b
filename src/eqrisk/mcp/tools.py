"""The MCP tools: each one or a few calls of the public API through `AsyncClient`, with the
caller's key, priced as the routes they call. Adding a tool is one function here with `@tool`:
typed parameters (with descriptions), a typed result from `results.py`, and a docstring the
assistant reads as the tool's description.

An error answer becomes a tool error that says what happened and what to do (top up, wait,
use another ticker); nothing is charged for it, as for every error of the routes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from eqrisk.client import (
    AsyncClient,
    AuthenticationError,
    DemoRestricted,
    EqriskError,
    InsufficientBalance,
    InvalidParameter,
    NotFound,
    RateLimited,
)
from eqrisk.mcp import results
from eqrisk.mcp.results import Charge

# The client a tool calls with: made per call from the caller's key (None: the configured one)
# and address (host, port) as the MCP request came (None over stdio), so that the API's limits
# count the real client, never the MCP server.
Address = tuple[str, int]
Connect = Callable[[str | None, Address | None], AsyncClient]
Tool = Callable[..., Awaitable[Any]]
TOOLS: list[Tool] = []


def tool(fn: Tool) -> Tool:
    """Registers `fn` as a tool of every server `eqrisk.mcp.server.build` makes."""
    TOOLS.append(fn)
    return fn


def key_of(headers: Any) -> str | None:
    """The caller's key from the MCP request's headers (`Authorization: Bearer`, or
    `X-API-Key`); None over stdio, where the configured key is used."""
    if headers is None:
        return None
    auth = str(headers.get("authorization") or "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    key = headers.get("x-api-key")
    return str(key).strip() or None if key else None


def address_of(ctx: Context) -> Address | None:
    """The address the MCP request came from (the HTTP transport's request; None over stdio)."""
    request = ctx.request_context.request
    client = getattr(request, "client", None)
    if client is None:
        return None
    return (str(client.host), int(client.port or 0))


def advice(exc: EqriskError) -> str:
    """The tool error's text: what the service said, and what the user can do about it."""
    said = f"eqrisk answered {exc.status} {exc.code}: {exc.detail}"
    if isinstance(exc, InsufficientBalance):
        need = f" (the call needs {exc.required_usd} USD, the balance is {exc.balance_usd} USD)"
        todo = (
            need + ". Nothing was charged. Add credit to the account (ask its operator), "
            "or use estimate_cost first to pick a cheaper call."
        )
    elif isinstance(exc, RateLimited):
        wait = f"{exc.retry_after:g} seconds" if exc.retry_after is not None else "a moment"
        todo = f". Nothing was charged. Wait {wait}, then call the tool again."
    elif isinstance(exc, AuthenticationError):
        todo = (
            ". Send your eqrisk API key: the MCP request's `Authorization: Bearer <key>` header "
            "over HTTP, EQRISK_API_KEY for `eqrisk mcp` over stdio."
        )
    elif isinstance(exc, DemoRestricted):
        todo = (
            f". The demo key covers {', '.join(exc.allowed_tickers) or 'seven tickers'}: use "
            "one of them, or a key of your own."
        )
    elif isinstance(exc, NotFound):
        hint = f" Did you mean: {', '.join(exc.suggestions)}?" if exc.suggestions else ""
        todo = f". Use search_tickers to find the symbol.{hint}"
    elif isinstance(exc, InvalidParameter):
        accepted = f" Accepted: {exc.accepted}." if exc.accepted else ""
        todo = f". Fix the argument and call again.{accepted}"
    else:
        todo = "."
    request = f" (request {exc.request_id})" if exc.request_id else ""
    return said.rstrip(".") + todo + request


class Calls:
    """The client of one tool call and the calls it made (their charges add up)."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.made: list[Any] = []

    def note(self) -> None:
        self.made.append(self.client.last_call)

    def charge(self) -> Charge:
        return Charge.of(self.made)


@asynccontextmanager
async def api(ctx: Context) -> AsyncIterator[Calls]:
    """A client with the caller's key for one tool call; its errors become tool errors."""
    connect: Connect = getattr(ctx.mcp_server, "connect")  # noqa: B009 - set by server.build
    async with connect(key_of(ctx.headers), address_of(ctx)) as client:
        try:
            yield Calls(client)
        except EqriskError as exc:
            raise ToolError(advice(exc)) from exc


TICKER_PATTERN = r"^\s*[A-Za-z0-9][A-Za-z0-9.\-]{0,31}\s*$"
Ticker = Annotated[
    str,
    Field(
        description="A ticker symbol, e.g. NVDA (case-insensitive): letters, digits, '.' and "
        "'-', at most 32.",
        min_length=1,
        max_length=40,
        pattern=TICKER_PATTERN,
    ),
]


@tool
async def search_tickers(
    query: Annotated[str, Field(description="Part of a ticker or company name.", min_length=1)],
    ctx: Context,
    limit: Annotated[int, Field(description="Most hits to return.", ge=1, le=100)] = 10,
) -> results.TickerSearch:
    """Find stocks and ETFs by ticker or company name (free). Use it to turn a company name
    into the ticker the other tools take."""
    async with api(ctx) as calls:
        frame = await calls.client.tickers(query, include_metadata=True)
        calls.note()
        return results.TickerSearch.of(query, frame, limit, calls.charge())


@tool
async def risk_snapshot(ticker: Ticker, ctx: Context) -> results.RiskSnapshot:
    """A stock's latest risk (GET /api/metrics, 0.005 USD): volatility, and at each hedge level
    (L1 market, L2 + sector, L3 + subsector) the ETFs to hedge with, their hedge ratios and
    the share of the stock's variance each explains."""
    async with api(ctx) as calls:
        answer = await calls.client.metrics(ticker)
        calls.note()
        return results.RiskSnapshot.of(answer, calls.charge())


@tool
async def hedge_positions(
    positions: Annotated[
        dict[str, float],
        Field(
            description="The book: ticker -> dollars held (negative for short), e.g. "
            '{"NVDA": 600000, "AAPL": -150000}.',
            min_length=1,
        ),
    ],
    ctx: Context,
    level: Annotated[
        Literal["L1", "L2", "L3"],
        Field(description="L1 hedges the market, L2 also sectors, L3 also subsectors."),
    ] = "L3",
) -> results.Hedge:
    """The ETF trades that hedge a book's market, sector and subsector exposure (one POST
    /api/batch/analyze: 0.002 USD a ticker analysed, 0.01 USD at least). Each trade is the
    dollars of that ETF to buy (+) or sell (-)."""
    async with api(ctx) as calls:
        book = await calls.client.portfolio(positions)
        calls.note()
        return results.Hedge.of(book, level, calls.charge())


@tool
async def returns_summary(
    ticker: Ticker,
    ctx: Context,
    years: Annotated[int, Field(description="How many years back, 1 to 15.", ge=1, le=15)] = 1,
) -> results.ReturnsSummary:
    """A stock's daily return history summarised (GET /api/ticker-returns, 0.005 USD):
    cumulative return and volatility, what the L3 hedge would have left (residual return and
    volatility), the latest hedge ratios and the mean explained-risk shares."""
    async with api(ctx) as calls:
        frame = await calls.client.ticker_returns(ticker, years)
        calls.note()
        return results.ReturnsSummary.of(ticker.strip().upper(), frame, calls.charge())


@tool
async def estimate_cost(
    endpoint: Annotated[
        str,
        Field(
            description="The route to price, e.g. metrics, ticker-returns, batch/analyze, "
            "l3-decomposition."
        ),
    ],
    ctx: Context,
    params: Annotated[
        dict[str, Any] | None,
        Field(description='The call\'s parameters, e.g. {"ticker": "NVDA", "years": 5}.'),
    ] = None,
) -> results.CostEstimate:
    """What a call would cost now, before making it (POST /api/estimate, free)."""
    async with api(ctx) as calls:
        answer = await calls.client.estimate(endpoint, params)
        calls.note()
        return results.CostEstimate.of(answer, calls.charge())


@tool
async def portfolio_risk(
    positions: Annotated[
        dict[str, float],
        Field(
            description="The book: ticker -> weight or dollars (negative for short), e.g. "
            '{"NVDA": 600000, "AAPL": -150000}.',
            min_length=1,
        ),
    ],
    ctx: Context,
    benchmark: Annotated[
        str | None,
        Field(description="A ticker to measure the tracking error against, e.g. SPY."),
    ] = None,
    date: Annotated[
        str | None, Field(description="The session (YYYY-MM-DD); default the latest.")
    ] = None,
    level: Annotated[
        Literal["L1", "L2", "L3"],
        Field(description="Hedge level: L1 market, L2 also sectors, L3 also subsectors."),
    ] = "L3",
) -> results.PortfolioRiskResult:
    """A book's predicted volatility from eqrisk's factor risk model, its tracking error, the
    contribution of each level, ETF factor and position (they add up to the volatility), the
    ETF hedge and the volatility left after it (POST /api/portfolio/risk: 0.0004 USD per
    position used, 0.01 USD at least)."""
    async with api(ctx) as calls:
        answer = await calls.client.portfolio_risk(
            positions, benchmark=benchmark, date=date, level=level
        )
        calls.note()
        return results.PortfolioRiskResult.of(answer.raw, calls.charge())


@tool
async def decompose_stock(ticker: Ticker, ctx: Context) -> results.Decomposition:
    """A stock's risk as four bets (POST /api/decompose, 0.005 USD): the share of its variance
    explained by the market, its sector and its subsector ETF and what is left (its own risk),
    each layer's hedge ratio and ETF, and the dollars of each ETF to hold per $1 of stock to
    hedge it."""
    async with api(ctx) as calls:
        answer = await calls.client.decompose(ticker)
        calls.note()
        return results.Decomposition.of(answer, calls.charge())


@tool
async def factor_correlation(
    ticker: Ticker,
    ctx: Context,
    factors: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=40, pattern=r"^[A-Za-z0-9_\-]+$")]]
        | None,
        Field(
            description="Factor keys (default: all 18): macro inflation, term_spread, "
            "short_rates, credit, oil, gold, usd, volatility, bitcoin, vix_spot; style "
            "momentum, quality, low_vol, value, growth, size, dividend, moat.",
            max_length=40,
        ),
    ] = None,
    return_type: Annotated[
        Literal["gross", "l1", "l2", "l3_residual"],
        Field(description="The stock's daily return (gross) or what the L1, L2 or L3 hedge left."),
    ] = "l3_residual",
    window_days: Annotated[
        int, Field(description="The last N sessions both series have.", ge=20, le=2000)
    ] = 252,
    method: Annotated[
        Literal["pearson", "spearman"], Field(description="pearson or spearman (ranks).")
    ] = "pearson",
) -> results.FactorCorrelation:
    """How a stock's returns move with macro and style factors (POST /api/correlation,
    0.002 USD): per factor, the correlation with its ETF's daily returns, the ETF read and the
    ETF it stands in for where it is a proxy. A factor the data set lacks is null, never
    invented. Use l3_residual (default) to see what the ETF hedge leaves exposed."""
    async with api(ctx) as calls:
        answer = await calls.client.factor_correlation(
            ticker.strip().upper(),
            factors,
            return_type=return_type,
            window_days=window_days,
            method=method,
        )
        calls.note()
        return results.FactorCorrelation.of(answer, calls.charge())


@tool
async def rankings(
    ticker: Ticker,
    ctx: Context,
    metric: Annotated[
        Literal[
            "mkt_cap",
            "gross_return",
            "sector_residual",
            "subsector_residual",
            "er_l1",
            "er_l2",
            "er_l3",
        ]
        | None,
        Field(description="Only this metric (default: all seven)."),
    ] = None,
    cohort: Annotated[
        Literal["universe", "sector", "subsector"] | None,
        Field(description="Only ranks among this cohort (default: all three)."),
    ] = None,
    window: Annotated[
        Literal["1d", "21d", "63d", "252d"] | None,
        Field(description="Only this window (default: all four)."),
    ] = None,
) -> results.Rankings:
    """Where a stock ranks on the latest session (GET /api/rankings/{ticker}, 0.001 USD):
    per metric (market cap, return, sector and subsector residual return, explained risk at
    L1-L3), cohort (the universe, its sector, its subsector) and window, its rank (1 is the
    largest value), the cohort's size and its percentile."""
    async with api(ctx) as calls:
        frame = await calls.client.rankings(ticker, metric=metric, cohort=cohort, window=window)
        calls.note()
        return results.Rankings.of(frame, calls.charge())

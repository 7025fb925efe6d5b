"""The MCP server, driven by the SDK's own client against a real `eqrisk serve`: over streamable
HTTP (/mcp, mounted by serve) and over stdio (`eqrisk mcp` as a child process calling that
server). Tool list and schemas, results equal to the routes' answers computed here from the
routes' JSON, the charges in the ledger, and 402 / 429 / unknown tickers as tool errors that
say what to do."""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import numpy as np
import pytest
from mcp import Client as McpClient
from mcp import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from eqrisk.accounts.book import STARTING_CREDIT_TOKENS, Accounts
from eqrisk.accounts.db import make_engine
from eqrisk.accounts.pricing import tokens_to_usd
from helpers import REPO_ROOT, Server, assert_problem, bearer, new_key, register_key

FUNDED = "mcp-test-funded-key-0001"
TOOLS = {
    "search_tickers",
    "risk_snapshot",
    "hedge_positions",
    "returns_summary",
    "estimate_cost",
    "portfolio_risk",
    "decompose_stock",
    "factor_correlation",
    "rankings",
}
TRANSPORTS = ["http", "stdio"]
Session = Callable[[str], Any]


@pytest.fixture(scope="module")
def home(demo_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("mcp-home")
    shutil.copytree(demo_home / "snapshots", target / "snapshots")
    register_key(target, FUNDED)
    return target


@pytest.fixture(scope="module")
def server(home: Path) -> Iterator[Server]:
    with Server(home) as running:
        yield running


@pytest.fixture(scope="module")
def accounts(home: Path) -> Accounts:
    return Accounts(make_engine(home))


@asynccontextmanager
async def session(transport: str, base: str, key: str) -> AsyncIterator[McpClient]:
    """An MCP client session with `key`: the HTTP endpoint of `base`, or `eqrisk mcp` over
    stdio calling `base`."""
    if transport == "http":
        http = httpx2.AsyncClient(headers=bearer(key), timeout=60)
        target: Any = streamable_http_client(f"{base}/mcp", http_client=http)
    else:
        # An assistant's `eqrisk mcp` is a client of `base`: it has no home of its own.
        env = {
            "EQRISK_URL": base,
            "EQRISK_API_KEY": key,
            "EQRISK_HOME": "/nonexistent/eqrisk-home",
            "PATH": "/usr/bin:/bin",
        }
        target = StdioServerParameters(
            command=sys.executable, args=["-m", "eqrisk.cli", "mcp"], env=env, cwd=str(REPO_ROOT)
        )
    async with McpClient(target) as client:
        yield client


def run(transport: str, base: str, key: str, body: Callable[[McpClient], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        async with session(transport, base, key) as client:
            return await body(client)

    return asyncio.run(main())


def route(base: str, key: str, method: str, path: str, **kw: Any) -> httpx.Response:
    response = httpx.request(method, f"{base}{path}", headers=bearer(key), timeout=60, **kw)
    assert response.status_code == 200, response.text
    return response


def charges(accounts: Accounts, account_id: str) -> list[tuple[str, int]]:
    """The account's charges in the ledger (route, tokens), oldest first."""
    return [(e["route"], -e["tokens"]) for e in accounts.ledger(account_id) if e["tokens"] < 0]


# ------------------------------------------------------------------------------ tools


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_tools_are_listed_with_typed_described_inputs_and_outputs(
    server: Server, transport: str
) -> None:
    async def body(client: McpClient) -> Any:
        return (await client.list_tools()).tools

    tools = {t.name: t for t in run(transport, server.base, FUNDED, body)}
    assert set(tools) == TOOLS
    for tool in tools.values():
        assert tool.description and len(tool.description) > 40, tool.name
        properties = tool.input_schema["properties"]
        assert "ctx" not in properties
        for name, spec in properties.items():
            assert spec.get("description"), (tool.name, name)
        assert tool.output_schema is not None
        assert "charge" in tool.output_schema["properties"], tool.name
    assert tools["risk_snapshot"].input_schema["required"] == ["ticker"]
    positions = tools["hedge_positions"].input_schema["properties"]["positions"]
    assert positions["type"] == "object" and positions["additionalProperties"]["type"] == "number"
    level = tools["hedge_positions"].input_schema["properties"]["level"]
    assert level["enum"] == ["L1", "L2", "L3"] and level["default"] == "L3"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_tool_results_equal_the_routes_and_are_charged_as_the_routes(
    server: Server, home: Path, accounts: Accounts, transport: str
) -> None:
    account_id, key = new_key(accounts)
    book = {"NVDA": 600_000.0, "AAPL": 250_000.0, "TSLA": -150_000.0}

    async def body(client: McpClient) -> dict[str, Any]:
        out = {}
        for name, args in (
            ("search_tickers", {"query": "nv"}),
            ("risk_snapshot", {"ticker": "nvda"}),
            ("hedge_positions", {"positions": book, "level": "L2"}),
            ("returns_summary", {"ticker": "MSFT", "years": 2}),
            ("estimate_cost", {"endpoint": "ticker-returns", "params": {"ticker": "NVDA"}}),
        ):
            result = await client.call_tool(name, args)
            assert not result.is_error, result.content
            assert json.loads(result.content[0].text) == result.structured_content
            out[name] = result.structured_content
        return out

    got = run(transport, server.base, key, body)
    ledger = charges(accounts, account_id)
    # Priced as the routes: metrics, ticker-returns 0.005 USD; a batch of 3 tickers 0.01 USD
    # (its minimum); search and estimate free.
    assert ledger == [("metrics", 250), ("batch/analyze", 500), ("ticker-returns", 250)]
    for name, cost in (
        ("search_tickers", 0.0),
        ("risk_snapshot", 0.005),
        ("hedge_positions", 0.01),
        ("returns_summary", 0.005),
        ("estimate_cost", 0.0),
    ):
        assert got[name]["charge"]["cost_usd"] == pytest.approx(cost), name
    balance = tokens_to_usd(STARTING_CREDIT_TOKENS - 1000)
    assert got["estimate_cost"]["charge"]["balance_usd"] == pytest.approx(float(balance))

    base = server.base
    hits = route(base, key, "GET", "/api/tickers", params={"search": "nv"}).json()
    rows = hits.get("results") or hits.get("data") or hits.get("tickers")
    assert [h["ticker"] for h in got["search_tickers"]["hits"]] == [
        r["ticker"] if isinstance(r, dict) else r for r in rows
    ][:10]

    metrics = route(base, key, "GET", "/api/metrics/NVDA").json()
    snap = got["risk_snapshot"]
    assert snap["ticker"] == "NVDA" and snap["date"] == metrics["teo"]
    assert snap["metrics"] == metrics["metrics"]
    for level in snap["levels"]:
        want = metrics["hedge_levels"][level["level"]]
        etfs = want["hedge_etfs"]
        assert level["hedge_ratios"] == {
            etfs[r]: want[f"{r}_hr"] for r in ("market", "sector", "subsector") if etfs[r]
        }
        assert level["explained_risk"]["residual"] == want["residual_er"]

    batch = route(
        base,
        key,
        "POST",
        "/api/batch/analyze",
        json={"tickers": list(book), "metrics": ["full_metrics"]},
    ).json()["results"]
    exposure: dict[str, float] = {}
    for ticker, dollars in book.items():
        levels = batch[ticker]["hedge_levels"]["L2"]
        for role in ("market", "sector"):
            etf = levels["hedge_etfs"][role]
            exposure[etf] = exposure.get(etf, 0.0) + dollars * levels[f"{role}_hr"]
    trades = {t["etf"]: t for t in got["hedge_positions"]["trades"]}
    assert set(trades) == set(exposure)
    for etf, dollars in exposure.items():
        assert trades[etf]["exposure"] == pytest.approx(dollars, rel=1e-12)
        assert trades[etf]["trade"] == -trades[etf]["exposure"]

    rows = route(
        base, key, "GET", "/api/ticker-returns", params={"ticker": "MSFT", "years": 2}
    ).json()["data"]
    r = np.array([x["returns_gross"] for x in rows if x["returns_gross"] is not None])
    rr = np.array([x["l3_rr"] for x in rows if x.get("l3_rr") is not None])
    summary = got["returns_summary"]
    assert summary["sessions"] == len(rows)
    assert summary["start"] == rows[0]["date"][:10] and summary["end"] == rows[-1]["date"][:10]
    assert summary["cumulative_return"] == pytest.approx(np.prod(1 + r) - 1, rel=1e-12)
    assert summary["annualized_volatility"] == pytest.approx(
        np.std(r, ddof=1) * math.sqrt(252), rel=1e-12
    )
    assert summary["hedged_cumulative_return"] == pytest.approx(np.prod(1 + rr) - 1, rel=1e-12)
    assert summary["latest_hedge_ratios"]["subsector"] == rows[-1]["l3_sub_hr"]

    estimate = route(
        base,
        key,
        "POST",
        "/api/estimate",
        json={"endpoint": "ticker-returns", "params": {"ticker": "NVDA"}},
    ).json()
    assert got["estimate_cost"]["estimated_cost_usd"] == estimate["estimated_cost_usd"] == 0.005
    assert got["estimate_cost"]["estimated_rows"] == estimate["estimated_rows"]
    # The route calls made here were charged too: the ledger is the routes'.
    assert charges(accounts, account_id)[3:] == [
        ("metrics", 250),
        ("batch/analyze", 500),
        ("ticker-returns", 250),
    ]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_portfolio_risk_equals_the_route_and_is_charged_as_the_route(
    server: Server, accounts: Accounts, transport: str
) -> None:
    account_id, key = new_key(accounts)
    book = {"NVDA": 600_000.0, "AAPL": 250_000.0, "MSFT": -150_000.0, "NOPE": 1.0}
    args = {"positions": book, "benchmark": "SPY", "level": "L2"}

    async def body(client: McpClient) -> Any:
        result = await client.call_tool("portfolio_risk", args)
        assert not result.is_error, result.content
        return result.structured_content

    got = run(transport, server.base, key, body)
    doc = route(
        server.base,
        key,
        "POST",
        "/api/portfolio/risk",
        json={"positions": book, "benchmark": "SPY", "level": "L2"},
    ).json()
    assert got["vol_daily"] == doc["portfolio"]["vol_daily"]
    assert got["tracking_error_daily"] == doc["tracking_error"]["vol_daily"]
    assert got["vol_after_hedge_daily"] == doc["hedge"]["vol_after_daily"]
    assert {x["name"]: x["contribution"] for x in got["by_position"]} == {
        x["ticker"]: x["contribution"] for x in doc["portfolio"]["positions"]
    }
    assert sum(x["contribution"] for x in got["by_level"]) == pytest.approx(got["vol_daily"])
    assert got["unused"] == {"NOPE": "not in the model's universe"}
    # Three positions used at 0.0004 USD is under the 0.01 USD minimum; the route, the same.
    assert got["charge"]["cost_usd"] == pytest.approx(0.01)
    assert charges(accounts, account_id) == [("portfolio/risk", 500), ("portfolio/risk", 500)]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_402_429_and_unknown_tickers_are_tool_errors_that_say_what_to_do(
    server: Server, accounts: Accounts, transport: str
) -> None:
    poor_id, poor = new_key(accounts)
    accounts.charge(
        poor_id,
        STARTING_CREDIT_TOKENS - 100,
        key_id="x",
        route="setup",
        params_digest="",
        request_id="",
    )
    slow_id, slow = new_key(accounts, rate_limit="1/minute")

    async def calls(client: McpClient, *names_args: tuple[str, dict[str, Any]]) -> list[Any]:
        return [await client.call_tool(name, args) for name, args in names_args]

    async def poor_body(client: McpClient) -> list[Any]:
        return await calls(client, ("risk_snapshot", {"ticker": "NVDA"}))

    async def slow_body(client: McpClient) -> list[Any]:
        return await calls(
            client,
            ("risk_snapshot", {"ticker": "NVDA"}),
            ("risk_snapshot", {"ticker": "NVDA"}),
            ("risk_snapshot", {"ticker": "NOSUCH"}),
        )

    (broke,) = run(transport, server.base, poor, poor_body)
    assert broke.is_error
    text = broke.content[0].text
    assert "402 INSUFFICIENT_BALANCE" in text and "Add credit" in text
    assert "0.005" in text and "0.002" in text and "Nothing was charged" in text
    assert charges(accounts, poor_id) == [("setup", STARTING_CREDIT_TOKENS - 100)]

    first, limited, _ = run(transport, server.base, slow, slow_body)
    assert not first.is_error
    assert limited.is_error
    text = limited.content[0].text
    assert "429 RATE_LIMIT_EXCEEDED" in text and "Wait" in text and "call the tool again" in text
    assert charges(accounts, slow_id) == [("metrics", 250)]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_unknown_ticker_says_to_search(server: Server, transport: str) -> None:
    async def body(client: McpClient) -> Any:
        return await client.call_tool("risk_snapshot", {"ticker": "NOSUCH"})

    result = run(transport, server.base, FUNDED, body)
    assert result.is_error
    text = result.content[0].text
    assert "404 TICKER_NOT_FOUND" in text and "search_tickers" in text


# ------------------------------------------------------------------------------ resources


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_resources_are_the_model_documentation_and_the_served_lineage(
    server: Server, transport: str
) -> None:
    async def body(client: McpClient) -> dict[str, str]:
        listed = (await client.list_resources()).resources
        out = {}
        for resource in listed:
            read = await client.read_resource(resource.uri)
            out[str(resource.uri)] = read.contents[0].text
        return out

    texts = run(transport, server.base, FUNDED, body)
    assert set(texts) == {"eqrisk://docs/model", "eqrisk://lineage/current"}
    model = texts["eqrisk://docs/model"]
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("## The model\n", 1)[1].split("\n## ", 1)[0].strip()
    assert section and section in model
    lineage = json.loads(texts["eqrisk://lineage/current"])
    health = httpx.get(f"{server.base}/api/health", timeout=30).json()
    assert lineage["model_version"] == health["model_version"]
    assert lineage["data_as_of"] == health["data_as_of"]
    assert lineage["universe_size"] > 100 and lineage["method"]["window"] == 252
    assert lineage["risk_accuracy"] == health["risk_accuracy"]  # every build stores it
    assert lineage["risk_accuracy"]["horizons"]["21d"]["hedged_l3_200"]["model"]["bias"] > 0


# ------------------------------------------------------------------------------ the endpoint


def test_the_http_endpoint_wants_a_key_and_logs_no_key(server: Server) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    response = httpx.post(f"{server.base}/mcp", json=body, timeout=30)
    problem = assert_problem(response, 401, "AUTHENTICATION_REQUIRED")
    assert "Authorization: Bearer" in problem["detail"]
    assert response.headers["www-authenticate"].startswith("Bearer")

    async def tool_call(client: McpClient) -> Any:
        return await client.call_tool("risk_snapshot", {"ticker": "AAPL"})

    assert not run("http", server.base, FUNDED, tool_call).is_error
    log = server.log_with("POST /mcp 200", "GET /api/metrics/AAPL 200")
    assert FUNDED not in log  # the key never reaches the log


# ------------------------------------------------------------------ callers kept apart


@asynccontextmanager
async def from_address(base: str, key: str, address: str) -> AsyncIterator[McpClient]:
    """An MCP client over HTTP whose connections come from `address` (a loopback address of
    its own: two clients, two addresses, as two machines would be)."""
    transport = httpx2.AsyncHTTPTransport(local_address=address)
    http = httpx2.AsyncClient(headers=bearer(key), timeout=60, transport=transport)
    async with McpClient(streamable_http_client(f"{base}/mcp", http_client=http)) as client:
        yield client


def test_one_mcp_client_cannot_lock_another_out(server: Server, accounts: Accounts) -> None:
    """20 bad keys through /mcp from one client count against that client's address only:
    its next key is refused unread (429), while another MCP client and a REST caller keep
    being served. Their keys are new (never looked up before): a key the server knows is
    not refused for its address."""
    attacker, victim = "127.0.0.2", "127.0.0.3"
    _, fresh = new_key(accounts)
    _, rest = new_key(accounts)

    async def main() -> tuple[list[Any], Any]:
        results = []
        async with from_address(server.base, "not-a-key-" + "x" * 20, attacker) as bad:
            for _ in range(21):
                results.append(await bad.call_tool("risk_snapshot", {"ticker": "NVDA"}))
        async with from_address(server.base, fresh, victim) as other:
            served = await other.call_tool("risk_snapshot", {"ticker": "NVDA"})
        return results, served

    results, served = asyncio.run(main())
    assert all(r.is_error for r in results)
    assert "401 INVALID_API_KEY" in results[0].content[0].text
    assert "429 RATE_LIMIT_EXCEEDED" in results[-1].content[0].text
    assert not served.is_error, served.content[0].text
    assert served.structured_content["ticker"] == "NVDA"
    route(server.base, rest, "GET", "/api/metrics/NVDA")  # the REST caller (127.0.0.1) too


@pytest.mark.parametrize("ticker", ["../balance", "JPM?version=x", "NVDA#x", "%2F", "a/b"])
def test_a_ticker_that_is_not_one_is_a_free_tool_error(
    server: Server, accounts: Accounts, ticker: str
) -> None:
    account_id, key = new_key(accounts)

    async def body(client: McpClient) -> list[Any]:
        return [
            await client.call_tool("risk_snapshot", {"ticker": ticker}),
            await client.call_tool("returns_summary", {"ticker": ticker}),
        ]

    for result in run("http", server.base, key, body):
        assert result.is_error
        assert "ticker" in result.content[0].text and "pattern" in result.content[0].text
    assert charges(accounts, account_id) == []


def test_the_new_tools_refuse_a_ticker_that_is_not_one_for_free(
    server: Server, accounts: Accounts
) -> None:
    account_id, key = new_key(accounts)
    hostile = ["../balance", "JPM?version=x", "NVDA#x", "%2F", "a/b"]

    async def body(client: McpClient) -> list[Any]:
        return [
            await client.call_tool(name, {"ticker": ticker})
            for ticker in hostile
            for name in ("factor_correlation", "rankings", "decompose_stock")
        ] + [await client.call_tool("factor_correlation", {"ticker": "NVDA", "factors": ["a/b"]})]

    answers = run("http", server.base, key, body)
    assert len(answers) == 16
    for result in answers[:-1]:
        assert result.is_error
        assert "ticker" in result.content[0].text and "pattern" in result.content[0].text
    assert answers[-1].is_error and "pattern" in answers[-1].content[0].text
    assert charges(accounts, account_id) == []


def test_factor_correlation_and_rankings_are_their_routes(
    server: Server, accounts: Accounts
) -> None:
    account_id, key = new_key(accounts)
    args = {"ticker": "nvda", "factors": ["credit", "mom"], "window_days": 60, "method": "spearman"}

    async def body(client: McpClient) -> list[dict[str, Any]]:
        out = []
        for name, arguments in (
            ("factor_correlation", args),
            ("rankings", {"ticker": "nvda", "window": "21d"}),
        ):
            result = await client.call_tool(name, arguments)
            assert not result.is_error, result.content
            out.append(dict(result.structured_content or {}))
        return out

    got, ranks = run("http", server.base, key, body)
    body_sent = {**args, "ticker": "NVDA", "return_type": "l3_residual"}
    want = route(server.base, key, "POST", "/api/correlation", json=body_sent).json()
    assert got["ticker"] == "NVDA" and got["method"] == "spearman" and got["window_days"] == 60
    assert got["overlap_days"] == want["overlap_days"] and got["warnings"] == want["warnings"]
    assert [f["factor"] for f in got["factors"]] == ["credit", "momentum"]
    for item in got["factors"]:
        assert item["correlation"] == want["correlations"][item["factor"]]
        assert item["etf"] == want["sources"][item["factor"]]["etf"]
        assert item["proxy_for"] == want["sources"][item["factor"]]["proxy_for"]
    # the demo data set holds no macro ETF: null with a warning naming the vendor's ETF
    assert all(f["correlation"] is None for f in got["factors"])
    assert any("HYG" in w for w in got["warnings"])
    assert got["charge"]["cost_usd"] == pytest.approx(0.002)

    grid = route(server.base, key, "GET", "/api/rankings/NVDA", params={"window": "21d"}).json()
    assert ranks["ticker"] == "NVDA" and ranks["date"] == grid["teo"]
    assert len(ranks["ranks"]) == len(grid["rankings"]) == 21  # 7 metrics x 3 cohorts
    for mine, theirs in zip(ranks["ranks"], grid["rankings"], strict=True):
        assert (mine["metric"], mine["cohort"], mine["window"]) == (
            theirs["metric"],
            theirs["cohort"],
            theirs["window"],
        )
        assert mine["rank"] == theirs["rank_ordinal"]
        assert mine["cohort_size"] == theirs["cohort_size"]
        assert mine["percentile"] == theirs["rank_percentile"]
        assert mine["value"] == theirs["value"]
    assert sum(r["rank"] is not None for r in ranks["ranks"]) > 0
    assert ranks["charge"]["cost_usd"] == pytest.approx(0.001)
    assert charges(accounts, account_id) == [
        ("correlation", 100),
        ("rankings", 50),
        ("correlation", 100),
        ("rankings", 50),
    ]


def test_decompose_stock_is_the_decompose_route(server: Server, accounts: Accounts) -> None:
    account_id, key = new_key(accounts)

    async def body(client: McpClient) -> dict[str, Any]:
        result = await client.call_tool("decompose_stock", {"ticker": "nvda"})
        assert not result.is_error, result.content
        return dict(result.structured_content or {})

    got = run("http", server.base, key, body)
    want = route(server.base, key, "POST", "/api/decompose", json={"ticker": "NVDA"}).json()
    assert got["ticker"] == "NVDA" and got["date"] == want["teo"]
    assert [layer["layer"] for layer in got["layers"]] == list(want["exposure"])
    for layer in got["layers"]:
        block = want["exposure"][layer["layer"]]
        assert layer["explained_risk"] == block["er"] and layer["hedge_ratio"] == block["hr"]
    assert got["hedge"] == want["hedge"]
    assert got["charge"]["cost_usd"] == pytest.approx(0.005)
    assert charges(accounts, account_id) == [("decompose", 250), ("decompose", 250)]

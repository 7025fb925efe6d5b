"""eqrisk.client against a real `eqrisk serve` and against the app in process (ASGITransport):
every method, every typed exception from a real answer, the 429 retry, the portfolio hedge."""

from __future__ import annotations

import asyncio
import inspect
import time
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest

from client.conftest import FUNDED, SLOW, MakeClient
from eqrisk.accounts.book import STARTING_CREDIT_TOKENS, Accounts
from eqrisk.accounts.db import make_engine
from eqrisk.api.app import create_app
from eqrisk.client import (
    AccountInactive,
    AsyncClient,
    AuthenticationError,
    Client,
    DemoRestricted,
    InsufficientBalance,
    InvalidParameter,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    ServiceUnavailable,
)
from eqrisk.client.frames import portfolio_of
from eqrisk.data.master import MAG7
from eqrisk.settings import Settings
from helpers import Server, new_key


def test_service_b_methods(make: MakeClient) -> None:
    c = make()
    health = c.health()
    assert health["status"] == "ok" and health["model_version"]
    assert c.last_call is not None and c.last_call.model_version == health["model_version"]
    ready = c.ready()
    assert ready["ready"] and ready["snapshot"]["version"] == health["model_version"]
    assert c.balance()["balance_usd"] > 0
    listed = c.tickers()
    assert {"NVDA", "SPY"} <= set(listed["ticker"])
    assert list(c.tickers(mag7=True)["ticker"]) == list(MAG7)
    assert "NVDA" in set(c.tickers("nvid")["ticker"])

    metrics = c.metrics("nvda")
    assert c.last_call.cost_usd == pytest.approx(0.005) and c.last_call.tokens == 250
    values = metrics.get("metrics", metrics)
    series = c.ticker_returns("NVDA", years=1)
    assert isinstance(series, pd.DataFrame) and len(series) > 200
    assert pd.api.types.is_datetime64_any_dtype(series["date"])
    assert series.attrs["model_version"] == health["model_version"]
    assert series.attrs["data_as_of"] == health["data_as_of"]
    assert series["date"].iloc[-1].strftime("%Y-%m-%d") == str(metrics["teo"])
    assert series["l3_mkt_hr"].iloc[-1] == pytest.approx(values["l3_mkt_hr"])
    for fmt in ("json", "csv"):
        other = c.ticker_returns("NVDA", years=1, format=fmt)
        assert list(other["date"]) == list(series["date"])
        assert np.allclose(other["returns_gross"], series["returns_gross"], equal_nan=True)
    gross = c.returns("NVDA")
    assert np.allclose(gross["returns_gross"], series["returns_gross"], equal_nan=True)
    spy = c.etf_returns("SPY", years=2)
    assert len(spy) > len(gross) and spy["returns_gross"].abs().max() < 0.5

    start = series["date"].iloc[-20].strftime("%Y-%m-%d")
    l3 = c.l3_decomposition("NVDA", start=start)
    assert len(l3) == 20 and l3["date"].iloc[-1] == series["date"].iloc[-1]
    shares = l3.filter(regex="^l3_.*_er$").sum(axis=1)
    assert np.allclose(shares, 1.0, atol=1e-6)

    est = c.estimate("/api/metrics/NVDA")
    assert est["estimated_tokens"] == 250
    batch = c.batch_analyze(["NVDA", "NOPE_X"], ["full_metrics"])
    assert batch["results"]["NVDA"]["status"] in ("ok", "success")
    assert batch["results"]["NOPE_X"]["status"] == "error"
    heat = c.heatmap(limit=5)
    assert len(heat) == 5 and heat["market_cap"].is_monotonic_decreasing


def test_service_a_methods(make: MakeClient) -> None:
    c = make()
    daily = c.daily(["NVDA", "AAPL"], "2026-01-02", fields="close,return")
    assert set(daily["symbol"]) == {"NVDA", "AAPL"} and "close" in daily
    gross = c.gross("NVDA", "2026-01-02")
    b_side = c.returns("NVDA").set_index("date")["returns_gross"]
    on = gross.set_index(gross["teo"].dt.tz_localize(None).dt.normalize())["gross_return"]
    common = on.index.intersection(b_side.index)
    assert len(common) > 5 and np.allclose(on[common], b_side[common])
    assert len(c.gross("NVDA", "2026-01-02", format="csv")) == len(gross)
    betas = c.betas("NVDA", "Mkt", "2026-01-02")
    assert (betas["fact"] == "Mkt").all() and betas["factor_beta"].notna().all()
    facts = c.facts("Mkt", "2026-01-02")
    assert len(facts) > 5 and facts["factor_return"].abs().max() < 0.2
    resids = c.resids("NVDA", "2026-01-02")
    assert (
        len(resids) > 5
        and resids["residual_return"].abs().mean() < gross["gross_return"].abs().mean() * 2
    )
    top = c.symbol_list(top_n=3)
    assert len(top) == 3 and top == c.symbol_list(top_n=3, format="csv")


def test_portfolio_notionals_equal_weights_times_metrics_hedge_ratios(make: MakeClient) -> None:
    c = make()
    weights = {"NVDA": 600_000.0, "aapl": 250_000.0, "SPY": -150_000.0, "NOPE_X": 1.0}
    book = c.portfolio(weights)
    assert c.last_call is not None and c.last_call.url.endswith("/api/batch/analyze")
    assert set(book.failed) == {"NOPE_X"}
    expected: dict[tuple[str, str], float] = {}
    levels = {
        "L1": (("l1_mkt_hr", "market_etf"),),
        "L2": (("l2_mkt_hr", "market_etf"), ("l2_sec_hr", "sector_etf")),
        "L3": (
            ("l3_mkt_hr", "market_etf"),
            ("l3_sec_hr", "sector_etf"),
            ("l3_sub_hr", "subsector_etf"),
        ),
    }
    for ticker, weight in (("NVDA", 600_000.0), ("AAPL", 250_000.0), ("SPY", -150_000.0)):
        answer = c.metrics(ticker)
        values, meta = answer["metrics"], answer["meta"]
        for level, pairs in levels.items():
            for hr, etf in pairs:
                if values.get(hr) is not None and meta.get(etf):
                    key = (level, meta[etf])
                    expected[key] = expected.get(key, 0.0) + weight * values[hr]
    got = {(r.level, r.etf): r.notional for r in book.notionals.itertuples()}
    assert set(got) == set(expected) and len(got) >= 4
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-12), key
    assert book.hedge("L1")["SPY"] == pytest.approx(expected["L1", "SPY"])
    nvda = c.metrics("NVDA")["metrics"]["l2_sec_hr"]
    assert book.positions.loc["NVDA", "l2_sec_hr"] == pytest.approx(nvda)
    assert c.hedge_ratios("nvda").loc["NVDA", "l2_sec_hr"] == pytest.approx(nvda)


def test_every_exception_from_a_real_answer(home: Path, server: Server) -> None:
    accounts = Accounts(make_engine(home))
    broke_id, broke = new_key(accounts)
    accounts.charge(
        broke_id,
        STARTING_CREDIT_TOKENS - 100,
        key_id="x",
        route="t",
        params_digest="",
        request_id="",
    )
    gone_id, gone = new_key(accounts)
    accounts.set_state(gone_id, "suspended")
    url = server.base
    with pytest.raises(AuthenticationError) as auth:
        Client(url, "not-a-key").metrics("NVDA")
    assert (
        auth.value.status == 401 and auth.value.code == "INVALID_API_KEY" and auth.value.request_id
    )
    with pytest.raises(InsufficientBalance) as poor:
        Client(url, broke).metrics("NVDA")
    assert poor.value.balance_usd == pytest.approx(0.002)
    assert poor.value.required_usd == pytest.approx(0.005)
    outside = next(t for t in Client(url, FUNDED).symbol_list(top_n=50) if t not in MAG7)
    with pytest.raises(DemoRestricted) as demo:
        Client(url).metrics(outside)  # the demo key by default
    assert demo.value.status == 403 and outside in demo.value.detail
    with pytest.raises(DemoRestricted) as demo_batch:  # the demo key's batch: its seven only
        Client(url).portfolio({"NVDA": 1.0, outside: 1.0})
    assert demo_batch.value.code == "DEMO_RESTRICTED"
    with pytest.raises(AccountInactive):
        Client(url, gone).metrics("NVDA")
    with pytest.raises(NotFound) as missing:
        Client(url, FUNDED).metrics("NVDAX")
    assert missing.value.code == "TICKER_NOT_FOUND" and "NVDA" in missing.value.suggestions
    with pytest.raises(InvalidParameter) as bad:
        Client(url, FUNDED).ticker_returns("NVDA", format="xml")
    assert bad.value.parameters == ["format"] and "parquet" in bad.value.detail
    with pytest.raises(InvalidParameter) as sector:
        Client(url, FUNDED).symbol_list(sector_code="99")
    assert "45" in sector.value.accepted and sector.value.status == 400
    with pytest.raises(PayloadTooLarge):
        Client(url, FUNDED).batch_analyze(["X" * 30] * 50_000)
    with Client(url, SLOW) as slow:
        slow.health()  # free and keyless: does not count
        slow.tickers()
        with pytest.raises(RateLimited) as limited:
            slow.tickers()
    assert limited.value.retry_after is not None and 0 < limited.value.retry_after <= 1


def test_no_snapshot_is_service_unavailable(tmp_path: Path) -> None:
    app = create_app(Settings(home=tmp_path, _env_file=None))
    with pytest.raises(ServiceUnavailable) as down, Client(transport=httpx.ASGITransport(app)) as c:
        c.health()
    assert down.value.status == 503 and down.value.code == "SERVICE_UNAVAILABLE"
    with (
        pytest.raises(ServiceUnavailable) as unready,
        Client(transport=httpx.ASGITransport(app)) as c,
    ):
        c.ready()
    assert unready.value.status == 503


def test_in_process_sync_client_works_inside_a_running_event_loop(home: Path) -> None:
    """A notebook runs its cells in an event loop: the sync client over the ASGI app still
    answers there."""
    app = create_app(Settings(home=home, _env_file=None))

    async def inside() -> dict[str, object]:
        with Client(api_key=FUNDED, transport=httpx.ASGITransport(app)) as c:
            return c.metrics("NVDA")

    answer = asyncio.run(inside())
    assert answer["ticker"] == "NVDA" and answer["metrics"]


def test_rate_limited_call_waits_retry_after_then_succeeds(server: Server) -> None:
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        time.sleep(seconds)

    with Client(server.base, SLOW, retry_rate_limited=3, sleep=sleep) as c:
        c.tickers()  # uses the second's one call (after waiting, if an earlier test used it)
        waits.clear()
        began = time.monotonic()
        hits = c.tickers(mag7=True)
        waited = time.monotonic() - began
    assert list(hits["ticker"]) == list(MAG7) and c.last_call and c.last_call.status == 200
    # Waited what Retry-After said (1 s at 1/second), once, then succeeded.
    assert waits == [1.0] and waited >= 1.0
    # Bounded: a wait over max_wait is not slept, the 429 raises at once (the limit was just
    # used by the call above).
    slept = len(waits)
    bounded = Client(server.base, SLOW, retry_rate_limited=3, max_wait=0.0, sleep=sleep)
    with bounded, pytest.raises(RateLimited):
        bounded.tickers()
    assert len(waits) == slept


def test_every_openapi_operation_has_a_method_taking_its_parameters(tmp_path: Path) -> None:
    spec = create_app(Settings(home=tmp_path, _env_file=None)).openapi()
    aliases = {
        "from": "start",
        "to": "end",
        "etf": "ticker",
        "factor": "factors",
        "timeSeries": "time_series",
    }
    # called by the payment provider, not by users
    provider_only = {"/api/webhooks/payment", "/api/webhooks/stripe"}
    # the drop-in routes' methods are named for what they answer (docs/decisions/drop-in-routes.md)
    named = {
        "/api/correlation": "factor_correlation",
        "/api/metrics/{ticker}/correlation": "factor_correlation",
        "/api/batch/latest-metrics": "latest_metrics",
        "/api/rankings/top": "top_rankings",
        "/api/rankings/screen": "screen_rankings",
        "/api/portfolio/risk-index": "risk_index",
        "/api/universe/{name}/members": "universe_members",
    }
    checked = 0
    problems = []
    for path, operations in spec["paths"].items():
        if path in provider_only:
            continue
        name = named.get(path) or (
            path.removeprefix("/api").strip("/").split("/{")[0].replace("-", "_").replace("/", "_")
        )
        method = getattr(Client, name, None)
        if method is None:
            problems.append(f"no Client method for {path}")
            continue
        accepted = set(inspect.signature(method).parameters)
        for op in operations.values():
            wanted = {p["name"] for p in op.get("parameters", [])}
            ref = op.get("requestBody", {}).get("content", {}).get("application/json", {})
            schema = ref.get("schema", {}).get("$ref", "").rsplit("/", 1)[-1]
            if schema:
                wanted |= set(spec["components"]["schemas"][schema]["properties"])
            missing = {aliases.get(w, w) for w in wanted} - accepted
            if missing:
                problems.append(f"Client.{name} lacks {missing} of {path}")
            checked += 1
    assert problems == []
    # the specification's, the drop-in routes' and the self-service accounts' (keys: GET, POST)
    assert checked == 22 + 15 + 8 + 1


def test_readme_quick_start_runs(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's client example, run as written with the demo key against a real server of
    its own (the demo key's rate limit is per server)."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = text.split("\n## Python client\n", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EQRISK_API_KEY", raising=False)
    with Server(home) as server:
        monkeypatch.setenv("EQRISK_URL", server.base)
        scope: dict[str, object] = {}
        exec(compile(code, "README.md", "exec"), scope)
    hr, book = scope["hr"], scope["book"]
    assert isinstance(hr, pd.DataFrame) and list(hr.index) == ["NVDA", "AAPL", "MSFT"]
    assert hr["l3_mkt_hr"].notna().all() and scope["c"].api_key == "eqrisk-demo"  # type: ignore[attr-defined]
    hedge = book.hedge("L3")  # type: ignore[attr-defined]
    assert "SPY" in hedge.index and np.isfinite(hedge.to_numpy()).all()
    assert "nvda-hedge-ratios.html" in {p.name for p in tmp_path.iterdir()}


def test_async_client_answers_as_the_sync_one(home: Path, server: Server) -> None:
    """AsyncClient against the real server and in process gives the sync client's values, and
    raises the same typed errors."""
    app = create_app(Settings(home=home, _env_file=None))

    async def fetch(client: AsyncClient) -> tuple[object, ...]:
        async with client:
            hr = await client.hedge_ratios(["NVDA", "AAPL"])
            series = await client.ticker_returns("NVDA", format="json")
            gross = await client.gross("NVDA", "2026-01-02")
            book = await client.portfolio({"NVDA": 2.0, "AAPL": -1.0})
            with pytest.raises(NotFound) as missing:
                await client.metrics("NVDAX")
            assert "NVDA" in missing.value.suggestions
            assert client.last_call is not None and client.last_call.status == 404
            return hr, series, gross, book

    with Client(server.base, FUNDED) as sync:
        hr = sync.hedge_ratios(["NVDA", "AAPL"])
        series = sync.ticker_returns("NVDA")
        gross = sync.gross("NVDA", "2026-01-02")
        book = sync.portfolio({"NVDA": 2.0, "AAPL": -1.0})
    for client in (
        AsyncClient(server.base, FUNDED),
        AsyncClient(api_key=FUNDED, transport=httpx.ASGITransport(app)),
    ):
        a_hr, a_series, a_gross, a_book = asyncio.run(fetch(client))
        pd.testing.assert_frame_equal(a_hr, hr)
        assert list(a_series["date"]) == list(series["date"])
        assert np.allclose(a_series["l3_sub_hr"], series["l3_sub_hr"], equal_nan=True)
        pd.testing.assert_frame_equal(a_gross, gross)
        pd.testing.assert_frame_equal(a_book.notionals, book.notionals)  # type: ignore[attr-defined]


def test_async_client_has_the_sync_methods_and_signatures() -> None:
    public = {n for n in dir(Client) if not n.startswith("_")} - {"close"}
    assert public - {n for n in dir(AsyncClient) if not n.startswith("_")} == set()
    for name in public:
        sync, aio = getattr(Client, name), getattr(AsyncClient, name)
        if callable(sync):
            assert inspect.iscoroutinefunction(aio), name
            assert inspect.signature(sync) == inspect.signature(aio), name


def test_portfolio_reads_the_real_service_batch_shape_too(make: MakeClient) -> None:
    """The same book from today's answer and from that answer rewritten in the real service's
    shape (SERVICE-B-WIRE.md section 11: status "success", flat full_metrics with long names,
    the latest hedge_ratios object, entry meta, hedge_levels) gives the same hedge."""
    c = make()
    weights = {"NVDA": 3.0, "AAPL": -1.0}
    answer = c.batch_analyze(list(weights), ["full_metrics"])
    long = {"l1_mkt_hr": "l1_market_hr", "l2_mkt_hr": "l2_market_hr", "l2_sec_hr": "l2_sector_hr"}
    wire: dict[str, dict[str, object]] = {}
    for ticker, entry in answer["results"].items():
        full = entry["full_metrics"]
        values = full.get("metrics", full)
        meta = full.get("meta") or entry.get("meta") or {}
        flat = {long.get(k, k): v for k, v in values.items() if not k.startswith("l3_")}
        wire[ticker] = {
            "status": "success",
            "full_metrics": flat,
            "hedge_ratios": {
                "l3_market": values.get("l3_mkt_hr", values.get("l3_market_hr")),
                "l3_sector": values.get("l3_sec_hr", values.get("l3_sector_hr")),
                "l3_subsector": values.get("l3_sub_hr", values.get("l3_subsector_hr")),
            },
            "meta": {"market_etf": meta["market_etf"], "sector_etf": meta["sector_etf"]},
            "hedge_levels": {"L3": {"hedge_etfs": {"subsector": meta["subsector_etf"]}}},
        }
    ours, theirs = portfolio_of(weights, answer), portfolio_of(weights, {"results": wire})
    pd.testing.assert_frame_equal(ours.notionals, theirs.notionals)
    pd.testing.assert_frame_equal(ours.positions, theirs.positions)
    assert len(ours.notionals) >= 4 and not ours.failed

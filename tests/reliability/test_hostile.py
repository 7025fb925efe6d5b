"""Hostile inputs, in-process against `create_app` with the real gate and a real metered key:
injection strings in every parameter of every route, oversized bodies, headers and query
strings, thousands of symbols, bad UTF-8, repeated and unknown parameters, deep JSON. Every
answer is a 2xx (the input was in fact valid) or a problem+json 4xx carrying its request id;
never a 5xx, and nothing but a 2xx is ever charged.

The requests are raw ASGI calls, so that bytes no HTTP client would send (NUL, CRLF, invalid
UTF-8) reach the application as a lenient proxy could pass them."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from eqrisk.accounts.book import STARTING_CREDIT_TOKENS, Accounts
from eqrisk.accounts.db import make_engine
from eqrisk.api.app import create_app
from eqrisk.settings import Settings
from helpers import WEBHOOK_SECRET

pytestmark = pytest.mark.reliability

MIB = 2**20
INJECTIONS = [
    "' OR '1'='1",
    "1; DROP TABLE ledger; --",
    "../../../../etc/passwd",
    "..%2F..%2F..%2Fetc%2Fpasswd",
    "NVDA\x00",
    "NVDA\r\nX-Injected: yes",
    "%s%s%s%n%x",
    "{0.__class__.__mro__}",
    "${jndi:ldap://127.0.0.1/a}",
    "<script>alert(1)</script>",
    "\u039dVDA",  # Greek capital Nu, looks like N
    "\uff2e\uff36\uff24\uff21",  # fullwidth NVDA
    "NVDA\u200b",
    "A" * 5000,  # a very long ticker, under any query-string cap
    "-1",
    "1e309",
    "NaN",
    "9" * 400,
    "",
]
# A valid value for each parameter name the routes use (the others stay valid while one is
# replaced by a hostile string).
VALID = {
    "ticker": "NVDA",
    "etf": "",  # /api/etf-returns takes `ticker` or `etf`; the baseline gives `ticker`
    "symbols": "NVDA,AAPL",
    "years": "1",
    "start_time": "2026-06-01",
    "end_time": "2026-07-01",
    "fact": "Mkt",
    "from": "2026-01-02",
    "to": "2026-06-01",
    "limit": "10",
    "top_n": "10",
    "format": "json",
    "search": "NV",
    "mag7": "true",
}
VALID_ON = {
    "/api/etf-returns": {"ticker": "XLK"},
    "/api/l3-decomposition": {"years": ""},  # `from` sets the start there: not both
    "/api/batch/latest-metrics": {"tickers": "NVDA,AAPL"},
    "/api/rankings/top": {"metric": "mkt_cap", "cohort": "universe", "window": "1d"},
    "/api/universe/{name}/members": {"name": "uni_mc_50"},
}


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Hostile:
    app: Any
    accounts: Accounts
    account_id: str
    key: str
    seen: Counter[int] = field(default_factory=Counter)
    charged_tokens: int = 0
    charged_calls: int = 0

    def call(
        self,
        method: str,
        path: str,
        query: bytes = b"",
        *,
        body: bytes = b"",
        headers: list[tuple[bytes, bytes]] | None = None,
        chunked: bool = False,
        keyed: bool = True,
        announce: bool = True,
    ) -> Answer:
        """One raw ASGI request; checks the answer's shape and books any charge."""
        hdrs = list(headers or [])
        if keyed:
            hdrs += [
                (b"authorization", f"Bearer {self.key}".encode()),
                (b"apikey", self.key.encode()),
            ]
        if body and announce:  # as an HTTP/1.1 server hands it over: a length, or chunked
            length = (b"transfer-encoding", b"chunked") if chunked else None
            hdrs.append(length or (b"content-length", str(len(body)).encode()))
        if body:
            hdrs.append((b"content-type", b"application/json"))
        answer = asyncio.run(_asgi(self.app, method, path, query, hdrs, body, chunked))
        self.seen[answer.status] += 1
        assert answer.status < 500, (method, path, query[:200], answer.status, answer.body[:300])
        if answer.status >= 400:
            assert answer.headers["content-type"].startswith("application/problem+json")
            doc = answer.json()
            assert doc["status"] == answer.status and doc["error"] and doc["detail"]
            assert doc["request_id"] == answer.headers["x-request-id"]
        tokens = int(answer.headers.get("x-tokens-consumed", "0"))
        if tokens:
            assert 200 <= answer.status < 300, "a non-2xx reported a charge"
            self.charged_tokens += tokens
            self.charged_calls += 1
        return answer


async def _asgi(
    app: Any,
    method: str,
    path: str,
    query: bytes,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    chunked: bool,
) -> Answer:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode("utf-8", "surrogateescape"),
        "query_string": query,
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 80),
    }
    step = 64 * 1024 if chunked else max(len(body), 1)
    parts = [body[i : i + step] for i in range(0, len(body), step)] or [b""]
    messages = [
        {"type": "http.request", "body": part, "more_body": i < len(parts) - 1}
        for i, part in enumerate(parts)
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await asyncio.sleep(3600)  # the client stays connected
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    out = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    names = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in start["headers"]}
    return Answer(start["status"], names, out)


def _query(params: dict[str, str]) -> bytes:
    return "&".join(f"{quote(k)}={quote(v, safe='')}" for k, v in params.items()).encode()


@pytest.fixture(scope="module")
def hostile(demo_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Hostile:
    import shutil

    home = tmp_path_factory.mktemp("hostile") / "home"
    shutil.copytree(demo_home / "snapshots", home / "snapshots")
    accounts = Accounts(make_engine(home))
    account_id = accounts.create_account("hostile")["account_id"]
    accounts.verify_card(account_id, provider="tests")
    key = accounts.create_key(account_id, rate_limit="1000000/minute")["key"]
    # The webhook configured, so that its route reads bodies (unconfigured it answers 404
    # without reading one).
    app = create_app(Settings(home=home, _env_file=None, webhook_secret=WEBHOOK_SECRET))
    return Hostile(app, accounts, account_id, key)


def _operations(app: Any) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(method, path template, [(parameter, location)]) of every documented GET route."""
    ops = []
    for path, item in app.openapi()["paths"].items():
        if "get" in item and not path.startswith(("/docs", "/redoc", "/openapi")):
            params = [(p["name"], p["in"]) for p in item["get"].get("parameters", [])]
            ops.append(("GET", path, params))
    return ops


def _request_for(path: str, params: list[tuple[str, str]], bad: tuple[str, str] | None):
    """Path and query of a call with valid values, one parameter replaced by `bad`."""
    valid = {**VALID, **VALID_ON.get(path, {})}
    values = {name: valid.get(name, "") for name, _ in params}
    if bad is not None:
        values[bad[0]] = bad[1]
    for name, where in params:
        if where == "path":
            path = path.replace("{" + name + "}", values.pop(name))
    query = {k: v for k, v in values.items() if v != "" or (bad and k == bad[0])}
    return path, _query(query)


def test_injection_strings_in_every_parameter_of_every_route(hostile: Hostile, figures) -> None:
    ops = _operations(hostile.app)
    assert len(ops) >= 14, [p for _, p, _ in ops]
    calls = 0
    for method, template, params in ops:
        path, query = _request_for(template, params, None)
        baseline = hostile.call(method, path, query)
        assert baseline.status == 200, (template, baseline.body[:300])
        for name, _ in params:
            for value in INJECTIONS:
                path, query = _request_for(template, params, (name, value))
                hostile.call(method, path, query)
                calls += 1
    balance = hostile.accounts.balance(hostile.account_id)
    assert balance == STARTING_CREDIT_TOKENS - hostile.charged_tokens
    charges = [e for e in hostile.accounts.ledger(hostile.account_id) if e["kind"] == "charge"]
    assert len(charges) == hostile.charged_calls
    figures(
        routes=len(ops),
        hostile_calls=calls,
        statuses=dict(sorted((str(k), v) for k, v in hostile.seen.items())),
        charged_2xx=hostile.charged_calls,
        ledger_rows=len(charges),
        fivexx=0,
    )


def _batch(tickers: list[str]) -> bytes:
    return json.dumps({"tickers": tickers, "metrics": ["returns"]}).encode()


def test_bodies_beyond_one_mib_are_413_and_free(hostile: Hostile) -> None:
    before = hostile.accounts.balance(hostile.account_id)
    big = _batch(["NVDA"] * (MIB // 7))  # valid JSON, about 1.1 MiB
    assert len(big) > MIB
    for path, keyed in (
        ("/api/batch/analyze", True),
        ("/api/estimate", True),
        ("/api/webhooks/payment", False),
    ):
        # a length, chunked, and streamed chunks with neither header (a raw ASGI caller)
        for chunked, announce in ((False, True), (True, True), (True, False)):
            answer = hostile.call(
                "POST", path, body=big, chunked=chunked, keyed=keyed, announce=announce
            )
            assert answer.status == 413, (path, chunked, answer.status, answer.body[:200])
            assert answer.json()["error"] == "PAYLOAD_TOO_LARGE"
    assert hostile.accounts.balance(hostile.account_id) == before


def test_huge_headers_and_query_strings_are_refused(hostile: Hostile) -> None:
    huge_header = [(b"x-padding", b"a" * (20 * 1024))]
    answer = hostile.call("GET", "/api/metrics/NVDA", headers=huge_header)
    assert answer.status == 431, answer.body[:200]
    long_query = _query({"ticker": "NVDA", "years": "1", "pad": "b" * (10 * 1024)})
    answer = hostile.call("GET", "/api/ticker-returns", long_query)
    assert answer.status == 414, answer.body[:200]


def test_thousands_of_symbols(hostile: Hostile) -> None:
    tickers = [f"S{n:04d}" for n in range(5000)]
    answer = hostile.call("GET", "/daily", _query({"symbols": ",".join(tickers)}))
    assert answer.status in (400, 414), answer.body[:200]
    answer = hostile.call("POST", "/api/batch/analyze", body=_batch(tickers))
    assert answer.status == 400 and answer.json()["error"] == "INVALID_PARAMETER"
    answer = hostile.call("POST", "/api/batch/analyze", body=_batch(["NVDA"] * 5000))
    assert answer.status == 400


def test_bad_utf8_in_query_string_and_body(hostile: Hostile) -> None:
    for query in (b"ticker=\xff\xfe&years=1", b"ticker=%FF%FE&years=1", b"ticker=NV\xc3DA"):
        answer = hostile.call("GET", "/api/ticker-returns", query)
        assert 400 <= answer.status < 500, (query, answer.status)
    answer = hostile.call("GET", "/daily", b"symbols=\xff&start_time=2026-06-01")
    assert 400 <= answer.status < 500
    for body in (b'{"tickers": ["\xff\xfe"]}', b"\xff\xfe\x00\x01", b'{"tickers": ["NV\\ud800"]}'):
        answer = hostile.call("POST", "/api/batch/analyze", body=body)
        assert answer.status == 400, (body, answer.status, answer.body[:200])


def test_deeply_nested_json_is_a_400(hostile: Hostile) -> None:
    for depth in (1000, 100_000):
        body = b'{"tickers": ' + b"[" * depth + b"]" * depth + b"}"
        answer = hostile.call("POST", "/api/batch/analyze", body=body)
        assert answer.status == 400, (depth, answer.status, answer.body[:200])


def test_control_characters_in_headers(hostile: Hostile) -> None:
    for value in (b"eqk_x\r\nX-Injected: 1", b"eqk\x00nul-key-nul-key", "ключ".encode()):
        answer = hostile.call(
            "GET",
            "/api/metrics/NVDA",
            headers=[(b"authorization", b"Bearer " + value)],
            keyed=False,
        )
        assert answer.status == 401 and answer.json()["error"] == "INVALID_API_KEY"
    answer = hostile.call("GET", "/api/health", headers=[(b"x-request-id", b"a\r\nb")])
    assert answer.status == 200 and "\n" not in answer.headers["x-request-id"]


def test_repeated_parameters_are_a_400_on_service_a(hostile: Hostile) -> None:
    answer = hostile.call("GET", "/daily", b"symbols=AAPL&symbols=MSFT&start_time=2026-06-01")
    assert answer.status == 400, answer.body[:300]
    assert "symbols" in answer.json()["detail"]


def test_unknown_parameters_are_a_400_on_service_a(hostile: Hostile) -> None:
    answer = hostile.call("GET", "/daily", b"symbols=AAPL&start_time=2026-06-01&end_tme=2026-07-01")
    assert answer.status == 400, answer.body[:300]
    assert "end_tme" in answer.json()["detail"]


def test_repeated_parameters_are_a_400_on_service_b(hostile: Hostile) -> None:
    answer = hostile.call("GET", "/api/ticker-returns", b"ticker=NVDA&ticker=AAPL&years=1")
    assert answer.status == 400, answer.body[:300]
    assert "ticker" in answer.json()["detail"]

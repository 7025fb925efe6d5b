"""A local HTTP server that answers as Yahoo's chart API and Tiingo's daily-prices API do, in
their documented formats, from a market written here (`Market`): no request leaves this
machine. It also plays their errors: an unknown symbol (404 in each one's shape), a rate limit
once for one symbol (429: Yahoo's plain text without Retry-After, Tiingo's JSON detail with
Retry-After), a symbol that is always rate limited, and Tiingo's refusal of a wrong token.
And the hostile answers of `HOSTILE` (issue 33): malformed bodies, impossible values, a body
dripped a byte a second, a 300 MB body made as it is sent, redirects elsewhere and in a loop."""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pandas as pd

TIINGO_KEY = "tiingo-test-token-5f1e"
LIMITED_ONCE = "MSFT"  # answered 429 on its first request, then served
ALWAYS_LIMITED = "BUSY"  # answered 429 every time


@dataclass
class Market:
    """Per symbol, the truth: raw closes, volumes, split ratios and cash dividends by day."""

    days: list[date]
    close: dict[str, list[float]]
    volume: dict[str, list[float]]
    split: dict[str, dict[date, float]] = field(default_factory=dict)
    dividend: dict[str, dict[date, float]] = field(default_factory=dict)

    def rows(self, symbol: str) -> list[dict[str, Any]]:
        """The symbol's days with raw values, factors and the adjusted close as of the last
        day (each earlier close times the later days' price-only factors)."""
        out = []
        for i, day in enumerate(self.days):
            out.append(
                {
                    "day": day,
                    "close": self.close[symbol][i],
                    "volume": self.volume[symbol][i],
                    "split": self.split.get(symbol, {}).get(day, 1.0),
                    "dividend": self.dividend.get(symbol, {}).get(day, 0.0),
                }
            )
        adjusted = out[-1]["close"]
        for i in range(len(out) - 1, -1, -1):
            out[i]["adjusted"] = adjusted
            if i:
                now, before = out[i], out[i - 1]
                adjusted *= before["close"] / ((now["close"] + now["dividend"]) * now["split"])
        return out


def _stamp(day: date) -> int:
    """Yahoo's timestamp of a session: its opening time, 09:30 New York, in UTC seconds."""
    moment = pd.Timestamp(f"{day} 09:30").tz_localize("America/New_York")
    return int(moment.tz_convert("UTC").timestamp())


def yahoo_chart(market: Market, symbol: str, period1: int, period2: int) -> dict[str, Any]:
    rows = [r for r in market.rows(symbol) if period1 <= _stamp(r["day"]) <= period2]
    later = []
    factor = 1.0
    for r in reversed(rows):
        later.append(factor)
        factor *= r["split"]
    later.reverse()
    splits = {
        str(_stamp(r["day"])): {
            "date": _stamp(r["day"]),
            "numerator": r["split"],
            "denominator": 1.0,
            "splitRatio": f"{r['split']:g}:1",
        }
        for r in rows
        if r["split"] != 1.0
    }
    dividends = {
        str(_stamp(r["day"])): {"amount": r["dividend"] / k, "date": _stamp(r["day"])}
        for r, k in zip(rows, later, strict=True)
        if r["dividend"]
    }
    price = [r["close"] / k for r, k in zip(rows, later, strict=True)]
    return {
        "chart": {
            "result": [
                {
                    "meta": {
                        "currency": "USD",
                        "symbol": symbol,
                        "exchangeName": "NMS",
                        "instrumentType": "EQUITY",
                        "gmtoffset": -18000,
                        "timezone": "EST",
                        "exchangeTimezoneName": "America/New_York",
                        "dataGranularity": "1d",
                    },
                    "timestamp": [_stamp(r["day"]) for r in rows],
                    "events": {"dividends": dividends, "splits": splits},
                    "indicators": {
                        "quote": [
                            {
                                "open": [p * 0.99 for p in price],
                                "high": [p * 1.01 for p in price],
                                "low": [p * 0.98 for p in price],
                                "close": price,
                                "volume": [
                                    int(r["volume"] * k) for r, k in zip(rows, later, strict=True)
                                ],
                            }
                        ],
                        "adjclose": [{"adjclose": [r["adjusted"] for r in rows]}],
                    },
                }
            ],
            "error": None,
        }
    }


def tiingo_prices(market: Market, symbol: str, start: str, end: str) -> list[dict[str, Any]]:
    rows = [r for r in market.rows(symbol) if start <= r["day"].isoformat() <= end]
    return [
        {
            "date": f"{r['day']}T00:00:00.000Z",
            "close": r["close"],
            "high": r["close"] * 1.01,
            "low": r["close"] * 0.98,
            "open": r["close"] * 0.99,
            "volume": int(r["volume"]),
            "adjClose": r["adjusted"],
            "adjHigh": r["adjusted"] * 1.01,
            "adjLow": r["adjusted"] * 0.98,
            "adjOpen": r["adjusted"] * 0.99,
            "adjVolume": int(r["volume"]),
            "divCash": r["dividend"],
            "splitFactor": r["split"],
        }
        for r in rows
    ]


def _first_day(market: Market) -> dict[str, Any]:
    """A whole, well-formed chart of the market's first symbol over every day (mutated below)."""
    symbol = next(iter(market.close))
    return yahoo_chart(market, symbol, 0, 2**31)


def _mutated(market: Market, change: Any) -> bytes:
    chart = copy.deepcopy(_first_day(market))
    change(chart["chart"]["result"][0])
    return json.dumps(chart).encode()


def _quote(result: dict[str, Any]) -> dict[str, Any]:
    quote: dict[str, Any] = result["indicators"]["quote"][0]
    return quote


def _set(target: dict[str, Any], key: str, value: Any) -> None:
    target[key] = value


# Yahoo symbols answered with a malformed body or an impossible value (200, JSON unless said).
HOSTILE: dict[str, Any] = {
    "XHUGETS": lambda m: _mutated(m, lambda r: r["timestamp"].__setitem__(0, 10**20)),
    "XSTRTS": lambda m: _mutated(
        m, lambda r: _set(r, "timestamp", [str(t) for t in r["timestamp"]])
    ),
    "XTRUNC": lambda m: _mutated(m, lambda r: None)[:300],
    "XHTML": lambda m: b"<html><body><h1>Service unavailable</h1></body></html>",
    "XSHAPE": lambda m: _mutated(m, lambda r: _set(r["indicators"], "quote", "closed")),
    "XSPLIT00": lambda m: _mutated(
        m,
        lambda r: _set(
            r["events"],
            "splits",
            {"1": {"date": r["timestamp"][1], "numerator": 0, "denominator": 0}},
        ),
    ),
    "XLENGTH": lambda m: _mutated(m, lambda r: _set(_quote(r), "close", _quote(r)["close"][:-1])),
    "XINF": lambda m: _mutated(m, lambda r: _quote(r)["close"].__setitem__(1, float("inf"))),
    "XE308": lambda m: _mutated(m, lambda r: _quote(r)["close"].__setitem__(1, 1e308)),
    "XNEG": lambda m: _mutated(m, lambda r: _quote(r)["close"].__setitem__(1, -5.0)),
    "XOUTSIDE": lambda m: _mutated(m, lambda r: r["timestamp"].__setitem__(0, 978_345_000)),
}
DRIP, HUGE, HUGE_STREAMED, AWAY, LOOP = "XDRIP", "XHUGE", "XHUGESTREAM", "XAWAY", "XLOOP"
TIINGO_STRING = "XSTRING"  # Tiingo: a close that is a string
HUGE_BYTES = 300_000_000


class FixtureServer:
    """The server, with the requests it received (path, query, headers) for assertions."""

    def __init__(self, market: Market) -> None:
        self.market = market
        self.requests: list[dict[str, Any]] = []
        self.limited: set[str] = set()
        self.sent: dict[str, int] = {}  # bytes of the streamed answers sent, by symbol
        handler = self._handler()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def _answer(
        self, path: str, query: dict[str, str], headers: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        parts = path.strip("/").split("/")
        as_json = {"Content-Type": "application/json"}
        if parts[:3] == ["v8", "finance", "chart"] and len(parts) == 4:
            symbol = parts[3]
            if symbol in HOSTILE:
                kind = "text/html" if symbol == "XHTML" else "application/json"
                return 200, {"Content-Type": kind}, HOSTILE[symbol](self.market)
            if symbol == AWAY:
                return 302, {"Location": "http://elsewhere.invalid/v8/finance/chart/AAPL"}, b""
            if symbol == LOOP:
                return 302, {"Location": path}, b""
            if self._limited(symbol):
                return 429, {"Content-Type": "text/plain"}, b"Too Many Requests\r\n"
            if symbol not in self.market.close:
                error = {
                    "code": "Not Found",
                    "description": "No data found, symbol may be delisted",
                }
                body = {"chart": {"result": None, "error": error}}
                return 404, as_json, json.dumps(body).encode()
            chart = yahoo_chart(self.market, symbol, int(query["period1"]), int(query["period2"]))
            return 200, as_json, json.dumps(chart).encode()
        if parts[:2] == ["tiingo", "daily"] and len(parts) == 4 and parts[3] == "prices":
            if headers.get("authorization") != f"Token {TIINGO_KEY}":
                return 401, as_json, json.dumps({"detail": "Invalid token."}).encode()
            symbol = parts[2]
            if symbol == TIINGO_STRING:
                symbol = next(iter(self.market.close))
                days = tiingo_prices(self.market, symbol, query["startDate"], query["endDate"])
                days[0]["close"] = f"{days[0]['close']}"
                return 200, as_json, json.dumps(days).encode()
            if self._limited(symbol):
                detail = {"detail": "Error: You have run over your hourly request allocation."}
                return 429, {**as_json, "Retry-After": "0"}, json.dumps(detail).encode()
            if symbol not in self.market.close:
                detail = {"detail": f"Error: Ticker '{symbol.lower()}' not found"}
                return 404, as_json, json.dumps(detail).encode()
            days = tiingo_prices(self.market, symbol, query["startDate"], query["endDate"])
            return 200, as_json, json.dumps(days).encode()
        return 404, as_json, json.dumps({"detail": "Not found."}).encode()

    def _limited(self, symbol: str) -> bool:
        if symbol == ALWAYS_LIMITED:
            return True
        if symbol == LIMITED_ONCE and symbol not in self.limited:
            self.limited.add(symbol)
            return True
        return False

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlparse(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                headers = {k.lower(): v for k, v in self.headers.items()}
                server.requests.append({"path": url.path, "query": url.query, "headers": headers})
                symbol = url.path.rstrip("/").split("/")[-1]
                if symbol in (DRIP, HUGE, HUGE_STREAMED):
                    self._stream(symbol)
                    return
                status, extra, body = server._answer(url.path, query, headers)
                self.send_response(status)
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _stream(self, symbol: str) -> None:
                """A body made as it is sent: a byte a second (DRIP), or 300 MB with its
                length (HUGE) or without one, ended by closing (HUGE_STREAMED)."""
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                if symbol != HUGE_STREAMED:
                    self.send_header("Content-Length", str(1000 if symbol == DRIP else HUGE_BYTES))
                self.end_headers()
                server.sent[symbol] = 0
                piece, pause = (b"{", 1.0) if symbol == DRIP else (b" " * 65536, 0.0)
                try:
                    while server.sent[symbol] < (1000 if symbol == DRIP else HUGE_BYTES):
                        self.wfile.write(piece)
                        self.wfile.flush()
                        server.sent[symbol] += len(piece)
                        if pause:
                            time.sleep(pause)
                except OSError:  # the client hung up: what it should do
                    return

            def log_message(self, *args: Any) -> None:
                pass

        return Handler

    @contextmanager
    def running(self) -> Iterator[FixtureServer]:
        thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.httpd.shutdown()
            self.httpd.server_close()
            thread.join()

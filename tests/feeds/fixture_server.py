"""A local HTTP server that answers as Yahoo's chart API and Tiingo's daily-prices API do, in
their documented formats, from a market written here (`Market`): no request leaves this
machine. It also plays their errors: an unknown symbol (404 in each one's shape), a rate limit
once for one symbol (429: Yahoo's plain text without Retry-After, Tiingo's JSON detail with
Retry-After), a symbol that is always rate limited, and Tiingo's refusal of a wrong token."""

from __future__ import annotations

import json
import threading
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


class FixtureServer:
    """The server, with the requests it received (path, query, headers) for assertions."""

    def __init__(self, market: Market) -> None:
        self.market = market
        self.requests: list[dict[str, Any]] = []
        self.limited: set[str] = set()
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
                status, extra, body = server._answer(url.path, query, headers)
                self.send_response(status)
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

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

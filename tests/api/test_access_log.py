"""The access log of `eqrisk serve`: one stderr line per request with its values, never a key."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from eqrisk.accounts.book import Accounts
from eqrisk.api.app import logged_target
from helpers import Server, bearer, new_key

LINE = re.compile(
    r"^(?P<method>[A-Z]+) (?P<target>\S+) (?P<status>\d{3}) (?P<ms>\d+\.\d)ms (?P<bytes>\d+)B "
    r"request_id=(?P<request_id>\S+) account=(?P<account>\S+) pid=(?P<pid>\d+)$"
)


def _lines(log: str, request_id: str) -> list[dict[str, str]]:
    found = [LINE.match(line) for line in log.splitlines() if f"request_id={request_id} " in line]
    assert all(found), log
    return [m.groupdict() for m in found if m]


def test_one_line_per_request_with_its_values_and_no_key(home: Path, accounts: Accounts) -> None:
    account_id, key = new_key(accounts)
    every_header = {**bearer(key), "X-API-Key": key, "apikey": key, "Cookie": f"session={key}"}
    with Server(home) as server, httpx.Client(base_url=server.base, timeout=30) as client:
        ok = client.get("/api/metrics/NVDA", headers={**every_header, "X-Request-ID": "trace-ok"})
        bad = client.get(
            f"/api/tickers?mag7=true&apikey={key}&token={key}&credential={key}",
            headers={**bearer(key), "X-Request-ID": "trace-bad"},
        )
        daily = client.get(
            "/daily?symbols=NVDA&start_time=2026-01-02",
            headers={"apikey": key, "X-Request-ID": "trace-daily"},
        )
        health = client.get("/api/health", headers={"X-Request-ID": "trace-open"})
        unknown = client.get("/nowhere%0Aforged line", headers={"X-Request-ID": "trace-404"})
        ids = ("trace-ok", "trace-bad", "trace-daily", "trace-open", "trace-404")
        log = server.log_with(*(f"request_id={i} " for i in ids))
    assert ok.status_code == 200 and health.status_code == 200 and unknown.status_code == 404
    assert key not in log  # not from a header, not from the query string
    [line] = _lines(log, "trace-ok")
    assert line["method"] == "GET" and line["target"] == "/api/metrics/NVDA"
    # The bytes sent: the compressed body's where the answer went compressed.
    assert line["status"] == "200" and int(line["bytes"]) == int(ok.headers["content-length"])
    assert line["account"] == account_id and float(line["ms"]) > 0
    [line] = _lines(log, "trace-bad")
    assert line["target"] == "/api/tickers?mag7=true&apikey=***&token=***&credential=***"
    assert line["status"] == str(bad.status_code) and int(line["bytes"]) == len(bad.content)
    [line] = _lines(log, "trace-daily")
    assert line["target"] == "/daily?symbols=NVDA&start_time=2026-01-02"
    assert line["status"] == str(daily.status_code) and line["account"] == account_id
    [line] = _lines(log, "trace-open")
    # /api/health carries the accuracy record (a few kB): it goes compressed too
    assert line["account"] == "-" and int(line["bytes"]) == int(health.headers["content-length"])
    [line] = _lines(log, "trace-404")
    assert line["target"] == "/nowhere%0Aforged%20line" and line["status"] == "404"
    assert "\nforged" not in log
    # uvicorn's own access log stays off: only our lines name the requests.
    assert log.count("/api/metrics/NVDA") == 1


def test_the_access_log_can_be_turned_off(home: Path) -> None:
    with Server(home, args=("--no-access-log",)) as server:
        httpx.get(f"{server.base}/api/health", headers={"X-Request-ID": "trace-off"}, timeout=30)
        log = server.log()
    assert "access log off" in log
    assert "trace-off" not in log and "/api/health" not in log


def test_logged_target_masks_secret_parameters() -> None:
    def target(path: bytes, query: bytes) -> str:
        return logged_target({"path": path.decode(), "raw_path": path, "query_string": query})

    assert target(b"/api/x", b"") == "/api/x"
    assert target(b"/api/x", b"a=1&api_key=s3&b=2") == "/api/x?a=1&api_key=***&b=2"
    assert (
        target(b"/a", b"Authorization=x&sig=1&password=p")
        == "/a?Authorization=***&sig=1&password=***"
    )
    assert target(b"/a", b"flag&apikey") == "/a?flag&apikey"  # no value, nothing to hide
    assert target(b"/a b\x1b", b"q=\xff") == "/a%20b%1B?q=%FF"


def test_logged_target_masks_key_shaped_values_under_any_name() -> None:
    def target(path: bytes, query: bytes) -> str:
        return logged_target({"path": path.decode(), "raw_path": path, "query_string": query})

    key = b"eqk_0123456789ab_" + b"Zq3-vX9_kLm2Np4Rs7Tu0Wx1Yz5AbCdEfGhIjKlMnOp"
    assert target(b"/api/x", b"credential=" + key + b"&a=1") == "/api/x?credential=***&a=1"
    encoded = key.replace(b"_", b"%5F")  # percent-encoded, still a key
    assert target(b"/api/x", b"q=" + encoded) == "/api/x?q=***"
    assert target(b"/api/x", b"q=Bearer+" + key) == "/api/x?q=***"
    assert target(b"/api/x", key) == "/api/x?***"  # a bare key as the whole query
    assert target(b"/api/metrics/" + key, b"") == "/api/metrics/***"
    imported = b"test-key-1-not-secret"  # an imported key: 16+ token characters, digits, letters
    assert target(b"/a", b"x=" + imported) == "/a?x=***"
    # What callers send on purpose is not key-shaped and stays readable.
    plain = (
        b"symbols=AAPL,MSFT,NVDA&start_time=2024-01-02&end_time=2024-12-31&fact=Information_"
        b"Technology&search=bank&top_by=mktcap_rank&years=13&format=parquet"
    )
    assert target(b"/daily", plain) == "/daily?" + plain.decode()

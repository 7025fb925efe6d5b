"""Service A (daily stock data) over HTTP, in-process: values against the snapshot's arrays in
JSON and CSV, the flat model identity put together from the answers, rankings, every error."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

from eqrisk.api.app import create_app
from eqrisk.api.endpoints.symbol_list import MAX_TOP_N
from eqrisk.api.fields import DAILY_FIELDS, TOP_BY
from eqrisk.api.params import MAX_SYMBOLS
from eqrisk.snapshot.versions import Snapshot, SnapshotStore
from helpers import SHARED_DATA, TEST_KEY, assert_problem, register_key

KEY = {"apikey": TEST_KEY}
FORMATS = ("json", "csv")
SECTOR_CODES = ["10", "15", "20", "25", "30", "35", "40", "45", "50", "55", "60"]
STRING_COLUMNS = {"symbol", "teo", "fact", "sector_code", "sector"}
# Demo symbols with a property worth testing: DST has sessions without a price, NOV and TAIS
# are delisted before the end, SPY is the market ETF (no sector exposure), NVDA has a raw close
# that differs from the adjusted one.
GAPPY, DELISTED, ETF, SPLIT = "DST", "TAIS", "SPY", "NVDA"


@pytest.fixture(scope="module")
def client(demo_settings) -> TestClient:
    return TestClient(create_app(demo_settings, services=("daily",)))


@pytest.fixture(scope="module")
def snap(demo_home: Path) -> Snapshot:
    return SnapshotStore(demo_home).current()


def day_strings(snap: Snapshot) -> np.ndarray:
    return np.datetime_as_string(snap.sessions.astype("datetime64[D]"), unit="D")


def row(snap: Snapshot, symbol: str) -> int:
    return int(snap.symbols.loc[symbol, "row"])


def csv_records(text: str) -> list[dict[str, Any]]:
    """CSV body -> records typed like the JSON ones (numbers as float, empty cell as None)."""
    out = []
    for rec in csv.DictReader(io.StringIO(text)):
        typed: dict[str, Any] = {}
        for name, cell in rec.items():
            if cell == "":
                typed[name] = None
            elif name in STRING_COLUMNS:
                typed[name] = cell
            else:
                typed[name] = float(cell)
        out.append(typed)
    return out


def fetch(client: TestClient, path: str, fmt: str, **params: Any) -> list[dict[str, Any]]:
    """The records of a 200 answer in `fmt`, checking content type and version header."""
    resp = client.get(path, params={**params, "format": fmt}, headers=KEY)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-model-version"]
    if fmt == "csv":
        assert resp.headers["content-type"] == "text/csv; charset=utf-8"
        return csv_records(resp.text)
    assert resp.headers["content-type"] == "application/json"
    body = resp.json()
    assert isinstance(body, list)
    return body


def same(got: Any, expected: float) -> bool:
    """A record value equals an array value exactly (null = NaN)."""
    if got is None:
        return not math.isfinite(expected)
    return got == expected


# --------------------------------------------------------------------------------------------
# /daily


@pytest.mark.parametrize("fmt", FORMATS)
def test_daily_returns_every_field_from_the_snapshot_arrays(client, snap, fmt):
    symbols = ["aapl", GAPPY, DELISTED.lower(), ETF, SPLIT]
    recs = fetch(
        client,
        "/daily",
        fmt,
        symbols=",".join(symbols),
        start_time="2018-01-01",
        end_time="2026-12-31",
    )
    assert all(list(r) == ["symbol", "teo", *DAILY_FIELDS] for r in recs)
    days = day_strings(snap)
    lo = int(np.searchsorted(days, "2018-01-01"))
    price = snap.array("price_close")
    table = snap.symbols
    position = 0
    for symbol in [s.upper() for s in symbols]:
        i = row(snap, symbol)
        idx = lo + np.flatnonzero(np.isfinite(price[i, lo:]))
        mine = recs[position : position + len(idx)]
        position += len(idx)
        assert [r["symbol"] for r in mine] == [symbol] * len(idx)
        assert [r["teo"] for r in mine] == days[idx].tolist()
        for name, source in DAILY_FIELDS.items():
            if source is None:
                column = "sector_code" if name == "sector_code" else "gics_sector"
                expected = table.loc[symbol, column]
                expected = expected if isinstance(expected, str) else None
                assert all(r[name] == expected for r in mine), (symbol, name)
                continue
            values = snap.array(source)[i, idx]
            bad = [
                (r["teo"], r[name], v)
                for r, v in zip(mine, values, strict=True)
                if not same(r[name], v)
            ]
            assert not bad, (symbol, name, bad[:3])
    assert position == len(recs)


def test_daily_leaves_out_sessions_without_a_price(client, snap):
    recs = fetch(
        client,
        "/daily",
        "json",
        symbols=GAPPY,
        start_time="2018-04-18",
        end_time="2018-04-25",
        fields="close,return",
    )
    teos = [r["teo"] for r in recs]
    assert "2018-04-20" not in teos  # DST has no price that session
    assert teos == ["2018-04-18", "2018-04-19", "2018-04-23", "2018-04-24", "2018-04-25"]
    # The first price after the gap has no return (returns use consecutive sessions only).
    assert recs[2]["return"] is None and recs[2]["close"] is not None


def test_daily_fields_are_returned_in_the_order_asked(client, snap):
    resp = client.get(
        "/daily",
        params={
            "symbols": f"{SPLIT}, aapl ,AAPL",
            "start_time": "2024-06-03",
            "end_time": "2024-06-14",
            "fields": " Volume,close,close_raw,sector_code,teo",
        },
        headers=KEY,
    )
    assert resp.status_code == 200, resp.text
    recs = resp.json()
    assert {tuple(r) for r in recs} == {
        ("symbol", "teo", "volume", "close", "close_raw", "sector_code")
    }
    assert [r["symbol"] for r in recs] == [SPLIT] * 10 + ["AAPL"] * 10  # order kept, deduplicated
    i = row(snap, SPLIT)
    t = int(np.searchsorted(day_strings(snap), "2024-06-03"))
    assert recs[0]["close"] == snap.array("price_close")[i, t]
    assert recs[0]["close_raw"] == snap.array("close_raw")[i, t]
    assert recs[0]["close"] != recs[0]["close_raw"]  # adjusted vs as traded
    assert recs[0]["sector_code"] == "45"


def test_daily_csv_has_a_header_row_and_the_same_values_as_json(client):
    params = {
        "symbols": "AAPL,MSFT",
        "start_time": "2025-01-02",
        "end_time": "2025-03-31",
        "fields": "close,volume,mktcap_rank,sector",
    }
    as_json = client.get("/daily", params=params, headers=KEY).json()
    resp = client.get("/daily", params={**params, "format": "csv"}, headers=KEY)
    assert (
        resp.text.splitlines()[0].replace('"', "") == "symbol,teo,close,volume,mktcap_rank,sector"
    )
    assert resp.headers["content-disposition"] == 'attachment; filename="daily.csv"'
    assert csv_records(resp.text) == as_json
    # The Accept header chooses CSV when `format` is absent.
    by_accept = client.get("/daily", params=params, headers={**KEY, "Accept": "text/csv"})
    assert by_accept.headers["content-type"].startswith("text/csv")
    assert by_accept.text == resp.text


def test_daily_end_time_defaults_to_the_latest_session(client, snap):
    recs = fetch(client, "/daily", "json", symbols="AAPL", start_time="2026-10-01", fields="close")
    assert recs[-1]["teo"] == snap.manifest["data_as_of"] == day_strings(snap)[-1]
    assert recs[0]["teo"] == "2026-10-01"


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_range_without_sessions_answers_no_rows(client, fmt):
    resp = client.get(
        "/daily",
        params={
            "symbols": "AAPL",
            "start_time": "2001-01-01",
            "end_time": "2001-12-31",
            "format": fmt,
        },
        headers=KEY,
    )
    assert resp.status_code == 200
    if fmt == "json":
        assert resp.json() == []
    else:
        assert resp.text.replace('"', "").strip() == "symbol,teo," + ",".join(DAILY_FIELDS)


# --------------------------------------------------------------------------------------------
# /betas, /facts, /gross, /resids


@pytest.mark.parametrize("fmt", FORMATS)
def test_betas_to_the_market_for_every_symbol(client, snap, fmt):
    recs = fetch(
        client,
        "/betas",
        fmt,
        symbols=f"AAPL,{ETF},BAA",
        fact="mkt",
        start_time="2024-01-01",
        end_time="2024-12-31",
    )
    assert all(list(r) == ["teo", "symbol", "factor_beta", "fact"] for r in recs)
    assert {r["fact"] for r in recs} == {"Mkt"}
    check_series(
        snap,
        recs,
        "beta_mkt",
        "factor_beta",
        ["AAPL", ETF, "BAA"],
        "2024-01-01",
        "2024-12-31",
        midnight=False,
    )


@pytest.mark.parametrize(
    "name",
    [
        "Information_Technology",
        "information technology",
        "INFORMATION  TECHNOLOGY",
        " information_technology ",
    ],
)
@pytest.mark.parametrize("fmt", FORMATS)
def test_betas_to_a_sector_only_for_its_stocks(client, snap, name, fmt):
    recs = fetch(
        client,
        "/betas",
        fmt,
        symbols=f"AAPL,BAA,{ETF},MSFT",
        fact=name,
        start_time="2024-01-01",
        end_time="2024-06-30",
    )
    assert {r["fact"] for r in recs} == {"Information_Technology"}
    # BAA (Financials) and SPY (no sector) are not exposed: no rows for them.
    check_series(
        snap,
        recs,
        "beta_sec",
        "factor_beta",
        ["AAPL", "MSFT"],
        "2024-01-01",
        "2024-06-30",
        midnight=False,
    )


def test_betas_of_a_symbol_without_the_exposure_are_no_rows(client):
    recs = fetch(client, "/betas", "json", symbols="BAA", fact="Energy", start_time="2020-01-01")
    assert recs == []


@pytest.mark.parametrize("fmt", FORMATS)
def test_facts_answer_every_factor_by_name(client, snap, fmt):
    days = day_strings(snap)
    lo, hi = np.searchsorted(days, "2023-03-01"), np.searchsorted(days, "2023-05-31", "right")
    for k, name in enumerate(snap.factor_names):
        asked = name.replace("_", " ").lower() if k % 2 else name
        recs = fetch(
            client, "/facts", fmt, fact=asked, start_time="2023-03-01", end_time="2023-05-31"
        )
        assert all(list(r) == ["teo", "fact", "factor_return"] for r in recs)
        values = snap.factor_returns[k, lo:hi]
        idx = np.flatnonzero(np.isfinite(values))
        assert len(idx) == hi - lo  # every session has every factor in this range
        assert [r["teo"] for r in recs] == [f"{d}T00:00:00" for d in days[lo + idx]]
        assert [r["fact"] for r in recs] == [name] * len(idx)
        assert [r["factor_return"] for r in recs] == values[idx].tolist()


@pytest.mark.parametrize("fmt", FORMATS)
def test_gross_returns_are_the_simple_returns(client, snap, fmt):
    symbols = ["AAPL", GAPPY, DELISTED, ETF]
    recs = fetch(
        client,
        "/gross",
        fmt,
        symbols=",".join(symbols),
        start_time="2024-01-01",
        end_time="2024-12-31",
    )
    assert all(list(r) == ["teo", "symbol", "gross_return"] for r in recs)
    check_series(
        snap, recs, "return", "gross_return", symbols, "2024-01-01", "2024-12-31", midnight=True
    )
    assert recs[0]["teo"] == "2024-01-02T00:00:00"


@pytest.mark.parametrize("fmt", FORMATS)
def test_resids_are_the_model_residuals(client, snap, fmt):
    symbols = ["AAPL", GAPPY, DELISTED, ETF]
    recs = fetch(
        client,
        "/resids",
        fmt,
        symbols=",".join(symbols),
        start_time="2024-01-01",
        end_time="2024-12-31",
    )
    assert all(list(r) == ["teo", "symbol", "residual_return"] for r in recs)
    check_series(
        snap,
        recs,
        "resid_return",
        "residual_return",
        symbols,
        "2024-01-01",
        "2024-12-31",
        midnight=False,
    )
    assert recs[0]["teo"] == "2024-01-02"


def check_series(snap, recs, field, value_name, symbols, start, end, *, midnight: bool) -> None:
    """Records are exactly the finite values of `field` for `symbols` in [start, end]."""
    days = day_strings(snap)
    lo, hi = np.searchsorted(days, start), np.searchsorted(days, end, "right")
    expected = []
    for symbol in symbols:
        values = snap.array(field)[row(snap, symbol), lo:hi]
        for t in np.flatnonzero(np.isfinite(values)):
            teo = days[lo + t] + ("T00:00:00" if midnight else "")
            expected.append((teo, symbol, float(values[t])))
    assert len(expected) > 0
    assert [(r["teo"], r["symbol"], r[value_name]) for r in recs] == expected


def test_flat_model_identity_holds_on_every_row_put_together_over_http(client, snap):
    """gross(t) = b_Mkt(t-1) f_Mkt(t) + b_sec(t-1) f_sec(t) + residual(t), from four routes."""
    symbols = ["AAPL", "BAA", "GAOI", "AMZN", GAPPY, DELISTED, "CRVR", ETF]
    table = snap.symbols
    start, end, betas_from = "2024-01-01", "2024-12-31", "2023-12-01"
    joined = ",".join(symbols)

    def series(path, key, **params):
        return {
            (r["teo"][:10], r.get("symbol")): r[key] for r in fetch(client, path, "json", **params)
        }

    gross = series("/gross", "gross_return", symbols=joined, start_time=start, end_time=end)
    resid = series("/resids", "residual_return", symbols=joined, start_time=start, end_time=end)
    b_mkt = series(
        "/betas", "factor_beta", symbols=joined, fact="Mkt", start_time=betas_from, end_time=end
    )
    f = {"Mkt": series("/facts", "factor_return", fact="Mkt", start_time=start, end_time=end)}
    b_sec: dict[tuple[str, str], float] = {}
    sector_of: dict[str, str | None] = {}
    for symbol in symbols:
        factor = table.loc[symbol, "sector_factor"]
        sector_of[symbol] = factor if isinstance(factor, str) else None
        if sector_of[symbol] is None:
            continue
        b_sec |= series(
            "/betas",
            "factor_beta",
            symbols=symbol,
            fact=factor,
            start_time=betas_from,
            end_time=end,
        )
        f.setdefault(
            factor, series("/facts", "factor_return", fact=factor, start_time=start, end_time=end)
        )
    assert sector_of[ETF] is None and sector_of["AAPL"] == "Information_Technology"

    days = day_strings(snap).tolist()
    checked = 0
    for (teo, symbol), g in gross.items():
        prev = days[days.index(teo) - 1]
        bm = b_mkt.get((prev, symbol))
        fm = f["Mkt"].get((teo, None))
        sec = sector_of[symbol]
        bs = b_sec.get((prev, symbol)) if sec else 0.0
        fs = f[sec].get((teo, None)) if sec else 0.0
        if None in (bm, fm, bs, fs):
            assert (teo, symbol) not in resid  # no residual without the betas of t-1
            continue
        assert (teo, symbol) in resid, (teo, symbol)
        assert abs(g - bm * fm - bs * fs - resid[(teo, symbol)]) <= 1e-12, (teo, symbol)
        checked += 1
    assert set(resid) <= set(gross)
    assert checked == len(resid) > 5 * 240  # every residual row, over a year, several symbols


# --------------------------------------------------------------------------------------------
# /symbol_list


def ranking(snap: Snapshot, top_by: str, ascending: bool, sector_code: str | None) -> list[str]:
    """Direct computation: stocks with a value on the last session, by value then symbol."""
    table = snap.symbols
    values = snap.array(TOP_BY[top_by])[:, -1]
    pairs = []
    for symbol, rec in table.iterrows():
        value = values[int(rec["row"])]
        if rec["asset_type"] != "stock" or not math.isfinite(value):
            continue
        if sector_code is not None and rec["sector_code"] != sector_code:
            continue
        pairs.append((value if ascending else -value, symbol))
    return [symbol for _, symbol in sorted(pairs)]


@pytest.mark.parametrize("top_by", list(TOP_BY))
@pytest.mark.parametrize("ascending", [False, True])
@pytest.mark.parametrize("sector_code", [None, "45", "40"])
def test_symbol_list_orders_stocks_by_the_latest_value(
    client, snap, top_by, ascending, sector_code
):
    params: dict[str, Any] = {"top_by": top_by, "ascending": str(ascending).lower(), "top_n": 25}
    if sector_code:
        params["sector_code"] = sector_code
    resp = client.get("/symbol_list", params=params, headers=KEY)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-model-version"] == snap.version
    expected = ranking(snap, top_by, ascending, sector_code)
    assert resp.json() == {"symbols": expected[:25]}


def test_symbol_list_defaults_are_top_10_by_mktcap_descending(client, snap):
    body = client.get("/symbol_list", headers=KEY).json()
    assert body == {"symbols": ranking(snap, "mktcap", False, None)[:10]}
    caps = snap.array("market_cap")[:, -1]
    listed = [caps[row(snap, s)] for s in body["symbols"]]
    assert listed == sorted(listed, reverse=True)


def test_symbol_list_leaves_out_etfs_and_delisted_stocks(client, snap):
    body = client.get(
        "/symbol_list", params={"top_n": MAX_TOP_N, "top_by": "close"}, headers=KEY
    ).json()
    table = snap.symbols
    listed = set(body["symbols"])
    assert not listed & set(table.index[table["asset_type"] != "stock"])
    assert DELISTED not in listed and "NOV" not in listed
    assert listed == set(ranking(snap, "close", False, None))


def test_symbol_list_mktcap_rank_descending_lists_the_largest_rank_numbers_first(client, snap):
    body = client.get(
        "/symbol_list", params={"top_by": "mktcap_rank", "top_n": 3}, headers=KEY
    ).json()
    ranks = snap.array("mktcap_rank")[:, -1]
    got = [ranks[row(snap, s)] for s in body["symbols"]]
    assert got == sorted(got, reverse=True) and got[0] == np.nanmax(ranks)
    first = client.get(
        "/symbol_list",
        params={"top_by": "mktcap_rank", "ascending": "true", "top_n": 1},
        headers=KEY,
    ).json()
    assert first == client.get("/symbol_list", params={"top_n": 1}, headers=KEY).json()


# --------------------------------------------------------------------------------------------
# Headers, authentication, errors

ROUTES = {
    "/daily": {"symbols": "AAPL", "start_time": "2026-10-01"},
    "/betas": {"symbols": "AAPL", "fact": "Mkt", "start_time": "2026-10-01"},
    "/facts": {"fact": "Mkt", "start_time": "2026-10-01"},
    "/gross": {"symbols": "AAPL", "start_time": "2026-10-01"},
    "/resids": {"symbols": "AAPL", "start_time": "2026-10-01"},
    "/symbol_list": {},
    "/factor_list": {},
}


@pytest.mark.parametrize("path", list(ROUTES))
def test_every_answer_names_the_model_version(client, snap, path):
    resp = client.get(path, params=ROUTES[path], headers=KEY)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-model-version"] == snap.version
    assert resp.headers["x-data-as-of"] == snap.manifest["data_as_of"]
    assert resp.headers["x-request-id"]


@pytest.mark.parametrize("path", list(ROUTES))
@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ({}, "AUTHENTICATION_REQUIRED"),
        ({"apikey": ""}, "AUTHENTICATION_REQUIRED"),
        ({"apikey": "wrong-key"}, "INVALID_API_KEY"),
        ({"Authorization": f"Bearer {TEST_KEY}"}, "AUTHENTICATION_REQUIRED"),  # B's header
    ],
)
def test_a_missing_or_invalid_key_is_401(client, path, headers, code):
    resp = client.get(path, params=ROUTES[path], headers=headers)
    body = assert_problem(resp, 401, code)
    assert TEST_KEY not in resp.text
    if code == "AUTHENTICATION_REQUIRED":
        assert "apikey" in body["detail"]


def test_authentication_comes_before_parameter_checks(client):
    assert_problem(client.get("/daily"), 401, "AUTHENTICATION_REQUIRED")
    assert_problem(
        client.get("/daily?symbols=NOPE", headers={"apikey": "x"}), 401, "INVALID_API_KEY"
    )


@pytest.mark.parametrize("path", ["/daily", "/betas", "/gross", "/resids"])
def test_unknown_symbols_are_404_naming_each_of_them(client, path):
    params = {**ROUTES[path], "symbols": "aapl,NOPE,msft,zzz9,NOPE"}
    body = assert_problem(client.get(path, params=params, headers=KEY), 404, "TICKER_NOT_FOUND")
    assert body["unknown"] == ["NOPE", "ZZZ9"]
    assert "NOPE" in body["detail"] and "ZZZ9" in body["detail"] and "AAPL" not in body["detail"]
    one = assert_problem(
        client.get(path, params={**params, "symbols": "nope"}, headers=KEY), 404, "TICKER_NOT_FOUND"
    )
    assert one["unknown"] == ["NOPE"]


def test_too_many_symbols_is_400(client, snap):
    many = ",".join(list(snap.symbols.index[: MAX_SYMBOLS + 1]))
    assert len(snap.symbols) > MAX_SYMBOLS
    body = assert_problem(
        client.get("/daily", params={"symbols": many, "start_time": "2026-10-01"}, headers=KEY),
        400,
        "INVALID_PARAMETER",
    )
    assert body["max_symbols"] == MAX_SYMBOLS and str(MAX_SYMBOLS) in body["detail"]
    exactly = ",".join(list(snap.symbols.index[:MAX_SYMBOLS]))
    ok = client.get("/gross", params={"symbols": exactly, "start_time": "2026-10-30"}, headers=KEY)
    assert ok.status_code == 200


@pytest.mark.parametrize(
    ("path", "missing"), [(path, name) for path, params in ROUTES.items() for name in params]
)
def test_a_missing_required_parameter_is_400(client, path, missing):
    params = {k: v for k, v in ROUTES[path].items() if k != missing}
    body = assert_problem(client.get(path, params=params, headers=KEY), 400, "MISSING_PARAMETER")
    assert missing in body["detail"]
    empty = {**ROUTES[path], missing: " "}
    assert_problem(client.get(path, params=empty, headers=KEY), 400, "MISSING_PARAMETER")


def test_symbols_made_only_of_commas_is_a_missing_parameter(client):
    resp = client.get("/gross", params={"symbols": " , ,", "start_time": "2026-10-01"}, headers=KEY)
    assert_problem(resp, 400, "MISSING_PARAMETER")


@pytest.mark.parametrize("path", [p for p in ROUTES if p not in ("/symbol_list", "/factor_list")])
@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("start_time", "2024/01/02"),
        ("start_time", "20240102"),
        ("start_time", "2024-02-30"),
        ("start_time", "2024-1-2"),
        ("end_time", "yesterday"),
        ("end_time", "2024-13-01"),
    ],
)
def test_a_malformed_date_is_400(client, path, param, value):
    params = {**ROUTES[path], param: value}
    body = assert_problem(client.get(path, params=params, headers=KEY), 400, "INVALID_PARAMETER")
    assert body["parameter"] == param and "YYYY-MM-DD" in body["detail"]


@pytest.mark.parametrize("path", [p for p in ROUTES if p not in ("/symbol_list", "/factor_list")])
def test_start_after_end_is_400(client, path):
    params = {**ROUTES[path], "start_time": "2024-02-01", "end_time": "2024-01-31"}
    body = assert_problem(client.get(path, params=params, headers=KEY), 400, "INVALID_PARAMETER")
    assert "after" in body["detail"]
    later = {**ROUTES[path], "start_time": "2030-01-02"}  # after the default end (latest)
    body = assert_problem(client.get(path, params=later, headers=KEY), 400, "INVALID_PARAMETER")
    assert body["data_as_of"] in body["detail"]


def test_one_day_range_is_inclusive(client, snap):
    recs = fetch(
        client, "/gross", "json", symbols="AAPL", start_time="2024-03-28", end_time="2024-03-28"
    )
    assert [r["teo"] for r in recs] == ["2024-03-28T00:00:00"]


def test_an_unknown_field_is_400_listing_the_valid_ones(client):
    params = {"symbols": "AAPL", "start_time": "2026-10-01", "fields": "close,adj_close,Price"}
    body = assert_problem(
        client.get("/daily", params=params, headers=KEY), 400, "INVALID_PARAMETER"
    )
    assert body["unknown"] == ["adj_close", "price"]
    assert body["accepted"] == list(DAILY_FIELDS)
    assert all(name in body["detail"] for name in DAILY_FIELDS)


@pytest.mark.parametrize("path", ["/betas", "/facts"])
@pytest.mark.parametrize("fact", ["Technology", "market", "Mkt2", "Info_Tech"])
def test_an_unknown_factor_is_400_listing_the_factor_names(client, snap, path, fact):
    params = {**ROUTES[path], "fact": fact}
    body = assert_problem(client.get(path, params=params, headers=KEY), 400, "INVALID_PARAMETER")
    styles = snap.manifest["risk"]["styles"]["names"]  # the second layer's factors, last
    assert body["accepted"] == [*snap.factor_names, *styles]
    assert body["accepted"][0] == "Mkt" and "Real_Estate" in body["accepted"]
    assert all(name in body["detail"] for name in body["accepted"])


@pytest.mark.parametrize(
    ("params", "parameter", "accepted"),
    [
        ({"top_by": "marketcap"}, "top_by", list(TOP_BY)),
        ({"sector_code": "99"}, "sector_code", SECTOR_CODES),
        ({"sector_code": "Energy"}, "sector_code", SECTOR_CODES),
    ],
)
def test_symbol_list_rejects_unknown_choices_listing_the_accepted_ones(
    client, params, parameter, accepted
):
    body = assert_problem(
        client.get("/symbol_list", params=params, headers=KEY), 400, "INVALID_PARAMETER"
    )
    assert body["parameter"] == parameter and body["accepted"] == accepted
    assert all(value in body["detail"] for value in accepted)
    if parameter == "sector_code":
        assert "45 (Information Technology)" in body["detail"]


@pytest.mark.parametrize(
    "params", [{"top_n": 0}, {"top_n": MAX_TOP_N + 1}, {"top_n": "ten"}, {"ascending": "maybe"}]
)
def test_symbol_list_rejects_bad_numbers_and_booleans(client, params):
    body = assert_problem(
        client.get("/symbol_list", params=params, headers=KEY), 400, "INVALID_PARAMETER"
    )
    assert body["parameters"] == list(params)


@pytest.mark.parametrize("path", list(ROUTES)[:-1])
@pytest.mark.parametrize("fmt", ["xml", "parquet"])
def test_an_unsupported_format_is_400(client, path, fmt):
    params = {**ROUTES[path], "format": fmt}
    body = assert_problem(client.get(path, params=params, headers=KEY), 400, "INVALID_PARAMETER")
    assert body["accepted"] == ["json", "csv"]


def test_an_unsupported_format_is_reported_before_unknown_symbols(client):
    params = {"symbols": "NOPE", "start_time": "2026-10-01", "format": "xlsx"}
    body = assert_problem(
        client.get("/gross", params=params, headers=KEY), 400, "INVALID_PARAMETER"
    )
    assert body["parameter"] == "format"


def test_an_optional_parameter_given_empty_is_the_same_as_absent(client):
    base = {"symbols": "AAPL", "start_time": "2026-10-01"}
    plain = client.get("/daily", params=base, headers=KEY)
    empty = client.get(
        "/daily", params={**base, "end_time": "", "fields": " ", "format": ""}, headers=KEY
    )
    assert empty.status_code == 200 and empty.json() == plain.json()
    listed = client.get("/symbol_list", params={"sector_code": "", "top_by": ""}, headers=KEY)
    assert listed.json() == client.get("/symbol_list", headers=KEY).json()


def test_the_openapi_document_describes_every_route_and_parameter(client):
    spec = client.get("/openapi.json").json()
    assert set(spec["paths"]) == set(ROUTES)
    assert spec["components"]["securitySchemes"]["apikey"] == {
        "type": "apiKey",
        "in": "header",
        "name": "apikey",
        "description": spec["components"]["securitySchemes"]["apikey"]["description"],
    }
    for path, item in spec["paths"].items():
        operation = item["get"]
        assert set(item) == {"get"}
        assert operation["summary"] and operation["description"], path
        assert operation["security"] == [{"apikey": []}]
        assert "422" not in operation["responses"]  # validation errors are 400 problems
        for param in operation["parameters"]:
            assert param.get("description"), (path, param["name"])


# --------------------------------------------------------------------------------------------
# The real OHLCV data set


@pytest.fixture(scope="module")
def real_client(tmp_path_factory):
    data = SHARED_DATA
    prices, master = data / "ohlcv_long_2010_2020.csv.gz", data / "gics_constituents.csv"
    if not prices.exists() or not master.exists():
        pytest.skip(f"real data files are not available under {data}")
    from eqrisk.build.pipeline import build_snapshot
    from eqrisk.data.ingest import ingest
    from eqrisk.model.run import ModelParams
    from eqrisk.settings import Settings

    home = tmp_path_factory.mktemp("ohlcv-home")
    ingest([prices], master, home=home)
    build_snapshot(home, ModelParams())
    register_key(home)
    settings = Settings(home=home, _env_file=None)
    frame = pd.read_csv(prices)
    return TestClient(create_app(settings, services=("daily",))), frame


@pytest.mark.slow
def test_daily_on_the_real_ohlcv_file_returns_the_files_own_numbers(real_client):
    client, frame = real_client
    rng = np.random.default_rng(7)
    symbols = ["AAPL", "SPY", "MSFT", "JPM", "XOM", "NVDA", "XLK", "KRE"]
    for symbol in symbols:
        own = frame[frame["symbol"] == symbol].set_index("date")
        assert len(own) > 2000, symbol
        recs = fetch(
            client,
            "/daily",
            "json",
            symbols=symbol.lower(),
            start_time="2010-01-01",
            end_time="2020-12-31",
            fields="open,high,low,close,close_raw,volume",
        )
        by_day = {r["teo"]: r for r in recs}
        assert set(by_day) == set(own.index), symbol  # one record per priced session
        sample = set(rng.choice(own.index.to_numpy(), size=40, replace=False).tolist())
        sample |= {own.index[0], own.index[-1], "2014-06-09", "2020-08-31"} & set(own.index)
        for day in sorted(sample):
            got, src = by_day[day], own.loc[day]
            assert got["symbol"] == symbol
            assert got["open"] == src["open"], (symbol, day)
            assert got["high"] == src["high"], (symbol, day)
            assert got["low"] == src["low"], (symbol, day)
            assert got["close_raw"] == src["close"], (symbol, day)
            assert got["close"] == src["adjusted_close"], (symbol, day)
            assert got["volume"] == src["volume"], (symbol, day)
    # AAPL split 4:1 on 2020-08-31: the raw close drops, the adjusted one does not.
    recs = fetch(
        client,
        "/daily",
        "csv",
        symbols="AAPL",
        start_time="2020-08-28",
        end_time="2020-08-31",
        fields="close,close_raw",
    )
    assert recs[1]["close_raw"] < recs[0]["close_raw"] / 3
    assert 0.9 < recs[1]["close"] / recs[0]["close"] < 1.1


def test_each_service_can_be_served_alone(demo_settings):
    daily_only = TestClient(create_app(demo_settings, services=("daily",)))
    assert daily_only.get("/api/health").status_code == 404
    assert daily_only.get("/api/tickers", headers={"X-API-Key": TEST_KEY}).status_code == 404
    assert daily_only.get("/symbol_list", headers=KEY).status_code == 200
    risk_only = TestClient(create_app(demo_settings, services=("risk",)))
    assert risk_only.get("/symbol_list", headers=KEY).status_code == 404
    assert risk_only.get("/api/health").status_code == 200
    both = TestClient(create_app(demo_settings))
    assert both.get("/symbol_list", headers=KEY).status_code == 200
    assert both.get("/api/tickers", headers={"X-API-Key": TEST_KEY}).status_code == 200


# --------------------------------------------------------------------------------------------
# Parameters read like Service B's; no data is a NO_DATA, not an empty answer

ACCEPTED = {
    "/daily": ["symbols", "start_time", "end_time", "fields", "format"],
    "/betas": ["symbols", "fact", "start_time", "end_time", "format"],
    "/facts": ["fact", "start_time", "end_time", "format"],
    "/gross": ["symbols", "start_time", "end_time", "format"],
    "/resids": ["symbols", "start_time", "end_time", "format"],
    "/symbol_list": ["top_n", "top_by", "ascending", "sector_code", "format"],
    "/factor_list": ["format"],
}
ACCEPTED = {path: [*names, "version"] for path, names in ACCEPTED.items()}


@pytest.mark.parametrize("path", list(ROUTES))
def test_a_misspelt_parameter_is_400_naming_it_and_listing_the_accepted_ones(client, path):
    params = {**ROUTES[path], "formt": "csv"}
    body = assert_problem(client.get(path, params=params, headers=KEY), 400, "INVALID_PARAMETER")
    assert body["parameters"] == ["formt"] and body["accepted"] == ACCEPTED[path]
    assert "formt" in body["detail"] and ", ".join(ACCEPTED[path]) in body["detail"]


@pytest.mark.parametrize("path", [p for p in ROUTES if "symbols" in ROUTES[p]])
def test_a_misspelt_required_parameter_is_named_not_reported_missing(client, path):
    params = {("symbol" if k == "symbols" else k): v for k, v in ROUTES[path].items()}
    body = assert_problem(client.get(path, params=params, headers=KEY), 400, "INVALID_PARAMETER")
    assert body["parameters"] == ["symbol"] and "symbols" in body["accepted"]


@pytest.mark.parametrize("path", list(ROUTES))
def test_a_repeated_parameter_is_400_asking_for_a_comma_separated_list(client, path):
    name = "symbols" if "symbols" in ROUTES[path] else "format"
    query = [(k, v) for k, v in ROUTES[path].items() if k != name]
    values = ["AAPL", "MSFT"] if name == "symbols" else ["json", "csv"]
    query += [(name, value) for value in values]
    body = assert_problem(client.get(path, params=query, headers=KEY), 400, "INVALID_PARAMETER")
    assert body["parameters"] == [name]
    assert "more than once" in body["detail"] and "comma-separated" in body["detail"]


@pytest.mark.parametrize(
    "params", [{}, {"top_by": "return", "ascending": "true", "top_n": 40, "sector_code": "45"}]
)
def test_symbol_list_csv_has_a_header_and_the_json_rows(client, params):
    as_json = client.get("/symbol_list", params=params, headers=KEY)
    as_csv = client.get("/symbol_list", params={**params, "format": "csv"}, headers=KEY)
    assert as_csv.status_code == 200
    assert as_csv.headers["content-type"] == "text/csv; charset=utf-8"
    rows = list(csv.reader(io.StringIO(as_csv.text)))
    assert rows[0] == ["symbol"]
    assert [r[0] for r in rows[1:]] == as_json.json()["symbols"] and len(rows) > 1
    by_accept = client.get("/symbol_list", params=params, headers={**KEY, "Accept": "text/csv"})
    assert by_accept.text == as_csv.text
    assert (
        client.get("/symbol_list", params={**params, "format": "json"}, headers=KEY).json()
        == as_json.json()
    )


@pytest.mark.parametrize("path", [p for p in ROUTES if "symbols" in ROUTES[p]])
def test_a_symbol_without_prices_in_the_range_is_no_data_naming_it(client, snap, path):
    # TAIS is delisted 2024-08-16: asked for 2025, it has no data; AAPL has.
    params = {**ROUTES[path], "symbols": f"AAPL,{DELISTED},NOV", "start_time": "2025-01-02"}
    body = assert_problem(client.get(path, params=params, headers=KEY), 404, "NO_DATA")
    last = snap.symbols.loc[DELISTED, "latest_teo"]
    assert body["symbols"] == [DELISTED, "NOV"]
    assert body["priced"][DELISTED]["to"] == str(last)[:10] == "2024-08-16"
    assert DELISTED in body["detail"] and "2024-08-16" in body["detail"]
    assert "AAPL" not in body["symbols"]
    params = {**params, "symbols": f"AAPL,{DELISTED}", "start_time": "2024-08-01"}
    assert client.get(path, params=params, headers=KEY).status_code == 200  # overlaps

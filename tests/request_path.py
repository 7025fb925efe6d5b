"""The cases of the request-path differential (tests/api/test_request_path.py, the charges;
tests/api/test_request_path_bodies.py, bodies the parser refuses, the demo key, the account's
own routes): every keyed route priced from the registry, the parameter and body strategies, and
`Meter`, the app in process over a priced home with a funded key."""

from __future__ import annotations

import codecs
import gzip
import json
import re
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from sqlalchemy import update

from eqrisk.accounts import db
from eqrisk.accounts.book import Accounts
from eqrisk.accounts.db import make_engine
from eqrisk.accounts.pricing import DEFAULT_PRICES, PriceTable
from eqrisk.api.app import create_app
from eqrisk.api.deps import served_snapshot
from eqrisk.api.endpoint import Endpoint
from eqrisk.api.endpoints import ENDPOINTS
from eqrisk.api.params import validate_params
from eqrisk.settings import Settings
from helpers import bearer, new_key

# The account's own routes (api/endpoints/account_self.py), one price key for all.
ACCOUNT_OWN = (
    "/api/account/usage",
    "/api/account/ledger",
    "/api/account/keys",
    "/api/account/topup",
)


def _distinct_prices() -> dict[str, dict[str, Any]]:
    """Every keyed route's price key (read from the registry) priced, each differently: the
    k-th key 0.0001 x k USD, in the unit the default table gives it (a call, a ticker, a
    position); a per-unit route with a minimum of three units."""
    keys = sorted({e.price_key for e in ENDPOINTS if not e.open})
    table: dict[str, dict[str, Any]] = {}
    for k, key in enumerate(keys, start=1):
        usd = Decimal("0.0001") * k
        table[key] = {"usd": str(usd)}
        if DEFAULT_PRICES[key].per != "call":
            table[key].update(per=DEFAULT_PRICES[key].per, minimum_usd=str(usd * 3))
    return table


PRICES = _distinct_prices()
EXAMPLES = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# ------------------------------------------------------------------------------ parameters

# Tickers as a caller may write them: known stocks and ETFs, a share-class twin, unknown names,
# in any case, padded.
STOCKS = ["NVDA", "AAPL", "MSFT", "CRVR", "DST", "TAIS", "GOOG", "BAA"]
ETFS = ["SPY", "XLK", "KRE"]
UNKNOWN = ["NOPE", "JPM", "ZZZZ"]


@st.composite
def spelt(draw: st.DrawFn, names: list[str]) -> str:
    """A ticker as written: any case, maybe padded with spaces."""
    name = draw(st.sampled_from(names))
    name = draw(st.sampled_from([name, name.lower(), name.capitalize()]))
    return draw(st.sampled_from([name, f" {name}", f"{name} "]))


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


YEARS = maybe(st.sampled_from(["1", "3", "13", "0", "14", "two"]))
FORMATS = maybe(st.sampled_from(["json", "CSV", " parquet", "xml"]))
BOOLS = maybe(st.sampled_from(["true", "false", "1", "0", "True"]))
ANY_TICKER = spelt(STOCKS + ETFS + UNKNOWN)
DATES = st.sampled_from(["2025-06-02", "2026-10-01", "2014-01-02", "2030-01-01", "20260101"])
RANGE = maybe(st.sampled_from(["2025-06-02", "2026-10-01", "2014-01-02", "02/06/2025"]))
# A kept version by its number (the demo home keeps v1), the current one by an unknown name.
VERSIONS = maybe(st.sampled_from(["1", "v1", "v9", ""]))
SYMBOLS = st.lists(spelt(STOCKS + ETFS + UNKNOWN[:1]), min_size=1, max_size=4).map(",".join)

# Path -> the strategy of its query parameters (None values are left out).
QUERIES: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "/api/ticker-returns": st.fixed_dictionaries(
        {"ticker": ANY_TICKER},
        optional={
            "years": YEARS,
            "format": FORMATS,
            "limit": maybe(st.sampled_from(["1", "25", "0"])),
            "csv_comment": BOOLS,
            "nocache": BOOLS,
            "start": RANGE,
            "end": RANGE,
            "version": VERSIONS,
        },
    ),
    "/api/returns": st.fixed_dictionaries(
        {"ticker": ANY_TICKER},
        optional={"years": YEARS, "format": FORMATS, "start": RANGE, "end": RANGE},
    ),
    "/api/etf-returns": st.fixed_dictionaries(
        {},
        optional={"ticker": ANY_TICKER, "etf": ANY_TICKER, "years": YEARS, "format": FORMATS},
    ),
    "/api/l3-decomposition": st.fixed_dictionaries(
        {"ticker": ANY_TICKER},
        optional={
            "from": DATES,
            "to": DATES,
            "start": RANGE,
            "end": RANGE,
            "years": YEARS,
            "format": FORMATS,
            "version": VERSIONS,
        },
    ),
    "/api/heatmap": st.fixed_dictionaries(
        {}, optional={"limit": st.sampled_from(["1", "7", "50", "500", "0", "501"])}
    ),
    "/api/tickers": st.fixed_dictionaries(
        {},
        optional={
            "mag7": BOOLS,
            "search": st.sampled_from(["nv", "Bank", "x", ""]),
            "asset_type": st.sampled_from(["stock", "etf", "bond"]),
            "include_metadata": BOOLS,
        },
    ),
    "/daily": st.fixed_dictionaries(
        {"symbols": SYMBOLS, "start_time": DATES},
        optional={
            "end_time": DATES,
            "fields": st.sampled_from(["close,volume", "nope", ""]),
            "version": VERSIONS,
        },
    ),
    "/betas": st.fixed_dictionaries(
        {
            "symbols": SYMBOLS,
            "fact": st.sampled_from(["Mkt", "energy", "nope"]),
            "start_time": DATES,
        }
    ),
    "/facts": st.fixed_dictionaries(
        {"fact": st.sampled_from(["Mkt", "Information Technology", "nope"]), "start_time": DATES},
        optional={"format": st.sampled_from(["json", "csv", "xml", ""])},
    ),
    "/gross": st.fixed_dictionaries({"symbols": SYMBOLS, "start_time": DATES}),
    "/resids": st.fixed_dictionaries({"symbols": SYMBOLS, "start_time": DATES}),
    "/api/factor-covariance": st.fixed_dictionaries(
        {}, optional={"date": DATES, "format": FORMATS}
    ),
    "/api/specific-risk": st.fixed_dictionaries({}, optional={"date": DATES, "format": FORMATS}),
    "/api/style-exposures": st.fixed_dictionaries({}, optional={"date": DATES, "format": FORMATS}),
    "/symbol_list": st.fixed_dictionaries(
        {},
        optional={
            "top_n": st.sampled_from(["1", "10", "0"]),
            "top_by": st.sampled_from(["mktcap", "close", "nope"]),
            "sector_code": st.sampled_from(["45", "99", ""]),
            "format": st.sampled_from(["json", "csv"]),
        },
    ),
    "/factor_list": st.fixed_dictionaries(
        {}, optional={"format": st.sampled_from(["json", "csv", "xml"]), "version": VERSIONS}
    ),
    "/api/batch/latest-metrics": st.fixed_dictionaries(
        {"tickers": st.sampled_from(["NVDA,AAPL", "nvda NOPE", "NOPE", ",", "SPY,GOOG"])},
        optional={"version": VERSIONS},
    ),
    "/api/returns-decomposition": st.fixed_dictionaries(
        {"ticker": ANY_TICKER},
        optional={
            "years": YEARS,
            "include_lstar": BOOLS,
            "threshold": st.sampled_from(["0.01", "0", "2", "x"]),
            "market_factor_etf": st.sampled_from(["SPY", "QQQ"]),
        },
    ),
    "/api/rankings/top": st.fixed_dictionaries(
        {
            "metric": st.sampled_from(["mkt_cap", "ER_L3", "gross_return", "nope"]),
            "cohort": st.sampled_from(["universe", "sector", "subsector", "x"]),
            "window": st.sampled_from(["1d", "21d", "252d", "2d"]),
        },
        optional={"limit": st.sampled_from(["1", "100", "0", "101"])},
    ),
    "/api/macro-factors": st.fixed_dictionaries(
        {},
        optional={
            "factors": st.sampled_from(["credit,gold", "usd", "nope", "OIL MOM"]),
            "start": RANGE,
            "end": RANGE,
            "format": FORMATS,
        },
    ),
    "/api/etf/factor-returns": st.fixed_dictionaries(
        {},
        optional={
            "sleeve": st.sampled_from(["market", "sector", "all", "x"]),
            "tickers": st.sampled_from(["SPY", "XLK,XLE", "KRE"]),
            "teo": DATES,
        },
    ),
    "/api/lstar": st.fixed_dictionaries(
        {"ticker": ANY_TICKER},
        optional={"years": YEARS, "threshold": st.sampled_from(["0.01", "-1"])},
    ),
    "/api/industry-panel": st.fixed_dictionaries(
        {},
        optional={
            "level": st.sampled_from(["market", "subsector", "x"]),
            "min_peers": st.sampled_from(["1", "3", "0"]),
            "teo": DATES,
            "by": st.sampled_from(["level", "fact"]),
        },
    ),
}
# Routes with a path parameter beyond /api/metrics/{ticker}: path -> its query parameters.
PATH_QUERIES: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "/api/rankings/{ticker}": st.fixed_dictionaries(
        {},
        optional={
            "metric": st.sampled_from(["mkt_cap", "nope"]),
            "cohort": st.sampled_from(["sector", "x"]),
            "window": st.sampled_from(["1d", "63d"]),
        },
    ),
    "/api/metrics/{ticker}/correlation": st.fixed_dictionaries(
        {},
        optional={
            "factors": st.sampled_from(["credit,gold", "nope", "usd"]),
            "return_type": st.sampled_from(["gross", "l2", "l3_residual", "x"]),
            "window_days": st.sampled_from(["20", "252", "19"]),
            "method": st.sampled_from(["pearson", "spearman", "kendall"]),
        },
    ),
    "/api/universe/{name}/members": st.fixed_dictionaries({}, optional={"teo": DATES}),
}
# POST routes beyond batch and portfolio: path -> its body.
BODIES: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "/api/decompose": st.fixed_dictionaries({"ticker": ANY_TICKER}),
    "/api/rankings/screen": st.fixed_dictionaries(
        {
            "metric": st.sampled_from(["mkt_cap", "er_l1", "nope"]),
            "cohort": st.sampled_from(["universe", "sector"]),
            "window": st.sampled_from(["1d", "21d"]),
        },
        optional={
            "limit": st.sampled_from([1, 500, 501]),
            "min_percentile": st.sampled_from([50, 101]),
            "decile": st.sampled_from([1, 10, 11]),
            "sector_filter": st.sampled_from(["xlk", "Energy", "nope"]),
            "as_of": DATES,
        },
    ),
    "/api/correlation": st.fixed_dictionaries(
        {"ticker": ANY_TICKER | st.lists(spelt(STOCKS + ETFS + UNKNOWN), min_size=1, max_size=3)},
        optional={
            "factors": st.sampled_from([["credit"], ["nope"], ["gold", "usd"]]),
            "return_type": st.sampled_from(["gross", "l1", "l3_residual"]),
            "window_days": st.sampled_from([20, 2001]),
        },
    ),
    "/api/batch/lstar": st.fixed_dictionaries(
        {"tickers": st.lists(spelt(STOCKS + ETFS + UNKNOWN), min_size=1, max_size=4)},
        optional={
            "years": st.sampled_from([1, 2, 11]),
            "format": st.sampled_from(["json", "csv", "PARQUET"]),
            "threshold": st.sampled_from([0.01, 2]),
        },
    ),
    "/api/portfolio/risk-index": st.fixed_dictionaries(
        {
            "positions": st.lists(
                st.fixed_dictionaries(
                    {
                        "ticker": spelt(STOCKS + ETFS + UNKNOWN),
                        "weight": st.sampled_from([0.5, 100.0, 0.0, -1.0]),
                    }
                ),
                max_size=4,
            )
        },
        optional={"timeSeries": st.booleans(), "years": st.sampled_from([1, 16])},
    ),
}
METRICS_PATH = "/api/metrics/{ticker}"


@st.composite
def query_string(draw: st.DrawFn, params: dict[str, Any]) -> str:
    """The parameters as a client may send them: any order; each value percent-encoded as
    usual, with `+` for spaces, or with every character escaped."""
    items = [(k, v) for k, v in params.items() if v is not None]
    items = draw(st.permutations(items))
    parts = []
    for name, value in items:
        way = draw(st.sampled_from(["plain", "plus", "escaped"]))
        if way == "escaped":
            text = "".join(f"%{b:02X}" for b in value.encode())
        else:
            text = quote(value, safe="") if way == "plain" else quote(value, safe=" ")
            text = text.replace(" ", "+")
        parts.append(f"{name}={text}")
    return "&".join(parts)


# ------------------------------------------------------------------------------ bodies


def utf8_body(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def escaped_body(doc: Any) -> bytes:
    """Every letter of every string as a \\u escape (the literals `true`, `false` and `null`
    stay as they are: JSON escapes letters only inside strings)."""

    def escape(string: re.Match[str]) -> str:
        return "".join(
            f"\\u{ord(c):04x}" if c.isalpha() and c.isascii() else c for c in string.group(0)
        )

    return re.sub(r'"(?:[^"\\\\]|\\\\.)*"', escape, json.dumps(doc)).encode()


JSON_TYPE = "application/json"
# name -> (encode the document, content-type, extra headers): what the one parser reads.
ACCEPTED: dict[str, tuple[Callable[[Any], bytes], str, dict[str, str]]] = {
    "utf-8": (utf8_body, JSON_TYPE, {}),
    "utf-8 with BOM": (lambda d: codecs.BOM_UTF8 + utf8_body(d), JSON_TYPE, {}),
    "charset=utf-8": (utf8_body, f"{JSON_TYPE}; charset=utf-8", {}),
    'charset="UTF-8", BOM': (
        lambda d: codecs.BOM_UTF8 + utf8_body(d),
        f'{JSON_TYPE}; charset="UTF-8"',
        {},
    ),
    "charset=utf8": (utf8_body, f"{JSON_TYPE};charset=utf8", {}),
    "+json type": (utf8_body, "application/vnd.eqrisk+json", {}),
    "\\u escapes": (escaped_body, JSON_TYPE, {}),
    "pretty, CRLF": (
        lambda d: json.dumps(d, indent=2).replace("\n", "\r\n").encode(),
        JSON_TYPE.upper(),
        {},
    ),
    "identity encoding": (
        lambda d: b"\n " + utf8_body(d) + b" \n",
        JSON_TYPE,
        {"content-encoding": "identity"},
    ),
}
# name -> (encode, content-type, extra headers, status): what it refuses, and how.
REFUSED: dict[str, tuple[Callable[[Any], bytes], str, dict[str, str], int]] = {
    "utf-16 with BOM": (lambda d: json.dumps(d).encode("utf-16"), JSON_TYPE, {}, 400),
    "utf-16-le": (lambda d: json.dumps(d).encode("utf-16-le"), JSON_TYPE, {}, 400),
    "utf-32 with BOM": (lambda d: json.dumps(d).encode("utf-32"), JSON_TYPE, {}, 400),
    "charset=utf-16": (
        lambda d: json.dumps(d).encode("utf-16"),
        f"{JSON_TYPE}; charset=utf-16",
        {},
        415,
    ),
    "charset=latin-1": (utf8_body, f"{JSON_TYPE}; charset=iso-8859-1", {}, 415),
    "gzip": (lambda d: gzip.compress(utf8_body(d)), JSON_TYPE, {"content-encoding": "gzip"}, 415),
    "text/plain": (utf8_body, "text/plain", {}, 415),
    "no content-type": (utf8_body, "", {}, 415),
    "two BOMs": (lambda d: codecs.BOM_UTF8 * 2 + utf8_body(d), JSON_TYPE, {}, 400),
    "a BOM alone": (lambda d: codecs.BOM_UTF8, JSON_TYPE, {}, 400),
    "latin-1 bytes": (
        lambda d: json.dumps(d)[:-1].encode() + b', "x": "\xe9"}',
        JSON_TYPE,
        {},
        400,
    ),
    "trailing data": (lambda d: utf8_body(d) + b" {}", JSON_TYPE, {}, 400),
    "NaN": (lambda d: utf8_body(d)[:-1] + b', "years": NaN}', JSON_TYPE, {}, 400),
    "empty": (lambda d: b"", JSON_TYPE, {}, 400),
}


def over_series_cap(doc: dict[str, Any]) -> bool:
    """The batch's cap, counted from the document as sent: tickers (merged case-insensitively)
    x years x series (returns and l3_decomposition in JSON; csv and parquet: one), over 5 per
    ticker charged (at least 5 charged)."""
    tickers = {str(t).strip().upper() for t in doc["tickers"]}
    metrics = set(doc.get("metrics", ["returns", "hedge_ratios"]))
    json_format = str(doc.get("format", "json")).lower() == "json"
    series = len(metrics & {"returns", "l3_decomposition"}) if json_format else 1
    return len(tickers) * int(doc.get("years", 1)) * series > 5 * max(len(tickers), 5)


BATCH = st.fixed_dictionaries(
    {"tickers": st.lists(spelt(STOCKS + ETFS + UNKNOWN), min_size=1, max_size=6)},
    optional={
        "metrics": st.lists(
            st.sampled_from(["returns", "hedge_ratios", "full_metrics", "l3_decomposition"]),
            min_size=1,
            max_size=4,
        ),
        "years": st.sampled_from([1, 2, "3", 13, 14]),
        "format": st.sampled_from(["json", "csv", "PARQUET"]),
    },
)


# ------------------------------------------------------------------------------ fixtures


class Meter:
    """The app in process over a home priced by `PRICES`, a funded metered key and the demo key
    (its limit raised for these many calls); charges read from the ledger."""

    def __init__(self, home: Path, tmp: Path) -> None:
        prices = tmp / "prices.json"
        prices.write_text(json.dumps(PRICES))
        self.prices = PriceTable.load(prices)
        self.app = create_app(Settings(home=home, _env_file=None, pricing_file=prices))
        self.client = TestClient(self.app)
        self.accounts = Accounts(make_engine(home))
        self.account_id, self.key = new_key(self.accounts, rate_limit="1000000/minute")
        self.accounts.credit(self.account_id, 10**10, "differential test")
        with db.transaction(self.accounts.engine) as conn:  # the demo key, allowed many calls
            conn.execute(
                update(db.api_keys)
                .where(db.api_keys.c.is_demo.is_(True))
                .values(rate_limit="1000000/minute")
            )
        self.snap = served_snapshot(self.app.state.snapshots)

    def call(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        key: str | None = None,
    ) -> tuple[Any, int]:
        """One request with the metered key (or `key`): (response, tokens the ledger lost)."""
        before = self.accounts.balance(self.account_id)
        auth = key or self.key
        keyed = {"apikey": auth} if not url.startswith("/api/") else bearer(auth)
        resp = self.client.request(method, url, content=body, headers={**keyed, **(headers or {})})
        spent = before - self.accounts.balance(self.account_id)
        if resp.status_code < 200 or resp.status_code >= 300:
            assert spent == 0, (url, resp.status_code)
        assert resp.headers.get("x-tokens-consumed", "0") == str(spent), (url, resp.text[:300])
        return resp, spent

    def estimate(self, name: str, params: dict[str, Any]) -> Any:
        body = utf8_body({"endpoint": name, "params": params})
        resp, _ = self.call("POST", "/api/estimate", body=body, headers={"content-type": JSON_TYPE})
        return resp

    def quote(self, spec: Endpoint[Any, Any], params: dict[str, Any]) -> int:
        """The price the endpoint's own plan gives these parameters (in process)."""
        parsed = validate_params(spec.params, params)  # type: ignore[arg-type]
        return spec.quote(spec.plan(self.snap, parsed), parsed, self.prices).tokens  # type: ignore[misc]


def endpoint_at(path: str) -> Endpoint[Any, Any]:
    return next(e for e in ENDPOINTS if e.path == path)


PORTFOLIO = st.fixed_dictionaries(
    {
        "positions": st.dictionaries(
            spelt(STOCKS + ETFS + UNKNOWN), st.sampled_from([0.5, -0.25, 0.0, 100.0]), min_size=1
        )
    },
    optional={
        "benchmark": st.sampled_from(["SPY", "nope", {"XLK": 1.0}]),
        "date": DATES,
        "level": st.sampled_from(["L1", "L2", "L3", "L4"]),
        "units": st.sampled_from(["weights", "dollars"]),
    },
)


def make_meter(demo_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Meter:
    """A `Meter` over a copy of the demo home's snapshots (the module fixture of each file)."""
    import shutil

    tmp = tmp_path_factory.mktemp("request-path")
    home = tmp / "home"
    shutil.copytree(demo_home / "snapshots", home / "snapshots")
    return Meter(home, tmp)

"""One request path (issue 21), a differential test: for every keyed route, the charge of a
request equals the price its route's own plan gives (`Endpoint.quote`) and what `/api/estimate`
says, for every body encoding and parameter form the route accepts; a body the route cannot read
is a 4xx and free (the ledger unchanged); the demo key's rules hold on every encoding. Every
route is priced here (an operator's price file), so a price of zero hides nothing; the prices
are distinct, so a call priced under another route's key shows."""

from __future__ import annotations

import codecs
import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import update

from eqrisk.accounts import db
from eqrisk.accounts.book import STARTING_CREDIT_TOKENS, Accounts
from eqrisk.accounts.db import make_engine
from eqrisk.accounts.pricing import PriceTable, usd_to_tokens
from eqrisk.api.app import create_app
from eqrisk.api.deps import served_snapshot
from eqrisk.api.endpoint import Endpoint
from eqrisk.api.endpoints import ENDPOINTS
from eqrisk.api.params import validate_params
from eqrisk.data.master import MAG7
from eqrisk.settings import Settings
from helpers import assert_problem, bearer, new_key

# The account's own routes (api/endpoints/account_self.py), one price key for all.
ACCOUNT_OWN = (
    "/api/account/usage",
    "/api/account/ledger",
    "/api/account/keys",
    "/api/account/topup",
)

# Every keyed route priced, each differently; the batch per ticker with a minimum.
PRICES: dict[str, dict[str, Any]] = {
    "tickers": {"usd": "0.0001"},
    "estimate": {"usd": "0.0002"},
    "balance": {"usd": "0.0003"},
    "account": {"usd": "0.00034"},
    "metrics": {"usd": "0.004"},
    "ticker-returns": {"usd": "0.005"},
    "returns": {"usd": "0.006"},
    "etf-returns": {"usd": "0.007"},
    "heatmap": {"usd": "0.008"},
    "l3-decomposition": {"usd": "0.01"},
    "batch/analyze": {"usd": "0.002", "per": "ticker", "minimum_usd": "0.005"},
    "portfolio/risk": {"usd": "0.0003", "per": "position", "minimum_usd": "0.001"},
    "factor-covariance": {"usd": "0.011"},
    "specific-risk": {"usd": "0.012"},
    "daily": {"usd": "0.0004"},
    "betas": {"usd": "0.0005"},
    "facts": {"usd": "0.0006"},
    "gross": {"usd": "0.0007"},
    "resids": {"usd": "0.0008"},
    "symbol_list": {"usd": "0.0009"},
    "factor_list": {"usd": "0.0011"},
    "decompose": {"usd": "0.0012"},
    "batch/latest-metrics": {"usd": "0.0013"},
    "returns-decomposition": {"usd": "0.0014"},
    "rankings": {"usd": "0.0015"},
    "rankings/top": {"usd": "0.0016"},
    "rankings/screen": {"usd": "0.0017"},
    "macro-factors": {"usd": "0.0018"},
    "etf/factor-returns": {"usd": "0.0019"},
    "correlation": {"usd": "0.0021"},
    "metrics/correlation": {"usd": "0.0022"},
    "lstar": {"usd": "0.0023"},
    "batch/lstar": {"usd": "0.0024", "per": "ticker", "minimum_usd": "0.003"},
    "portfolio/risk-index": {"usd": "0.0025"},
    "industry-panel": {"usd": "0.0026"},
    "universe/members": {"usd": "0.0027"},
}
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


def _utf8(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def _escaped(doc: Any) -> bytes:
    """Every letter of every string as a \\u escape (inside strings only: `true`, `false` and
    `null` stay literals, which JSON does not let escape)."""
    out: list[str] = []
    in_string, escaped, hex_left = False, False, 0
    for c in json.dumps(doc):
        if in_string and not escaped and not hex_left and c.isalpha() and c.isascii():
            out.append(f"\\u{ord(c):04x}")
            continue
        out.append(c)
        if hex_left:
            hex_left -= 1
        elif escaped:
            escaped, hex_left = False, 4 if c == "u" else 0
        elif in_string and c == "\\":
            escaped = True
        elif c == '"':
            in_string = not in_string
    return "".join(out).encode()


JSON_TYPE = "application/json"
# name -> (encode the document, content-type, extra headers): what the one parser reads.
ACCEPTED: dict[str, tuple[Callable[[Any], bytes], str, dict[str, str]]] = {
    "utf-8": (_utf8, JSON_TYPE, {}),
    "utf-8 with BOM": (lambda d: codecs.BOM_UTF8 + _utf8(d), JSON_TYPE, {}),
    "charset=utf-8": (_utf8, f"{JSON_TYPE}; charset=utf-8", {}),
    'charset="UTF-8", BOM': (
        lambda d: codecs.BOM_UTF8 + _utf8(d),
        f'{JSON_TYPE}; charset="UTF-8"',
        {},
    ),
    "charset=utf8": (_utf8, f"{JSON_TYPE};charset=utf8", {}),
    "+json type": (_utf8, "application/vnd.eqrisk+json", {}),
    "\\u escapes": (_escaped, JSON_TYPE, {}),
    "pretty, CRLF": (
        lambda d: json.dumps(d, indent=2).replace("\n", "\r\n").encode(),
        JSON_TYPE.upper(),
        {},
    ),
    "identity encoding": (
        lambda d: b"\n " + _utf8(d) + b" \n",
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
    "charset=latin-1": (_utf8, f"{JSON_TYPE}; charset=iso-8859-1", {}, 415),
    "gzip": (lambda d: gzip.compress(_utf8(d)), JSON_TYPE, {"content-encoding": "gzip"}, 415),
    "text/plain": (_utf8, "text/plain", {}, 415),
    "no content-type": (_utf8, "", {}, 415),
    "two BOMs": (lambda d: codecs.BOM_UTF8 * 2 + _utf8(d), JSON_TYPE, {}, 400),
    "a BOM alone": (lambda d: codecs.BOM_UTF8, JSON_TYPE, {}, 400),
    "latin-1 bytes": (
        lambda d: json.dumps(d)[:-1].encode() + b', "x": "\xe9"}',
        JSON_TYPE,
        {},
        400,
    ),
    "trailing data": (lambda d: _utf8(d) + b" {}", JSON_TYPE, {}, 400),
    "NaN": (lambda d: _utf8(d)[:-1] + b', "years": NaN}', JSON_TYPE, {}, 400),
    "empty": (lambda d: b"", JSON_TYPE, {}, 400),
}

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
        body = _utf8({"endpoint": name, "params": params})
        resp, _ = self.call("POST", "/api/estimate", body=body, headers={"content-type": JSON_TYPE})
        return resp

    def quote(self, spec: Endpoint[Any, Any], params: dict[str, Any]) -> int:
        """The price the endpoint's own plan gives these parameters (in process)."""
        parsed = validate_params(spec.params, params)  # type: ignore[arg-type]
        return spec.quote(spec.plan(self.snap, parsed), parsed, self.prices).tokens  # type: ignore[misc]


@pytest.fixture(scope="module")
def meter(demo_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Meter:
    tmp = tmp_path_factory.mktemp("request-path")
    home = tmp / "home"
    import shutil

    shutil.copytree(demo_home / "snapshots", home / "snapshots")
    return Meter(home, tmp)


def _spec(path: str) -> Endpoint[Any, Any]:
    return next(e for e in ENDPOINTS if e.path == path)


# ------------------------------------------------------------------------------ tests


def test_every_keyed_route_is_in_the_differential() -> None:
    """A new keyed route needs its case here (its parameters below, or a body above)."""
    keyed = {e.path for e in ENDPOINTS if not e.open}
    covered = {
        *QUERIES,
        *PATH_QUERIES,
        *BODIES,
        METRICS_PATH,
        "/api/batch/analyze",
        "/api/portfolio/risk",
        "/api/estimate",
        "/api/balance",
        *ACCOUNT_OWN,
    }
    assert keyed == covered
    assert set(PRICES) == {e.price_key for e in ENDPOINTS if not e.open}


@EXAMPLES
@given(data=st.data())
def test_a_get_is_charged_its_plans_price_and_its_estimate_in_every_form(
    meter: Meter, data: st.DataObject
) -> None:
    path = data.draw(st.sampled_from(sorted(QUERIES)))
    spec = _spec(path)
    params = {k: v for k, v in data.draw(QUERIES[path]).items() if v is not None}
    url = f"{path}?{data.draw(query_string(params))}" if params else path
    accept = data.draw(maybe(st.sampled_from(["text/csv", "application/vnd.apache.parquet"])))
    resp, spent = meter.call("GET", url, headers={"accept": accept} if accept else None)
    price = meter.prices[spec.price_key or ""]
    if spec.size is not None:  # offered by /api/estimate: the same status, the same price
        estimate = meter.estimate(spec.name, params)
        assert estimate.status_code == (200 if resp.is_success else resp.status_code), (
            url,
            resp.text[:300],
            estimate.text[:300],
        )
        if resp.is_success:
            assert spent == estimate.json()["estimated_tokens"]
    if resp.is_success:
        assert spent == meter.quote(spec, params) == price.cost(1)


def test_a_bad_parameter_and_an_unknown_version_are_the_routes_error_in_the_estimate(
    meter: Meter,
) -> None:
    """Hypothesis found the estimate looking the version up before reading the parameters:
    the route refused a bad date (400), the estimate the version (404). Both read the
    parameters first now, then the version, then plan."""
    params = {"ticker": "NVDA", "start": "02/06/2025", "version": "v9"}
    resp, _ = meter.call("GET", "/api/ticker-returns?" + urlencode(params))
    estimate = meter.estimate("ticker-returns", params)
    assert resp.status_code == estimate.status_code == 400
    assert resp.json()["error"] == estimate.json()["error"] == "INVALID_PARAMETER"
    assert resp.json()["parameters"] == ["start"]
    assert estimate.json()["parameters"] == ["params.start"]
    good = {"ticker": "NVDA", "start": "2025-02-06", "version": "v9"}
    resp, _ = meter.call("GET", "/api/ticker-returns?" + urlencode(good))
    estimate = meter.estimate("ticker-returns", good)
    assert resp.status_code == estimate.status_code == 404
    assert resp.json()["error"] == estimate.json()["error"] == "VERSION_NOT_FOUND"


@EXAMPLES
@given(ticker=spelt(STOCKS + ETFS + UNKNOWN), form=st.sampled_from(["plain", "escaped"]))
def test_metrics_is_charged_its_plans_price_in_every_spelling(
    meter: Meter, ticker: str, form: str
) -> None:
    written = (
        quote(ticker, safe="") if form == "plain" else "".join(f"%{b:02X}" for b in ticker.encode())
    )
    resp, spent = meter.call("GET", f"/api/metrics/{written}")
    estimate = meter.estimate(f"metrics/{ticker.strip()}", {})
    assert estimate.status_code == (200 if resp.is_success else resp.status_code)
    if resp.is_success:
        spec = _spec(METRICS_PATH)
        assert spent == estimate.json()["estimated_tokens"] == meter.quote(spec, {"ticker": ticker})
        assert spent == meter.prices["metrics"].tokens


@EXAMPLES
@given(doc=BATCH, encoding=st.sampled_from(sorted(ACCEPTED)))
def test_a_batch_is_charged_its_plans_price_in_every_accepted_encoding(
    meter: Meter, doc: dict[str, Any], encoding: str
) -> None:
    encode, content_type, extra = ACCEPTED[encoding]
    headers = {"content-type": content_type, **extra}
    resp, spent = meter.call("POST", "/api/batch/analyze", body=encode(doc), headers=headers)
    estimate = meter.estimate("batch/analyze", doc)
    assert estimate.status_code == (200 if resp.is_success else resp.status_code), resp.text[:300]
    if not resp.is_success:
        assert resp.status_code == 400  # the parameters (the same in every encoding), not the bytes
        return
    assert spent == estimate.json()["estimated_tokens"]
    assert spent == meter.quote(_spec("/api/batch/analyze"), doc)
    # Independently of the plan: the price table applied to the answer's own succeeded count.
    asked = list(dict.fromkeys(t.strip().upper() for t in doc["tickers"]))
    if resp.headers["content-type"].startswith("application/json"):
        succeeded = resp.json()["summary"]["succeeded"]
    else:
        failed = resp.headers["x-failed-tickers"]
        succeeded = len(asked) - (len(failed.split(",")) if failed else 0)
    assert spent == meter.prices["batch/analyze"].cost(succeeded)


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


@EXAMPLES
@given(data=st.data())
def test_a_path_route_is_charged_its_plans_price_and_its_estimate(
    meter: Meter, data: st.DataObject
) -> None:
    path = data.draw(st.sampled_from(sorted(PATH_QUERIES)))
    spec = _spec(path)
    (name,) = spec.path_params
    names = ["uni_mc_50", "UNI_DV_500", "uni_mc_7"] if name == "name" else STOCKS + ETFS + UNKNOWN
    value = data.draw(spelt(names)).strip()
    params = data.draw(PATH_QUERIES[path])
    url = path.replace("{" + name + "}", quote(value, safe=""))
    resp, spent = meter.call("GET", f"{url}?{urlencode(params)}" if params else url)
    estimate = meter.estimate(url.removeprefix("/api/"), params)
    assert estimate.status_code == (200 if resp.is_success else resp.status_code), resp.text[:300]
    if resp.is_success:
        assert spent == estimate.json()["estimated_tokens"]
        assert spent == meter.quote(spec, {**params, name: value})
        assert spent == meter.prices[spec.price_key or ""].cost(1)


@EXAMPLES
@given(data=st.data(), encoding=st.sampled_from(sorted(ACCEPTED)))
def test_a_post_route_is_charged_its_plans_price_in_every_accepted_encoding(
    meter: Meter, data: st.DataObject, encoding: str
) -> None:
    path = data.draw(st.sampled_from(sorted(BODIES)))
    doc = data.draw(BODIES[path])
    encode, content_type, extra = ACCEPTED[encoding]
    headers = {"content-type": content_type, **extra}
    resp, spent = meter.call("POST", path, body=encode(doc), headers=headers)
    spec = _spec(path)
    estimate = meter.estimate(spec.name, doc)
    assert estimate.status_code == (200 if resp.is_success else resp.status_code), resp.text[:300]
    if resp.is_success:
        assert spent == estimate.json()["estimated_tokens"] == meter.quote(spec, doc)
        price = meter.prices[spec.price_key or ""]
        if price.per == "call" and spent:  # zero: a call that is not charged (no position)
            assert spent == price.cost(1)
    else:
        assert 400 <= resp.status_code < 500 and spent == 0


@EXAMPLES
@given(doc=PORTFOLIO)
def test_a_portfolio_is_charged_per_position_used_as_estimated(
    meter: Meter, doc: dict[str, Any]
) -> None:
    resp, spent = meter.call(
        "POST", "/api/portfolio/risk", body=_utf8(doc), headers={"content-type": JSON_TYPE}
    )
    estimate = meter.estimate("portfolio/risk", doc)
    assert estimate.status_code == (200 if resp.is_success else resp.status_code), resp.text[:300]
    if not resp.is_success:
        assert spent == 0
        return
    assert spent == estimate.json()["estimated_tokens"]
    assert spent == meter.quote(_spec("/api/portfolio/risk"), doc)
    used = len(resp.json()["portfolio"]["positions"])
    assert spent == meter.prices["portfolio/risk"].cost(used)


@EXAMPLES
@given(doc=BATCH, encoding=st.sampled_from(sorted(REFUSED)))
def test_a_body_the_parser_refuses_is_a_4xx_and_free(
    meter: Meter, doc: dict[str, Any], encoding: str
) -> None:
    encode, content_type, extra, status = REFUSED[encoding]
    headers = {"content-type": content_type, **extra} if content_type else extra
    for path in ("/api/batch/analyze", "/api/estimate"):
        body = encode(doc if path.endswith("analyze") else {"endpoint": "heatmap"})
        resp, spent = meter.call("POST", path, body=body, headers=headers)
        code = "UNSUPPORTED_MEDIA_TYPE" if status == 415 else resp.json().get("error")
        assert_problem(resp, status, code)
        assert code in ("UNSUPPORTED_MEDIA_TYPE", "INVALID_PARAMETER", "MISSING_PARAMETER")
        assert spent == 0 and resp.headers["x-tokens-consumed"] == "0"


@EXAMPLES
@given(doc=BATCH, encoding=st.sampled_from(sorted(ACCEPTED) + sorted(REFUSED)))
def test_the_demo_keys_rules_hold_in_every_encoding(
    meter: Meter, doc: dict[str, Any], encoding: str
) -> None:
    if encoding in ACCEPTED:
        encode, content_type, extra = ACCEPTED[encoding]
    else:
        encode, content_type, extra, _ = REFUSED[encoding]
    headers = {"content-type": content_type, **extra} if content_type else extra
    resp, spent = meter.call(
        "POST", "/api/batch/analyze", body=encode(doc), headers=headers, key="eqrisk-demo"
    )
    assert spent == 0 and resp.headers.get("x-tokens-consumed", "0") == "0"
    asked = {t.strip().upper() for t in doc["tickers"]}
    outside = {t for t in asked if t not in MAG7 and t != "GOOG"}
    if encoding in REFUSED:
        assert resp.status_code == REFUSED[encoding][3]
    elif outside:
        body = assert_problem(resp, 403, "DEMO_RESTRICTED")
        assert all(t in body["detail"] for t in outside)
    elif resp.is_success and resp.headers["content-type"].startswith("application/json"):
        entries = resp.json()["results"].values()
        served = {e["meta"]["ticker"] for e in entries if e["status"] == "success"}
        assert served <= set(MAG7)  # what was served, whatever was asked


def test_a_paid_call_with_a_bom_is_charged_and_the_demo_key_is_refused(meter: Meter) -> None:
    """The report's own case: a body starting with a byte-order mark."""
    body = codecs.BOM_UTF8 + _utf8({"tickers": ["NVDA", "AAPL", "SPY", "XLK", "KRE", "MSFT"]})
    headers = {"content-type": JSON_TYPE}
    resp, spent = meter.call("POST", "/api/batch/analyze", body=body, headers=headers)
    assert resp.status_code == 200 and spent == usd_to_tokens("0.012")
    demo = codecs.BOM_UTF8 + _utf8({"tickers": ["JPM", "XOM"]})
    resp, spent = meter.call(
        "POST", "/api/batch/analyze", body=demo, headers=headers, key="eqrisk-demo"
    )
    assert_problem(resp, 403, "DEMO_RESTRICTED")
    assert spent == 0


def test_the_balance_is_charged_its_price(meter: Meter) -> None:
    resp, spent = meter.call("GET", "/api/balance")
    assert resp.status_code == 200 and spent == meter.prices["balance"].tokens
    assert spent == _spec("/api/balance").quote(None, None, meter.prices).tokens


def test_the_accounts_own_reads_are_charged_their_price(meter: Meter) -> None:
    for path in ACCOUNT_OWN[:3]:
        resp, spent = meter.call("GET", path)
        assert resp.status_code == 200 and spent == meter.prices["account"].tokens, path
        assert spent == _spec(path).quote(None, None, meter.prices).tokens


# ------------------------------------------------------------------------------ the class twin


@pytest.fixture(scope="module")
def goog_home(demo_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo market plus GOOG, Alphabet's other share class (a data set that holds the twin
    the real client sends for GOOGL), built."""
    import pandas as pd

    from eqrisk.data.ingest import ingest
    from eqrisk.model.run import ModelParams
    from eqrisk.snapshot.build import build_snapshot

    tmp = tmp_path_factory.mktemp("goog")
    prices = pd.read_csv(demo_home / "demo" / "demo_prices.csv.gz")
    goog = prices[prices["symbol"] == "GOOGL"].copy()
    goog["symbol"] = "GOOG"
    for column in ("open", "high", "low", "close", "adjusted_close"):
        goog[column] *= 0.99
    pd.concat([prices, goog]).to_csv(tmp / "prices.csv.gz", index=False)
    master = pd.read_csv(demo_home / "demo" / "demo_master.csv")
    twin = master[master["symbol"] == "GOOGL"].assign(symbol="GOOG", name="Alphabet Inc. C")
    pd.concat([master, twin]).to_csv(tmp / "master.csv", index=False)
    home = tmp / "home"
    ingest([tmp / "prices.csv.gz"], tmp / "master.csv", home=home, data_source="demo-synthetic")
    build_snapshot(home, ModelParams())
    return home


def test_the_demo_key_gets_its_seven_tickers_only_when_the_data_set_holds_goog(
    goog_home: Path,
) -> None:
    client = TestClient(create_app(Settings(home=goog_home, _env_file=None)))
    accounts = Accounts(make_engine(goog_home))
    _, key = new_key(accounts, rate_limit="1000/minute")
    paid = client.get("/api/metrics/GOOG", headers=bearer(key))
    assert paid.status_code == 200 and paid.json()["ticker"] == "GOOG"  # held: its own data
    with db.transaction(accounts.engine) as conn:
        conn.execute(
            update(db.api_keys)
            .where(db.api_keys.c.is_demo.is_(True))
            .values(rate_limit="1000/minute")
        )
    demo = bearer("eqrisk-demo")
    refused = [
        client.get("/api/metrics/GOOG", headers=demo),
        client.get("/api/metrics/goog", headers=demo),
        client.get("/api/ticker-returns?ticker=GOOG&limit=5", headers=demo),
        client.post("/api/batch/analyze", json={"tickers": ["AAPL", "goog"]}, headers=demo),
        client.get("/daily?symbols=GOOG&start_time=2026-10-01", headers={"apikey": "eqrisk-demo"}),
    ]
    for resp in refused:
        body = assert_problem(resp, 403, "DEMO_RESTRICTED")
        assert "GOOG" in body["detail"].split("not ")[-1] and body["allowed_tickers"] == list(MAG7)
    assert client.get("/api/metrics/GOOGL", headers=demo).json()["ticker"] == "GOOGL"
    heatmap = client.get("/api/heatmap?limit=500", headers=demo).json()
    assert {r["ticker"] for r in heatmap["data"]} == set(MAG7)
    assert client.get("/api/tickers?mag7=true", headers=demo).json()["tickers"] == list(MAG7)


def test_a_keyed_answer_its_route_never_priced_is_refused_and_free(tmp_path: Path) -> None:
    """The gate sends no keyed 2xx without the price its route set: a route that answers
    without the `Metered` dependency (a future route that forgot it) gets a 500, not a free
    answer, and nothing is charged."""
    from starlette.responses import PlainTextResponse

    from eqrisk.accounts.limits import RateLimiter
    from eqrisk.api.gate import Gate

    accounts = Accounts(make_engine(tmp_path))
    account_id, key = new_key(accounts)
    unpriced = PlainTextResponse("paid data, unpriced")
    gate = Gate(unpriced, accounts=accounts, limiter=RateLimiter(), keyed=lambda path: "risk")
    client = TestClient(gate)
    resp = client.get("/api/anything", headers=bearer(key))
    assert resp.status_code == 500 and resp.json()["error"] == "INTERNAL_ERROR"
    assert "paid data" not in resp.text
    assert accounts.balance(account_id) == STARTING_CREDIT_TOKENS
    assert [e for e in accounts.ledger(account_id) if e["kind"] == "charge"] == []

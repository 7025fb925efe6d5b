"""Answers to DataFrames, the last call's accounting, and the portfolio arithmetic.

Shape-tolerant on purpose: Service B's bodies were aligned with the real RiskModels service
(issue 13), so a table may come row-wise (`data: [{...}]`) or column-wise (`dates` plus parallel
arrays), and a metric may use the short wire name (`l3_sec_hr`) or the long one
(`l3_sector_hr`). The client reads both and exposes eqrisk's short names.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import pandas as pd
import pyarrow.parquet as pq

# Long names of the real service -> eqrisk's short names (only the ones the client reads).
LONG_TO_SHORT: dict[str, str] = {
    "l1_market_hr": "l1_mkt_hr",
    "l2_market_hr": "l2_mkt_hr",
    "l2_sector_hr": "l2_sec_hr",
    "l3_market_hr": "l3_mkt_hr",
    "l3_sector_hr": "l3_sec_hr",
    "l3_subsector_hr": "l3_sub_hr",
    "l1_market_er": "l1_mkt_er",
    "l1_residual_er": "l1_res_er",
    "l2_market_er": "l2_mkt_er",
    "l2_sector_er": "l2_sec_er",
    "l2_residual_er": "l2_res_er",
    "l3_market_er": "l3_mkt_er",
    "l3_sector_er": "l3_sec_er",
    "l3_subsector_er": "l3_sub_er",
    "l3_residual_er": "l3_res_er",
}
HR_FIELDS = ("l1_mkt_hr", "l2_mkt_hr", "l2_sec_hr", "l3_mkt_hr", "l3_sec_hr", "l3_sub_hr")
ETF_FIELDS = ("market_etf", "sector_etf", "subsector_etf")
# Which ETF each hedge ratio is a position in, per level (the ETF names come from `meta`).
HEDGES: dict[str, tuple[tuple[str, str], ...]] = {
    "L1": (("l1_mkt_hr", "market_etf"),),
    "L2": (("l2_mkt_hr", "market_etf"), ("l2_sec_hr", "sector_etf")),
    "L3": (
        ("l3_mkt_hr", "market_etf"),
        ("l3_sec_hr", "sector_etf"),
        ("l3_sub_hr", "subsector_etf"),
    ),
}


@dataclass(frozen=True)
class LastCall:
    """What the server said about the last call: price, balance, lineage (from its headers)."""

    method: str
    url: str
    status: int
    request_id: str | None
    cost_usd: float | None
    tokens: int | None
    balance_usd: float | None
    model_version: str | None
    data_as_of: str | None
    rate_limit_remaining: int | None

    @classmethod
    def of(cls, response: httpx.Response) -> LastCall:
        h = response.headers

        def num(name: str) -> float | None:
            value = h.get(name)
            try:
                return float(value) if value is not None else None
            except ValueError:
                return None

        tokens, remaining = num("x-tokens-consumed"), num("x-ratelimit-remaining")
        return cls(
            method=response.request.method,
            url=str(response.request.url),
            status=response.status_code,
            request_id=h.get("x-request-id"),
            cost_usd=num("x-api-cost-usd"),
            tokens=None if tokens is None else int(tokens),
            balance_usd=num("x-balance-remaining-usd"),
            model_version=h.get("x-risk-model-version") or h.get("x-model-version"),
            data_as_of=h.get("x-data-as-of"),
            rate_limit_remaining=None if remaining is None else int(remaining),
        )


def short_names(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` with long metric names renamed to eqrisk's short ones (short ones win)."""
    out = {LONG_TO_SHORT.get(k, k): v for k, v in values.items() if k not in LONG_TO_SHORT}
    for long, short in LONG_TO_SHORT.items():
        if long in values and out.get(short) is None:
            out[short] = values[long]
    return out


def _dated(frame: pd.DataFrame, column: str = "date") -> pd.DataFrame:
    """Dates as datetime64, the one type whatever the wire format was."""
    if column in frame.columns:
        frame[column] = pd.to_datetime(frame[column])
    return frame


def table_of(body: Any) -> pd.DataFrame:
    """A JSON table: a list of rows, `{data: [rows]}`, or column-wise `{dates: [...], col: [...]}`."""
    if isinstance(body, list):
        return pd.DataFrame(body)
    if isinstance(body, dict):
        if isinstance(body.get("data"), list):
            return pd.DataFrame(body["data"])
        dates = body.get("dates")
        if isinstance(dates, list):
            columns = {"date": dates}
            for name, values in body.items():
                if isinstance(values, list) and len(values) == len(dates) and name != "dates":
                    columns[name] = values
            return pd.DataFrame(columns)
    return pd.DataFrame()


def frame_of(response: httpx.Response, date_column: str = "date") -> pd.DataFrame:
    """The answer's table, from Parquet, CSV or JSON by its content type, dates parsed."""
    kind = response.headers.get("content-type", "")
    lineage: dict[str, Any] = {}
    if "parquet" in kind:
        table = pq.read_table(io.BytesIO(response.content))
        meta = table.schema.metadata or {}
        for name in ("model_version", "data_as_of"):
            if name.encode() in meta:
                lineage[name] = meta[name.encode()].decode()
        frame = table.to_pandas()
    elif kind.startswith("text/csv"):
        lines = response.content.splitlines(keepends=True)
        comments = [line for line in lines if line.startswith(b"#")]  # csv_comment=true
        for line in comments:
            for item in line.decode().lstrip("#").split(","):
                name, _, value = item.strip().partition("=")
                if name in ("model_version", "data_as_of") and value:
                    lineage[name] = value
        frame = pd.read_csv(io.BytesIO(b"".join(x for x in lines if not x.startswith(b"#"))))
    else:
        frame = table_of(response.json())
    frame = _dated(frame, date_column)
    h = response.headers
    version = h.get("x-risk-model-version") or h.get("x-model-version")
    lineage.update(
        {k: v for k, v in (("model_version", version), ("data_as_of", h.get("x-data-as-of"))) if v}
    )
    failed = h.get("x-failed-tickers")
    if failed:
        lineage["failed_tickers"] = [t for t in failed.split(",") if t]
    frame.attrs.update(lineage)
    return frame


def search_hits(body: Any) -> pd.DataFrame:
    """Ticker list or search hits as a frame with a `ticker` column, whichever key holds them."""
    if isinstance(body, dict):
        for key in ("results", "tickers", "data", "suggestions"):
            rows = body.get(key)
            if isinstance(rows, list) and rows:
                body = rows
                break
        else:
            return pd.DataFrame({"ticker": pd.Series([], dtype=object)})
    if isinstance(body, list) and body and isinstance(body[0], str):
        return pd.DataFrame({"ticker": body})
    return pd.DataFrame(body)


# ------------------------------------------------------------------------------ portfolio


def entry_values(entry: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(flat metrics with short names, meta with the ETF symbols) of one batch entry, whether
    `full_metrics` is flat (the real service's shape) or nests `metrics` and `meta` (eqrisk
    before issue 13); the `hedge_ratios` object and `hedge_levels` fill what is missing."""
    full = entry.get("full_metrics") or {}
    nested = full.get("metrics")
    values = short_names(nested if isinstance(nested, dict) else full)
    meta: dict[str, Any] = {}
    for source in (full.get("meta"), entry.get("meta")):
        if isinstance(source, dict):
            meta.update({k: v for k, v in source.items() if v is not None})
    latest = entry.get("hedge_ratios")
    if isinstance(latest, dict):
        for key, value in latest.items():
            name = LONG_TO_SHORT.get(f"{key}_hr", f"{key}_hr")
            if values.get(name) is None:
                values[name] = value
    levels = entry.get("hedge_levels")
    if isinstance(levels, dict):
        etfs = (levels.get("L3") or {}).get("hedge_etfs") or {}
        for role in ("market", "sector", "subsector"):
            if meta.get(f"{role}_etf") is None and etfs.get(role):
                meta[f"{role}_etf"] = etfs[role]
    return values, meta


@dataclass
class Portfolio:
    """A book's hedge from one batch call.

    `positions`: per ticker its weight, hedge ratios (short names) and ETFs. `hedge_ratios`: the
    weight-summed hedge ratio per field. `notionals`: per level and ETF, the sum over positions
    of weight x hedge ratio on that ETF: the ETF dollars with the book's factor exposure at that
    level (sell them to hedge). `failed`: tickers the batch could not analyze, with the reason.
    """

    positions: pd.DataFrame
    hedge_ratios: pd.Series
    notionals: pd.DataFrame
    failed: dict[str, str] = field(default_factory=dict)

    def hedge(self, level: str = "L3") -> pd.Series:
        """ETF -> notional at one level ("L1", "L2" or "L3")."""
        rows = self.notionals[self.notionals["level"] == level.upper()]
        return rows.set_index("etf")["notional"]


def portfolio_of(weights: Mapping[str, float], body: Mapping[str, Any]) -> Portfolio:
    """The Portfolio of `weights` (ticker -> weight or dollars) from a JSON batch answer."""
    results: Mapping[str, Any] = body.get("results") or {}
    upper = {t.strip().upper(): float(w) for t, w in weights.items()}
    rows, failed = [], {}
    notional: dict[tuple[str, str], float] = {}
    for ticker, weight in upper.items():
        entry = results.get(ticker)
        if not isinstance(entry, dict) or entry.get("status") not in ("success", "ok"):
            error = entry.get("error") if isinstance(entry, dict) else "missing from the answer"
            failed[ticker] = error if isinstance(error, str) else str(error)
            continue
        values, meta = entry_values(entry)
        rows.append({"ticker": ticker, "weight": weight, **{f: values.get(f) for f in HR_FIELDS}})
        rows[-1].update({k: meta.get(k) for k in ETF_FIELDS})
        for level, pairs in HEDGES.items():
            for hr_field, etf_field in pairs:
                etf, hr = meta.get(etf_field), values.get(hr_field)
                if etf and hr is not None and hr == hr:  # NaN: no ratio at this level
                    notional[level, etf] = notional.get((level, etf), 0.0) + weight * float(hr)
    positions = pd.DataFrame(rows, columns=["ticker", "weight", *HR_FIELDS, *ETF_FIELDS]).set_index(
        "ticker"
    )
    summed = positions[list(HR_FIELDS)].astype(float).mul(positions["weight"], axis=0).sum()
    notionals = pd.DataFrame(
        [{"level": lv, "etf": etf, "notional": v} for (lv, etf), v in sorted(notional.items())],
        columns=["level", "etf", "notional"],
    )
    return Portfolio(positions, summed, notionals, failed)

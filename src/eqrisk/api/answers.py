"""How Service B answers: lineage headers, the `{..., _metadata}` document and the series answer
(`{data, meta, _metadata}`, CSV or Parquet, with an ETag), shared by its endpoints.

Every answer from a snapshot carries `X-Model-Version` (and the real Service B's
`X-Risk-Model-Version`) and `X-Data-As-Of`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from starlette.responses import Response

from eqrisk.api.formats import CSV, JSON, JSON_COLUMNS, answer, json_response
from eqrisk.api.plans import SeriesPlan
from eqrisk.snapshot.versions import Snapshot


def snap_headers(snap: Snapshot) -> dict[str, str]:
    """Lineage headers: `X-Risk-Model-Version` is the name the real Service B's clients read;
    `X-Model-Version` stays for eqrisk's own readers."""
    return {
        "X-Model-Version": snap.version,
        "X-Risk-Model-Version": snap.version,
        "X-Data-As-Of": str(snap.manifest["data_as_of"]),
        "X-Universe-Size": str(snap.manifest["universe_size"]),
    }


def document(snap: Snapshot, doc: dict[str, Any]) -> Response:
    """A JSON document with the snapshot's `_metadata` and lineage headers."""
    return json_response({**doc, "_metadata": snap.metadata()}, headers=snap_headers(snap))


def safe_filename(text: str) -> str:
    return "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in text)


def series_meta(snap: Snapshot, plan: SeriesPlan, years: int | None) -> dict[str, Any]:
    sym = plan.symbol
    meta: dict[str, Any] = {
        "ticker": sym.ticker,
        "company_name": sym.company_name,
        "asset_type": sym.asset_type,
        "market_etf": sym.market_etf,
        "sector_etf": sym.sector_etf,
        "subsector_etf": sym.subsector_etf,
    }
    if years is not None:
        meta["years"] = years
    meta.update({"from": plan.start, "to": plan.end, "rows": plan.rows})
    if meta["rows"] == 0:  # only a range without sessions gets here (else NO_DATA)
        sessions = snap.sessions
        span = f"{sessions[0]} to {sessions[-1]}" if len(sessions) else "no sessions"
        meta["note"] = (
            f"no session of the data set from {plan.start} to {plan.end} (it covers {span})"
        )
    return meta


def series_answer(
    request: Any,
    snap: Snapshot,
    fmt: str,
    plan: SeriesPlan,
    columns: Mapping[str, str],
    *,
    canonical: Mapping[str, Any],
    years: int | None,
    filename: str,
    extra: Callable[[], dict[str, Any]] | None = None,
    csv_comment: bool = False,
    fresh: bool = False,
) -> Response:
    """A series answer in the negotiated `fmt`; `extra()` adds top-level keys to the JSON
    envelope only, `csv_comment` a lineage comment line to a CSV answer."""
    comment = csv_comment and fmt == CSV

    def envelope() -> dict[str, Any]:
        json = fmt in (JSON, JSON_COLUMNS)
        added: dict[str, Any] = extra() if extra is not None and json else {}
        if comment:
            added["csv_comment"] = True
        return {**added, "meta": series_meta(snap, plan, years), "_metadata": snap.metadata()}

    return answer(
        request,
        fmt,
        version=snap.version,
        canonical=[*canonical.items(), ("csv_comment", comment)],
        headers={**snap_headers(snap), "Vary": "Accept"},
        make=lambda: plan.columns(snap, columns),
        envelope=envelope,
        filename=safe_filename(filename),
        fresh=fresh,
    )

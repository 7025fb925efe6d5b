"""Sizes of answers: the units a price multiplies, rows and approximate bytes.

An endpoint sizes the plan its route answers from (`Endpoint.size`), so the charge of a call and
`/api/estimate` count the same rows and the same units.
"""

from __future__ import annotations

from dataclasses import dataclass

from eqrisk.api.plans import SeriesPlan


@dataclass(frozen=True)
class Size:
    units: int  # what the price multiplies: 1 per call, succeeded tickers for batch
    rows: int
    bytes: int
    note: str = ""


ONE_CALL = Size(1, 0, 0)  # an endpoint that is not sized: one unit, nothing estimated


def approx_bytes(rows: int, n_float: int, fmt: str, n_text: int = 1) -> int:
    """Approximate body size: JSON ~32 bytes a number, CSV ~20, Parquet ~8 (compressed)."""
    per_cell = {"json": 32, "csv": 20, "parquet": 8}[fmt]
    overhead = {"json": 600, "csv": 400, "parquet": 2500}[fmt]
    return overhead + rows * (n_float * per_cell + n_text * (per_cell + 2))


def series_size(plan: SeriesPlan, ncols: int, fmt: str | None) -> Size:
    """One call returning the plan's rows with `ncols` numbers each."""
    return Size(1, plan.rows, approx_bytes(plan.rows, ncols, fmt or "json"))

"""What a provider's answer may hold (issue 33): its documented shape, checked before any value
is used, and the values a day's bar can have, checked before anything is written.

A refused answer is a `ProviderError` that names the provider, the symbol and the first
problem; the fetch ends and writes nothing (the data set is not touched by a fetch at all).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import date
from typing import Any

import numpy as np
import pandas as pd

from eqrisk.data.providers import ProviderError

# Unix seconds of the days a bar may have (1900-01-01 .. 2200-01-01).
MIN_STAMP, MAX_STAMP = -2_208_988_800, 7_258_118_400
_FIX = "nothing written; try again later, or point EQRISK_PROVIDER_URLS at the provider itself"


def refused(name: str, symbol: str, problem: str) -> ProviderError:
    return ProviderError(f"{name} answered {symbol} with {problem}: refused, {_FIX}")


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_stamp(value: Any) -> bool:
    return (
        isinstance(value, int) and not isinstance(value, bool) and MIN_STAMP <= value <= MAX_STAMP
    )


def number_list_problem(values: Any, length: int, what: str) -> str | None:
    """Why `values` is not a list of `length` numbers or nulls, or None."""
    if values is None:
        return None
    if not isinstance(values, list):
        return f"{what} that is {type(values).__name__}, not a list"
    if len(values) != length:
        return f"{len(values)} {what} values for {length} days (a length mismatch)"
    bad = next((v for v in values if v is not None and not is_number(v)), None)
    return None if bad is None else f"a {what} value that is not a number ({bad!r:.40})"


def _bad_days(frame: pd.DataFrame, mask: np.ndarray) -> str:
    days = frame.loc[mask, "date"].dt.strftime("%Y-%m-%d").tolist()
    return ", ".join(days[:3]) + (f" and {len(days) - 3} more" if len(days) > 3 else "")


def _value_problems(frame: pd.DataFrame, max_price: float) -> list[tuple[str, np.ndarray]]:
    """(what, the rows where it is impossible), for each column of a bar frame."""
    problems = []
    with np.errstate(invalid="ignore"):
        for column in ("open", "high", "low", "close", "adjusted_close"):
            values = frame[column].to_numpy(dtype=float)
            present = ~np.isnan(values)
            bad = present & (~np.isfinite(values) | (values <= 0) | (values > max_price))
            problems.append((f"an impossible {column} (not in (0, {max_price:g}])", bad))
        volume = frame["volume"].to_numpy(dtype=float)
        problems.append(
            ("a negative or infinite volume", ~np.isnan(volume) & ~(volume >= 0) | np.isinf(volume))
        )
        split = frame["split_coefficient"].to_numpy(dtype=float)
        problems.append(
            (
                "an impossible split ratio (0/0, zero, negative or infinite)",
                ~(np.isfinite(split) & (split > 0)),
            )
        )
        cash = frame["dividend_amount"].to_numpy(dtype=float)
        problems.append(("an impossible dividend", ~(np.isfinite(cash) & (cash >= 0))))
    return problems


def checked_bars(
    frame: pd.DataFrame, name: str, symbol: str, window: tuple[date, date], max_price: float
) -> pd.DataFrame:
    """The bars, when every day is inside the asked `window` and every value is possible: a
    price finite, positive and at most `max_price`; volume and dividend finite and not
    negative; a split ratio finite and positive. Else ProviderError naming the symbol."""
    start, end = (pd.Timestamp(d) for d in window)
    dates = frame["date"]
    outside = ((dates < start) | (dates > end)).to_numpy()
    if outside.any():
        return_problem = (
            f"days outside the asked {start:%Y-%m-%d}..{end:%Y-%m-%d} ({_bad_days(frame, outside)})"
        )
        raise refused(name, symbol, return_problem)
    if dates.duplicated().any():
        raise refused(
            name, symbol, f"a day given twice ({_bad_days(frame, dates.duplicated().to_numpy())})"
        )
    for what, bad in _value_problems(frame, max_price):
        if bad.any():
            raise refused(name, symbol, f"{what} on {_bad_days(frame, bad)}")
    return frame


def split_ratio(numerator: Any, denominator: Any) -> float | None:
    """numerator / denominator of a split event, None when either is not a positive finite
    number (a 0/0 split)."""
    parts: Sequence[Any] = (numerator, denominator)
    if not all(is_number(p) and math.isfinite(p) and p > 0 for p in parts):
        return None
    return float(numerator) / float(denominator)

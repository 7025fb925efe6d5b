"""NYSE sessions (exchange_calendars' XNYS), the only dates eqrisk stores."""

from __future__ import annotations

import warnings
from datetime import date
from functools import lru_cache

import exchange_calendars as xcals
import numpy as np
import pandas as pd

# What `sessions_between` takes as a bound: anything pandas reads as one day.
DateLike = str | date | np.datetime64 | pd.Timestamp


@lru_cache(maxsize=1)
def nyse() -> xcals.ExchangeCalendar:
    # exchange_calendars 4.x reads tz-aware Series.values while building the calendar, which
    # pandas 3 deprecates; the result is correct, so the warning is silenced at this one call.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return xcals.get_calendar("XNYS", start="1990-01-02")


def sessions_between(start: DateLike, end: DateLike) -> pd.DatetimeIndex:
    """NYSE sessions from `start` to `end` inclusive, as tz-naive midnight timestamps."""
    cal = nyse()
    lo = max(pd.Timestamp(start).normalize(), cal.first_session)
    hi = min(pd.Timestamp(end).normalize(), cal.last_session)
    return pd.DatetimeIndex(cal.sessions_in_range(lo, hi)).tz_localize(None)


def is_session(dates: pd.Series) -> pd.Series:
    """Boolean mask: which of `dates` (datetime64) are NYSE sessions."""
    dates = pd.to_datetime(dates).dt.normalize()
    if dates.empty:
        return pd.Series([], dtype=bool, index=dates.index)
    sessions = sessions_between(dates.min(), dates.max())
    return dates.isin(sessions)

"""NYSE sessions (exchange_calendars' XNYS), the only dates eqrisk stores.

Building the calendar takes most of a second (and importing exchange_calendars a fifth more),
once a process; the daily job needs only its list of sessions. A command that knows its home
points `use_cache` at a folder (the setting `calendar_cache`): the sessions list is then kept
there in one small file per exchange_calendars version and day (the calendar's default end is
a year after the day it is built) and read back by the day's later processes, the calendar
built only when no such file is there. The answers are the calendar's either way."""

from __future__ import annotations

import os
import warnings
from datetime import date
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    import exchange_calendars as xcals

# What `sessions_between` takes as a bound: anything pandas reads as one day.
DateLike = str | date | np.datetime64 | pd.Timestamp
FIRST = "1990-01-02"  # the calendar's first session asked for
_PREFIX = "xnys-sessions-"
_cache: list[Path | None] = [None]  # the folder `use_cache` gave (None: no cached list)


@lru_cache(maxsize=1)
def nyse() -> xcals.ExchangeCalendar:
    import exchange_calendars as xcals

    # exchange_calendars 4.x reads tz-aware Series.values while building the calendar, which
    # pandas 3 deprecates; the result is correct, so the warning is silenced at this one call.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return xcals.get_calendar("XNYS", start=FIRST)


def use_cache(folder: Path | None) -> None:
    """Keep the sessions list in `folder` (None: build the calendar in each process)."""
    if folder == _cache[0]:
        return
    _cache[0] = folder
    _sessions.cache_clear()


def _cache_file(folder: Path) -> Path:
    """The file of today's list: the calendar's version and the day it ends a year after (its
    default end is a year after the local day it is built on)."""
    version = metadata.version("exchange_calendars")
    return folder / f"{_PREFIX}{version}-{pd.Timestamp.now().floor('D').date()}.npy"


@lru_cache(maxsize=1)
def _sessions() -> np.ndarray:
    """Every session of the calendar (datetime64[ns], sorted): the cached list when there is
    one, else the calendar's (and then cached, when a folder is set)."""
    folder = _cache[0]
    path = _cache_file(folder) if folder is not None else None
    if path is not None:
        try:
            kept: np.ndarray = np.load(path, allow_pickle=False)
            if kept.dtype == np.dtype("datetime64[ns]") and kept.ndim == 1 and len(kept):
                return kept
        except (OSError, ValueError):
            pass
    sessions = np.asarray(nyse().sessions.tz_localize(None).to_numpy(), dtype="datetime64[ns]")
    if path is not None and path == _cache_file(path.parent) == _built_on(path.parent):
        _keep(path, sessions)  # (not a calendar built the day before, near midnight)
    return sessions


def _built_on(folder: Path) -> Path | None:
    """The file of the day the calendar's default end was set on (when exchange_calendars was
    imported: a year before it); None when this version does not say."""
    from exchange_calendars import exchange_calendar

    end = getattr(exchange_calendar, "GLOBAL_DEFAULT_END", None)
    if not isinstance(end, pd.Timestamp):
        return None
    day = (end - pd.DateOffset(years=1)).date()
    return folder / f"{_PREFIX}{metadata.version('exchange_calendars')}-{day}.npy"


def _keep(path: Path, sessions: np.ndarray) -> None:
    """Write the list (atomically) and remove the older days' lists; a folder that cannot be
    written is only not a cache."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with tmp.open("wb") as fh:
            np.save(fh, sessions, allow_pickle=False)
        os.replace(tmp, path)
        for old in path.parent.glob(f"{_PREFIX}*.npy"):
            if old != path:
                old.unlink(missing_ok=True)
    except OSError:
        pass


def sessions_between(start: DateLike, end: DateLike) -> pd.DatetimeIndex:
    """NYSE sessions from `start` to `end` inclusive, as tz-naive midnight timestamps."""
    days = _sessions()
    first, last = pd.Timestamp(days[0]), pd.Timestamp(days[-1])
    lo = max(pd.Timestamp(start).normalize(), first)
    hi = min(pd.Timestamp(end).normalize(), last)
    if lo > last or hi < first:  # out of the calendar's range: its own answer (an error)
        cal = nyse()
        return pd.DatetimeIndex(cal.sessions_in_range(lo, hi)).tz_localize(None)
    i = int(np.searchsorted(days, lo.to_datetime64(), side="left"))
    j = int(np.searchsorted(days, hi.to_datetime64(), side="right"))
    return pd.DatetimeIndex(days[i:j])


def is_session(dates: pd.Series) -> pd.Series:
    """Boolean mask: which of `dates` (datetime64) are NYSE sessions."""
    dates = pd.to_datetime(dates).dt.normalize()
    if dates.empty:
        return pd.Series([], dtype=bool, index=dates.index)
    sessions = sessions_between(dates.min(), dates.max())
    return dates.isin(sessions)

"""The NYSE sessions list kept between processes (`calendar.use_cache`): the same answers as the
calendar's own, one file a day in the folder, read back by the next process, and a damaged
or unwritable cache only not a cache."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from eqrisk.data import calendar

BOUNDS = [
    ("2020-01-01", "2020-03-31"),
    ("1985-06-01", "1990-01-10"),  # before the calendar's first session: clipped
    ("2024-12-20", "2025-01-10"),  # a day of mourning (2025-01-09) and the year's turn
    ("2026-01-16", "2026-01-16"),
    ("2026-01-17", "2026-01-18"),  # a weekend: none
    (pd.Timestamp("2021-11-24 15:30"), np.datetime64("2021-11-30")),
]


@pytest.fixture
def cached(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "cache"
    calendar.use_cache(folder)
    yield folder
    calendar.use_cache(None)


def _calendars(start: calendar.DateLike, end: calendar.DateLike) -> pd.DatetimeIndex:
    cal = calendar.nyse()
    lo = max(pd.Timestamp(start).normalize(), cal.first_session)
    hi = min(pd.Timestamp(end).normalize(), cal.last_session)
    return pd.DatetimeIndex(cal.sessions_in_range(lo, hi)).tz_localize(None)


@pytest.mark.parametrize(("start", "end"), BOUNDS)
def test_the_cached_list_answers_as_the_calendar(
    cached: Path, start: calendar.DateLike, end: calendar.DateLike
) -> None:
    got = calendar.sessions_between(start, end)
    want = _calendars(start, end)
    assert got.equals(want) and got.dtype == want.dtype == np.dtype("datetime64[ns]")
    (kept,) = cached.glob("xnys-sessions-*.npy")
    assert np.array_equal(np.load(kept), calendar.nyse().sessions.tz_localize(None).to_numpy())


def test_out_of_range_is_the_calendars_error(cached: Path) -> None:
    with pytest.raises(ValueError, match="last session"):
        calendar.sessions_between("2200-01-01", "2200-02-01")


def test_a_later_process_reads_the_list_without_building_the_calendar(cached: Path) -> None:
    calendar.sessions_between("2020-01-01", "2020-01-31")  # writes the day's file
    probe = (
        "import sys; from pathlib import Path; from eqrisk.data import calendar; "
        "calendar.use_cache(Path(sys.argv[1])); "
        "print(len(calendar.sessions_between('2020-01-01', '2020-01-31')), "
        "'exchange_calendars' in sys.modules)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe, str(cached)], capture_output=True, text=True, timeout=120,
        env={**os.environ},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["21", "False"]


def test_a_damaged_file_is_rebuilt_and_an_old_days_removed(cached: Path) -> None:
    cached.mkdir(parents=True)
    old = cached / "xnys-sessions-0.0-2000-01-01.npy"
    old.write_bytes(b"old")
    today = calendar._cache_file(cached)
    today.write_bytes(b"not an array")
    assert len(calendar.sessions_between("2020-01-01", "2020-01-31")) == 21
    assert not old.exists() and np.load(today).dtype == np.dtype("datetime64[ns]")


def test_an_unwritable_folder_is_no_cache(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file, not a folder")
    calendar.use_cache(blocker / "cache")
    try:
        assert calendar.sessions_between("2020-01-01", "2020-01-31").equals(
            _calendars("2020-01-01", "2020-01-31")
        )
    finally:
        calendar.use_cache(None)

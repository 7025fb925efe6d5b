"""The panel's fill: each price row's session column found by a table of the calendar days the
sessions span, against numpy's binary search and a pandas pivot."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from eqrisk.data.calendar import sessions_between
from eqrisk.data.panel import Cells, fill_rows, session_columns


def _sessions(lo: str, hi: str) -> np.ndarray:
    return sessions_between(pd.Timestamp(lo), pd.Timestamp(hi)).to_numpy().astype("datetime64[D]")


def test_each_day_gets_its_session_column_and_every_other_day_none() -> None:
    """Every calendar day from before the first session to after the last (weekends, holidays,
    out of range, NaT): the column numpy's searchsorted finds where the day is a session, -1
    where it is not; a piece of sessions only takes the one-gather path."""
    sessions = _sessions("2019-12-20", "2021-01-08")
    days = np.arange(np.datetime64("2019-11-01"), np.datetime64("2021-03-01"))
    days = np.concatenate([days, np.array(["NaT", "1990-01-01", "2030-01-01"], "datetime64[D]")])
    cols = session_columns(sessions)(days)
    at = np.searchsorted(sessions, days)
    found = at < len(sessions)
    found[found] = sessions[at[found]] == days[found]
    np.testing.assert_array_equal(cols, np.where(found, at, -1))
    assert found.sum() == len(sessions) and (cols == -1).sum() == len(days) - len(sessions)
    shuffled = np.random.default_rng(3).permutation(sessions)
    np.testing.assert_array_equal(
        session_columns(sessions)(shuffled), np.searchsorted(sessions, shuffled)
    )
    assert session_columns(sessions[:0])(days[:4]).tolist() == [-1] * 4
    assert session_columns(sessions)(days[:0]).shape == (0,)


def test_fill_rows_puts_each_value_in_its_cell_and_names_a_day_that_is_no_session() -> None:
    sessions = _sessions("2020-03-02", "2020-03-31")
    rng = np.random.default_rng(5)
    frame = pd.DataFrame(
        [
            (s, d, rng.normal())
            for s in ("AAA", "BBB", "CCC")
            for d in sessions
            if rng.random() < 0.7
        ],
        columns=["symbol", "date", "close"],
    )
    arrays = fill_rows(
        [Cells.of(frame)], np.array(["AAA", "BBB", "CCC"], object), sessions, ("close",)
    )
    pivot = frame.pivot(index="symbol", columns="date", values="close")
    expected = pivot.reindex(columns=pd.DatetimeIndex(sessions)).to_numpy()
    np.testing.assert_array_equal(arrays["close"], expected)
    weekend = pd.concat(
        [frame, pd.DataFrame({"symbol": ["AAA"], "date": ["2020-03-07"], "close": [1.0]})]
    )
    with pytest.raises(ValueError, match=r"not NYSE sessions: \['2020-03-07'\]"):
        fill_rows(
            [Cells.of(weekend)], np.array(["AAA", "BBB", "CCC"], object), sessions, ("close",)
        )

"""One date format per file: day-first, dotted, compact and ISO files are read at their true
dates; ambiguous and mixed files are refused naming the formats, and `--date-format` reads them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from eqrisk.data import ingested as store
from eqrisk.data.corporate_actions import read_actions
from eqrisk.data.dates import DateFormatError, parse_date_values
from eqrisk.data.ingest import ingest
from eqrisk.data.ingest_report import IngestError
from eqrisk.data.price_files import read_prices

# True sessions of January 2019 (NYSE), the independent truth every layout must give back.
SESSIONS = pd.bdate_range("2019-01-02", "2019-01-31").difference(
    pd.to_datetime(["2019-01-21"])  # Martin Luther King Jr. Day
)


def _long_file(path: Path, fmt: str, days: pd.DatetimeIndex = SESSIONS) -> Path:
    lines = ["date,symbol,close"]
    lines += [f"{d.strftime(fmt)},AAPL,{100 + i}" for i, d in enumerate(days)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    ("fmt", "name"),
    [
        ("%d/%m/%Y", "day_first"),
        ("%d.%m.%Y", "dotted"),
        ("%m/%d/%Y", "month_first"),
        ("%Y%m%d", "compact"),
        ("%Y-%m-%d", "iso"),
        ("%d-%b-%Y", "month_name"),
        ("%d %B %Y", "long_month_name"),
        ("%m/%d/%y", "two_digit_year"),
    ],
)
def test_each_layout_is_read_at_its_true_dates(tmp_path: Path, fmt: str, name: str) -> None:
    frame = read_prices(_long_file(tmp_path / f"{name}.csv", fmt))
    assert list(frame["date"]) == list(SESSIONS)
    assert list(frame["close"]) == [100.0 + i for i in range(len(SESSIONS))]
    assert frame["bad_cells"].isna().all()


def test_a_day_first_file_is_never_shifted_by_ingest(tmp_path: Path) -> None:
    # 02/01/2019 .. 31/01/2019: per-row parsing read 02/01 as 1 February.
    home = tmp_path / "home"
    report = ingest([_long_file(tmp_path / "aapl.csv", "%d/%m/%Y")], None, home=home)
    assert report.rows_rejected == 0
    prices, _, _ = store.read_ingested(home)
    got = pd.to_datetime(prices["date"])
    assert list(got) == list(SESSIONS)
    assert report.first_date == "2019-01-02" and report.last_date == "2019-01-31"


def test_an_ambiguous_file_is_refused_then_read_with_the_stated_format(tmp_path: Path) -> None:
    # Every day <= 12: 02/01/2019 .. 11/01/2019 reads both ways, at different dates.
    days = SESSIONS[SESSIONS.day <= 11]
    path = _long_file(tmp_path / "ambiguous.csv", "%d/%m/%Y", days)
    with pytest.raises(DateFormatError) as err:
        read_prices(path)
    message = str(err.value)
    assert "ambiguous" in message and "--date-format" in message
    assert "MM/DD/YYYY" in message and "DD/MM/YYYY" in message
    home = tmp_path / "home"
    with pytest.raises(IngestError):
        ingest([path], None, home=home)
    assert not store.ingested_dir(home).exists()  # nothing written
    ingest([path], None, home=home, date_format="DD/MM/YYYY")
    prices, _, _ = store.read_ingested(home)
    assert list(pd.to_datetime(prices["date"])) == list(days)
    # A strptime pattern states it as well.
    frame = read_prices(path, date_format="%d/%m/%Y")
    assert list(frame["date"]) == list(days)


def test_a_mixed_file_is_refused_naming_the_formats(tmp_path: Path) -> None:
    path = tmp_path / "mixed.csv"
    path.write_text(
        "date,symbol,close\n2019-01-02,AAPL,1\n2019-01-03,AAPL,2\n04/01/2019,AAPL,3\n"
        "13/01/2019,AAPL,4\n"
    )
    with pytest.raises(DateFormatError) as err:
        read_prices(path)
    message = str(err.value)
    assert "mix" in message and "YYYY-MM-DD (2 values" in message
    assert "DD/MM/YYYY (2 values" in message and "--date-format" in message
    # Stated: the rows of the other format are bad dates (rejected), never moved.
    frame = read_prices(path, date_format="YYYY-MM-DD")
    assert list(frame["date"][:2]) == list(pd.to_datetime(["2019-01-02", "2019-01-03"]))
    assert frame["date"][2:].isna().all()
    assert [b["date"] for b in frame["bad_cells"][2:]] == ["04/01/2019", "13/01/2019"]


def test_day_first_and_month_first_in_one_file_are_mixed() -> None:
    with pytest.raises(DateFormatError, match=r"DD/MM/YYYY.*MM/DD/YYYY|MM/DD/YYYY.*DD/MM/YYYY"):
        parse_date_values(["13/01/2019", "01/14/2019"])


def test_wide_file_dates_and_time_suffixes() -> None:
    got = parse_date_values(
        ["2019-01-02 00:00:00", "2019-01-03T16:00:00-05:00", "", "n/a", "2019-01-04 09:30Z"]
    )
    want = pd.to_datetime(["2019-01-02", "2019-01-03", None, None, "2019-01-04"])
    assert list(pd.DatetimeIndex(got)[[0, 1, 4]]) == list(want[[0, 1, 4]])
    assert pd.isna(got[2]) and pd.isna(got[3])


def test_an_unreadable_value_is_a_bad_date_not_a_refusal(tmp_path: Path) -> None:
    path = tmp_path / "wide.csv"
    path.write_text("date,AAPL,MSFT\n02/01/2019,1,2\n14/01/2019,3,4\nsoon,5,6\n")
    frame = read_prices(path)
    for symbol in ("AAPL", "MSFT"):
        dates = frame.loc[frame["symbol"] == symbol, "date"]
        assert list(dates[:2]) == list(pd.to_datetime(["2019-01-02", "2019-01-14"]))
        assert dates[2:].isna().all()


def test_an_unknown_format_name_is_refused() -> None:
    with pytest.raises(IngestError, match="DD/MM/YYYY"):
        parse_date_values(["02/01/2019"], "day-month")


def test_a_corporate_actions_file_is_read_with_one_format(tmp_path: Path) -> None:
    path = tmp_path / "actions.csv"
    path.write_text("symbol,date,split\nAAPL,09/06/2014,7\nTSLA,31/08/2020,5\n")
    actions = read_actions(path)
    assert list(actions["date"]) == list(pd.to_datetime(["2014-06-09", "2020-08-31"]))


def test_the_ingest_command_states_the_format(tmp_path: Path) -> None:
    days = SESSIONS[SESSIONS.day <= 11]
    path = _long_file(tmp_path / "day_first.csv", "%d/%m/%Y", days)
    env = {**os.environ, "EQRISK_HOME": str(tmp_path / "home")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "eqrisk.cli", "ingest", str(path), *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)

    refused = run()
    assert refused.returncode == 1
    assert "--date-format" in refused.stdout + refused.stderr
    done = run("--date-format", "DD/MM/YYYY")
    assert done.returncode == 0, done.stdout + done.stderr
    prices, _, _ = store.read_ingested(tmp_path / "home")
    assert list(pd.to_datetime(prices["date"])) == list(days)

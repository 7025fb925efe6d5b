"""Prices that cannot be prices are rejected and reported; files are read in bounded memory (a
line or a cell past its limit is an error at once, without reading the file whole)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from eqrisk.data import ingested as store
from eqrisk.data.cells import InputLimits
from eqrisk.data.ingest import ingest
from eqrisk.data.ingest_report import IngestError, IngestReport
from eqrisk.data.price_files import read_prices
from eqrisk.settings import Settings

ABSURD = """date,symbol,close
2019-01-02,AAPL,100
2019-01-03,AAPL,1e308
2019-01-04,AAPL,101
2019-01-07,AAPL,1e-300
2019-01-08,AAPL,inf
2019-01-09,AAPL,102
2019-01-10,AAPL,0.00005
2019-01-11,AAPL,20000000
2019-01-14,AAPL,103
"""


def _issue(report: IngestReport, code: str) -> dict:
    found = [i for i in report.issues if i["code"] == code]
    assert len(found) == 1, [i["code"] for i in report.issues]
    return found[0]


def test_the_limits_default_to_the_settings() -> None:
    settings = Settings()
    assert InputLimits() == InputLimits(
        settings.min_price, settings.max_price, settings.max_line_bytes, settings.max_cell_bytes
    )
    assert (settings.min_price, settings.max_price) == (1e-4, 1e7)


def test_absurd_prices_are_rejected_counted_and_listed(tmp_path: Path) -> None:
    path = tmp_path / "absurd.csv"
    path.write_text(ABSURD)
    home = tmp_path / "home"
    report = ingest([path], None, home=home, replace=True, skip_bad_rows=True)
    out_of_range = _issue(report, "PRICE_OUT_OF_RANGE")
    assert out_of_range["count"] == 4
    assert "[0.0001, 1e+07]" in out_of_range["message"]
    assert [e["date"] for e in out_of_range["examples"]] == [
        "2019-01-03",
        "2019-01-07",
        "2019-01-10",
        "2019-01-11",
    ]
    assert out_of_range["examples"][0]["value"] == "close=1e+308"
    assert _issue(report, "NON_NUMERIC_PRICE")["count"] == 1  # inf: not a finite number
    assert report.rows_kept == 4 and report.rows_rejected == 5
    prices, _, _ = store.read_ingested(home)
    assert list(prices["close"]) == [100.0, 101.0, 102.0, 103.0]
    rejected = pd.read_csv(Path(report.report_dir) / "rejected.csv", dtype=str)
    by_reason = rejected.groupby("reason")["date"].apply(list).to_dict()
    assert by_reason["PRICE_OUT_OF_RANGE"] == [
        "2019-01-03",
        "2019-01-07",
        "2019-01-10",
        "2019-01-11",
    ]
    assert by_reason["NON_NUMERIC_PRICE"] == ["2019-01-08"]


def test_the_bounds_are_settable(tmp_path: Path) -> None:
    path = tmp_path / "absurd.csv"
    path.write_text(ABSURD)
    limits = InputLimits(min_price=1e-5, max_price=1e8)
    report = ingest(
        [path], None, home=tmp_path / "home", replace=True, limits=limits, skip_bad_rows=True
    )
    assert _issue(report, "PRICE_OUT_OF_RANGE")["count"] == 2  # 1e308 and 1e-300 only
    prices, _, _ = store.read_ingested(tmp_path / "home")
    assert list(prices["close"]) == [100.0, 101.0, 102.0, 0.00005, 20000000.0, 103.0]


def test_the_ingest_command_takes_the_bounds(tmp_path: Path) -> None:
    path = tmp_path / "absurd.csv"
    path.write_text(ABSURD)
    env = {**os.environ, "EQRISK_HOME": str(tmp_path / "home")}
    command = [sys.executable, "-m", "eqrisk.cli", "ingest", str(path), "--replace", "--json"]
    command.append("--skip-bad-rows")
    done = subprocess.run(
        [*command, "--min-price", "1e-5", "--max-price", "1e8"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(done.stdout)
    counts = {i["code"]: i["count"] for i in report["issues"]}
    assert counts["PRICE_OUT_OF_RANGE"] == 2
    assert report["rows_kept"] == 6


def test_a_long_cell_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "cell.csv"
    path.write_text("date,symbol,close\n2019-01-02,AAPL,1\n2019-01-03," + "A" * 70_000 + ",2\n")
    with pytest.raises(IngestError, match=r"column 'symbol', data row 2 .*max_cell_bytes"):
        read_prices(path)


# Reads a file that must fail, in a fresh interpreter: the growth of its peak resident memory
# (ru_maxrss, after a warm-up read) and the peak of Python's own allocations (tracemalloc).
_PROBE = """
import json, resource, sys, tracemalloc
from pathlib import Path
from eqrisk.data.ingest_report import IngestError
from eqrisk.data.price_files import read_prices
read_prices(Path(sys.argv[2]))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tracemalloc.start()
try:
    read_prices(Path(sys.argv[1]))
    message = None
except IngestError as exc:
    message = str(exc)
peak = tracemalloc.get_traced_memory()[1]
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"message": message, "rss_kib": after - before, "py_peak": peak}), flush=True)
# Exit without running Arrow's static destructors: a read that failed on its first block may
# leave a readahead thread decompressing the rest, and on a loaded machine its destruction at
# exit aborted the interpreter once after the figures were printed; the figures are the test.
import os
os._exit(0)
"""


def _probe(path: Path, small: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(path), str(small)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("where", ["header", "data", "gzip"])
def test_a_file_without_newlines_fails_in_bounded_memory(tmp_path: Path, where: str) -> None:
    small = tmp_path / "small.csv"
    small.write_text("date,symbol,close\n2019-01-02,AAPL,1\n")
    if where == "gzip":  # 256 MB of one line, 250 KB on disk
        path = tmp_path / "bomb.csv.gz"
        with gzip.open(path, "wb", compresslevel=1) as fh:
            fh.write(b"date,symbol,close\n2019-01-02,AAPL,")
            chunk = b"1" * 2**20
            for _ in range(256):
                fh.write(chunk)
        size = 256 * 2**20
    else:  # 48 MB without a newline: as the header, or after one good line
        path = tmp_path / f"{where}.csv"
        head = b"" if where == "header" else b"date,symbol,close\n2019-01-02,AAPL,1\n"
        with path.open("wb") as fh:
            fh.write(head + b"date,")
            chunk = b"9" * 2**20
            for _ in range(48):
                fh.write(chunk)
        size = 48 * 2**20
    got = _probe(path, small)
    path.unlink()
    assert got["message"] is not None and "longer than 1,048,576 bytes" in got["message"]
    assert "max_line_bytes" in got["message"]
    # Reading the line whole would take at least its size; the read stops after a block.
    assert got["rss_kib"] * 1024 < size / 4, got
    assert got["py_peak"] < 8 * 2**20, got

"""The column-at-a-time writers against what answers were before them: orjson over a list of
row dicts (JSON) and pyarrow's CSV writer (CSV), on every tabular route of both services and on
generated columns. JSON must be the same bytes; CSV the same cells, numbers the same float64."""

from __future__ import annotations

import csv
import datetime as dt
import io
import math
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from eqrisk.api import formats, writers
from eqrisk.api.app import create_app
from helpers import TEST_KEY, bearer

Columns = Mapping[str, Sequence[Any] | np.ndarray]


# ------------------------------------------------------------------------------ references


def reference_json(columns: Columns, envelope: Mapping[str, Any] | None = None) -> bytes:
    """The JSON renderer as it was: a dict per row, handed to orjson."""
    names = list(columns)
    lists = [c.tolist() if isinstance(c, np.ndarray) else list(c) for c in columns.values()]
    rows = [dict(zip(names, values, strict=True)) for values in zip(*lists, strict=True)]
    doc = rows if envelope is None else {"data": rows, **envelope}
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)


def reference_csv(columns: Columns) -> bytes:
    """The CSV renderer as it was: the columns typed for Arrow, pyarrow's CSV writer."""
    arrays = {}
    for name, col in columns.items():
        if isinstance(col, np.ndarray) and col.dtype.kind == "f":
            arrays[name] = pa.array(col, type=pa.float64(), mask=np.isnan(col))
        elif isinstance(col, np.ndarray) and col.dtype.kind == "M":
            arrays[name] = pa.array(col.astype("datetime64[D]"), type=pa.date32())
        else:
            arrays[name] = pa.array(col.tolist() if isinstance(col, np.ndarray) else list(col))
    sink = io.BytesIO()
    pacsv.write_csv(pa.table(arrays), sink, pacsv.WriteOptions(quoting_style="needed"))
    return sink.getvalue()


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


def same_cell(old: str, new: str) -> bool:
    """The same text, or two numbers that parse to the identical float64 (only where the
    exponent notation starts may differ: pyarrow wrote 1e+10 and 0.000001)."""
    if old == new:
        return True
    try:
        return bits(float(old)) == bits(float(new))
    except ValueError:
        return False


def assert_same_csv(old: bytes, new: bytes) -> None:
    old_rows = list(csv.reader(io.StringIO(old.decode())))
    new_rows = list(csv.reader(io.StringIO(new.decode())))
    assert len(old_rows) == len(new_rows)
    assert old_rows[:1] == new_rows[:1]  # the header, byte for byte
    for a, b in zip(old_rows, new_rows, strict=True):
        assert len(a) == len(b)
        bad = [(x, y) for x, y in zip(a, b, strict=True) if not same_cell(x, y)]
        assert not bad, bad[:3]


# ------------------------------------------------------------------------------ every route


@pytest.fixture(scope="module")
def rendered(demo_settings) -> list[tuple[str, str, dict[str, Any], Any]]:
    """(path, format, columns, envelope) of every answer the renderers wrote while the tabular
    routes of both services answered (the columns as the routes hand them over)."""
    seen: list[tuple[str, str, dict[str, Any], Any]] = []
    originals = dict(formats.RENDERERS)
    current = {"path": ""}

    def spy(fmt: str) -> formats.Renderer:
        def renderer(columns: Any, envelope: Any, filename: str) -> tuple[bytes, dict[str, str]]:
            seen.append((current["path"], fmt, dict(columns), envelope))
            return originals[fmt](columns, envelope, filename)

        return renderer

    client = TestClient(create_app(demo_settings.model_copy(update={"render_cache_mb": 0})))
    a, b = {"apikey": TEST_KEY}, bearer(TEST_KEY)
    formats.RENDERERS.update({fmt: spy(fmt) for fmt in originals})
    try:
        for fmt in ("json", "csv"):
            gets = [
                (f"/api/ticker-returns?ticker=NVDA&years=5&format={fmt}", b),
                (f"/api/ticker-returns?ticker=SPY&years=2&format={fmt}", b),
                (f"/api/returns?ticker=AAPL&years=3&format={fmt}", b),
                (f"/api/etf-returns?ticker=XLK&years=1&format={fmt}", b),
                (f"/api/l3-decomposition?ticker=MSFT&years=2&format={fmt}", b),
                (f"/daily?symbols=NVDA,DST,TAIS&start_time=2019-01-01&format={fmt}", a),
                (f"/betas?symbols=NVDA,SPY&fact=Mkt&start_time=2020-01-01&format={fmt}", a),
                (f"/facts?fact=Energy&start_time=2020-01-01&format={fmt}", a),
                (f"/gross?symbols=AAPL,DST&start_time=2020-01-01&format={fmt}", a),
                (f"/resids?symbols=AAPL&start_time=2020-01-01&format={fmt}", a),
            ]
            for path, headers in gets:
                current["path"] = path
                assert client.get(path, headers=headers).status_code == 200, path
        current["path"] = "/symbol_list?format=csv"
        assert client.get(current["path"], headers=a).status_code == 200
        current["path"] = "/api/batch/analyze csv"
        body = {"tickers": ["NVDA", "SPY", "NOPE"], "years": 2, "format": "csv"}
        assert client.post("/api/batch/analyze", json=body, headers=b).status_code == 200
    finally:
        formats.RENDERERS.update(originals)
    return seen


def test_every_tabular_route_was_rendered(rendered) -> None:
    paths = {(path.split("?")[0], fmt) for path, fmt, _, _ in rendered}
    routes = ["/api/ticker-returns", "/api/returns", "/api/etf-returns", "/api/l3-decomposition"]
    routes += ["/daily", "/betas", "/facts", "/gross", "/resids"]
    assert {(r, f) for r in routes for f in ("json", "csv")} <= paths
    assert ("/symbol_list", "csv") in paths and ("/api/batch/analyze csv", "csv") in paths
    assert sum(len(next(iter(cols.values()))) for _, _, cols, _ in rendered) > 10_000


def test_json_answers_are_the_bytes_of_a_row_dict_per_row(rendered) -> None:
    for path, fmt, columns, envelope in rendered:
        if fmt != "json":
            continue
        body, _ = formats.RENDERERS["json"](columns, envelope, "x")
        assert body == reference_json(columns, envelope), path


def test_csv_answers_hold_the_cells_pyarrow_wrote(rendered) -> None:
    for path, fmt, columns, envelope in rendered:
        if fmt != "csv":
            continue
        body, _ = formats.RENDERERS["csv"](columns, envelope, "x")
        comment = b""
        if body.startswith(b"#"):  # the lineage line of csv_comment, then the table
            comment, body = body.split(b"\n", 1)
        assert not comment or comment.startswith(b"# model_version="), path
        assert_same_csv(reference_csv(columns), body)


def test_column_json_holds_the_values_of_the_rows(rendered) -> None:
    for path, fmt, columns, envelope in rendered:
        if fmt != "json":
            continue
        rows_doc = orjson.loads(reference_json(columns, envelope))
        cols_doc = orjson.loads(formats.RENDERERS[formats.JSON_COLUMNS](columns, envelope, "x")[0])
        rows = rows_doc if envelope is None else rows_doc.pop("data")
        cols = cols_doc if envelope is None else cols_doc.pop("data")
        assert list(cols) == list(columns), path
        for name, values in cols.items():
            assert values == [r[name] for r in rows], (path, name)
        if envelope is not None:
            assert cols_doc == rows_doc  # the envelope is the same


# ------------------------------------------------------------------------------ generated values

EDGE_FLOATS = [
    0.0,
    -0.0,
    5e-324,  # the smallest subnormal
    -2.2250738585072014e-308,  # the smallest normal, negative
    2.225073858507201e-308,  # the largest subnormal
    1.7976931348623157e308,
    1e-7,
    1e-5,
    1e15,
    1e16,
    1e21,
    1e22,
    0.1,
    1 / 3,
    123456789012345680.0,
    math.nan,
    math.inf,
    -math.inf,
]
floats = st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True)


@given(st.lists(floats, min_size=0, max_size=60), st.lists(floats, min_size=60, max_size=60))
@settings(max_examples=300, deadline=None)
def test_floats_are_written_exactly_as_orjson_writes_them(xs: list[float], ys: list[float]) -> None:
    values = (xs + EDGE_FLOATS)[:60]
    columns = {"x": np.array(values, dtype=np.float64), "y": np.array(ys[: len(values)])}
    body = writers.json_rows(columns)
    assert body == reference_json(columns)
    for row, x in zip(orjson.loads(body), values, strict=True):
        if math.isfinite(x):
            assert bits(row["x"]) == bits(x)  # the identical float64, -0.0 included
        else:
            assert row["x"] is None
    lines = writers.csv_rows(columns).decode().splitlines()
    assert lines[0] == '"x","y"' and len(lines) == len(values) + 1
    for line, x in zip(lines[1:], values, strict=True):
        cell = line.split(",")[0]
        if math.isnan(x):
            assert cell == ""
        else:
            assert bits(float(cell)) == bits(x)  # inf and -inf as pyarrow wrote them
    assert_same_csv(reference_csv(columns), writers.csv_rows(columns))


texts = st.one_of(st.none(), st.text(max_size=12))


@given(st.lists(texts, min_size=1, max_size=40))
@settings(max_examples=200, deadline=None)
def test_text_is_escaped_as_orjson_and_quoted_as_pyarrow_did(values: list[str | None]) -> None:
    columns = {"name": values, "code": np.array(values, dtype=object), "n": np.arange(len(values))}
    assert writers.json_rows(columns) == reference_json(columns)
    if any(v is not None for v in values):  # pyarrow types an all-null column as null
        assert writers.csv_rows(columns) == reference_csv(columns)


def test_dates_datetimes_integers_and_bools_as_before() -> None:
    day = np.array(["2024-01-02", "NaT", "2024-02-29"], dtype="datetime64[D]")
    columns: dict[str, Any] = {
        "day": day,
        "second": np.array(["2024-01-02T09:30:00", "NaT", "2024-02-29"], dtype="datetime64[s]"),
        "date": [dt.date(2024, 1, 2), None, dt.date(2024, 2, 29)],
        "stamp": [dt.datetime(2024, 1, 2, 9, 30), None, dt.datetime(2024, 2, 29)],
        "small": np.array([1, -2, 3], dtype=np.int8),
        "big": np.array([2**63 - 1, 0, -(2**63)]),
        "flag": np.array([True, False, True]),
        "half": np.array([0.1, np.nan, 3.0], dtype=np.float32),  # through tolist, as before
        "strided": np.arange(6.0)[::2],
        "unicode": np.array(["a", "b,c", ""]),
    }
    assert writers.json_rows(columns) == reference_json(columns)
    assert writers.csv_rows(columns) == reference_csv(columns)
    assert orjson.loads(writers.json_rows(columns))[0]["day"] == "2024-01-02"
    assert writers.csv_rows(columns).splitlines()[1].startswith(b"2024-01-02,2024-01-02,")


def test_empty_tables_and_envelopes() -> None:
    empty = {"date": np.array([], dtype="datetime64[D]"), "x": np.array([])}
    assert writers.json_rows(empty) == b"[]" == reference_json(empty)
    assert writers.csv_rows(empty) == reference_csv(empty) == b'"date","x"\n'
    assert writers.json_columns(empty) == b'{"date":[],"x":[]}'
    envelope = {"meta": {"rows": 0}, "_metadata": {"model_version": "v1"}}
    body, _ = formats.RENDERERS["json"](empty, envelope, "x")
    assert (
        body
        == reference_json(empty, envelope)
        == b'{"data":[],"meta":{"rows":0},' + (b'"_metadata":{"model_version":"v1"}}')
    )
    assert formats.RENDERERS["json"](empty, {}, "x")[0] == b'{"data":[]}'
    with pytest.raises(ValueError, match="different lengths"):
        writers.json_rows({"a": [1, 2], "b": [1]})


# ------------------------------------------------------------------------------ over HTTP


def test_column_layout_is_asked_for_with_its_media_type(demo_settings) -> None:
    client = TestClient(create_app(demo_settings))
    columns_type = {"Accept": formats.COLUMNS_MEDIA_TYPE}
    path = "/api/ticker-returns?ticker=NVDA&years=3"
    rows = client.get(path, headers=bearer(TEST_KEY))
    cols = client.get(path, headers={**bearer(TEST_KEY), **columns_type})
    assert rows.headers["content-type"] == "application/json"
    assert cols.headers["content-type"] == formats.COLUMNS_MEDIA_TYPE
    assert rows.headers["etag"] != cols.headers["etag"]
    by_row, by_column = rows.json(), cols.json()
    data = by_column.pop("data")
    assert by_column == {k: v for k, v in by_row.items() if k != "data"}  # meta, asset_type...
    assert len(data["date"]) == by_row["meta"]["rows"] > 700
    for name, values in data.items():
        assert values == [r[name] for r in by_row["data"]]
    assert len(cols.content) < 0.75 * len(rows.content)

    daily = "/daily?symbols=NVDA,AAPL&start_time=2023-01-01&fields=close,volume,sector"
    records = client.get(daily, headers={"apikey": TEST_KEY}).json()
    arrays = client.get(daily, headers={"apikey": TEST_KEY, **columns_type}).json()
    assert list(arrays) == ["symbol", "teo", "close", "volume", "sector"]
    assert arrays == {k: [r[k] for r in records] for k in arrays}
    # An explicit format wins over Accept, as for the other media types.
    explicit = client.get(path + "&format=json", headers={**bearer(TEST_KEY), **columns_type})
    assert explicit.content == rows.content


# ------------------------------------------------------------------------------ repeated values
# Dates and text are formatted once per distinct value (codes into a dictionary); numbers are
# cut out of orjson's array text by the layout kernel, eight bytes at a time.

pool_texts = st.sampled_from(["AAPL", "NVDA", 'say "hi"', "a,b", "line\nbreak", "", "é", "x\\y"])
pool_dates = st.sampled_from([dt.date(2024, 1, 2), dt.date(1999, 12, 31), dt.date(2024, 2, 29)])


@given(
    st.lists(st.one_of(st.none(), pool_texts), min_size=1, max_size=80),
    st.lists(st.one_of(st.none(), pool_dates), min_size=80, max_size=80),
    st.lists(st.integers(-3, 3), min_size=80, max_size=80),
)
@settings(max_examples=150, deadline=None)
def test_repeated_text_and_dates_are_written_as_each_row_alone(
    texts: list[str | None], dates: list[dt.date | None], days: list[int]
) -> None:
    n = len(texts)
    stamps = np.datetime64("2024-03-01") + np.array(days[:n])
    stamps[::7] = np.datetime64("NaT")
    columns: dict[str, Any] = {
        "symbol": np.array(texts, dtype=object),
        "listed": texts,
        "day": dates[:n],
        "stamp": stamps,
        "second": stamps.astype("datetime64[s]"),
        "x": np.linspace(-1.5, 1e17, n),
    }
    assert writers.json_rows(columns) == reference_json(columns)
    if any(t is not None for t in texts) and any(d is not None for d in dates[:n]):
        assert_same_csv(reference_csv(columns), writers.csv_rows(columns))
        del columns["x"]  # without the exponent notation of large numbers: the same bytes
        assert writers.csv_rows(columns) == reference_csv(columns)


def test_values_a_hash_table_would_merge_keep_their_own_text() -> None:
    """1, 1.0 and True are one key to a hash table; a str column with NaN and None is not
    merged with anything else; a date and the datetime of its midnight stay apart."""
    mixed = [1, 1.0, True, "1", None, 1, True, 1.0]
    nulls = np.array(["a", None, np.nan, "a", None], dtype=object)
    days = [dt.date(2024, 1, 2), dt.datetime(2024, 1, 2), dt.date(2024, 1, 2), None]
    for columns in ({"m": mixed}, {"n": nulls}, {"d": days}):
        assert writers.json_rows(columns) == reference_json(columns)
    assert writers.json_rows({"m": mixed}) == (
        b'[{"m":1},{"m":1.0},{"m":true},{"m":"1"},{"m":null},{"m":1},{"m":true},{"m":1.0}]'
    )
    assert writers.csv_rows({"n": nulls}) == b'"n"\n"a"\n\n\n"a"\n\n'


@pytest.mark.parametrize("width", [3, 7, 8, 9, 15, 16, 17, 23, 24])
def test_cells_of_every_width_around_the_eight_byte_words(width: int) -> None:
    """Number cells end anywhere in a word: 3 to 24 bytes (-2.2250738585072014e-308 is 24),
    next to text cells of every length, over many rows; infinities in CSV as pyarrow wrote
    them, next to NaN."""
    by_width = {
        3: 7.0, 7: 12345.5, 8: 123456.5, 9: 1234567.5, 15: 0.1234567890123, 16: 0.12345678901234,
        17: 0.123456789012345, 23: -2.225073858507201e-308, 24: -2.2250738585072014e-308,
    }  # fmt: skip
    x = np.full(40, by_width[width])
    x[3], x[5], x[7] = np.inf, np.nan, -np.inf
    text = np.array(["t" * (k % 19) for k in range(40)], dtype=object)
    columns = {"x": x, "text": text, "n": np.arange(40) * 10 ** min(width, 17), "y": x[::-1].copy()}
    assert writers.json_rows(columns) == reference_json(columns)
    assert_same_csv(reference_csv(columns), writers.csv_rows(columns))
    lines = writers.csv_rows(columns).decode().splitlines()
    assert [lines[k].split(",")[0] for k in (4, 6, 8)] == ["inf", "", "-inf"]  # rows 3, 5, 7
    assert len(orjson.dumps(by_width[width])) == width


@given(
    st.lists(
        st.tuples(st.one_of(st.none(), pool_texts, st.just(math.nan)), st.integers(1, 400)),
        min_size=1,
        max_size=12,
    )
)
@settings(max_examples=60, deadline=None)
def test_columns_in_runs_are_coded_by_their_runs(runs: list[tuple[Any, int]]) -> None:
    """A symbol or a sector repeats in runs along a multi-symbol answer: the runs' first
    values are coded; the answer is the same as a cell at a time."""
    values = [v for v, length in runs for _ in range(length)]
    n = len(values)
    columns: dict[str, Any] = {
        "symbol": np.array(values, dtype=object),
        "day": [dt.date(2020, 1, 1) + dt.timedelta(days=k // 7) for k in range(n)],
        "x": np.arange(n) / 8,
    }
    assert writers.json_rows(columns) == reference_json(columns)
    if any(isinstance(v, str) for v in values) and not any(isinstance(v, float) for v in values):
        assert writers.csv_rows(columns) == reference_csv(columns)  # (pyarrow refuses NaN in text)


def test_runs_of_values_a_hash_table_would_merge_keep_their_own_text() -> None:
    mixed = np.array([1] * 600 + [1.0] * 600 + [True] * 600 + ["1"] * 600, dtype=object)
    assert writers.json_rows({"m": mixed}) == reference_json({"m": mixed})
    dates = [dt.date(2024, 1, 2)] * 900 + [dt.datetime(2024, 1, 2)] * 900
    assert writers.json_rows({"d": dates}) == reference_json({"d": dates})

"""The shared renderers and the render cache."""

from __future__ import annotations

import io

import numpy as np
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from starlette.responses import Response

from eqrisk.api.formats import CSV, JSON, PARQUET, RenderCache, render, rows_of


@pytest.fixture()
def columns() -> dict:
    return {
        "date": np.array(["2024-01-02", "2024-01-03", "2024-01-04"]),
        "x": np.array([0.1, np.nan, -2.5]),
        "name": ["Apple, Inc.", 'say "hi"', None],
    }


def test_nan_is_null_in_every_format(columns) -> None:
    assert rows_of(columns)[1]["x"] != rows_of(columns)[1]["x"]  # NaN before JSON encoding
    body = render(JSON, columns).body
    assert body.startswith(b'[{"date":"2024-01-02","x":0.1,"name":"Apple, Inc."}')
    assert b'"x":null' in body
    table = pq.read_table(io.BytesIO(render(PARQUET, columns).body))
    assert table.column("x").to_pylist() == [0.1, None, -2.5]
    csv = pacsv.read_csv(
        io.BytesIO(render(CSV, columns).body),
        convert_options=pacsv.ConvertOptions(strings_can_be_null=True),
    )
    assert csv.column("x").to_pylist() == [0.1, None, -2.5]
    assert csv.column("name").to_pylist() == ["Apple, Inc.", 'say "hi"', None]


def test_envelope_and_attachment_names(columns) -> None:
    resp = render(JSON, columns, envelope={"meta": {"rows": 3}})
    assert resp.body.startswith(b'{"data":[') and b'"meta":{"rows":3}' in resp.body
    csv = render(CSV, columns, filename="NVDA_returns")
    assert csv.headers["content-disposition"] == 'attachment; filename="NVDA_returns.csv"'
    assert csv.media_type == "text/csv; charset=utf-8"


def test_render_cache_is_lru_and_bounded_in_bytes() -> None:
    cache = RenderCache(max_bytes=400)
    for key in "abc":
        cache.put(key, Response(b"x" * 100, media_type="text/csv", headers={"ETag": key}))
    assert cache.get("a").body == b"x" * 100  # a is now the most recent
    cache.put("d", Response(b"y" * 100))
    cache.put("e", Response(b"z" * 100))  # over 400 bytes: b (least recent) goes
    assert cache.get("b") is None
    assert cache.get("a") is not None and cache.get("e").body == b"z" * 100
    cache.put("big", Response(b"q" * 200))  # more than a quarter of the budget: not kept
    assert cache.get("big") is None
    cache.put("err", Response(b"e", status_code=404))
    assert cache.get("err") is None
    assert cache.get("a").headers["etag"] == "a"

"""The shared renderers and the render cache."""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import Callable

import anyio
import httpx
import numpy as np
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from starlette.responses import Response

from eqrisk.api.errors import ApiError, install_error_handlers
from eqrisk.api.formats import (
    CSV,
    JSON,
    PARQUET,
    RenderCache,
    cached,
    etag_for,
    render,
    rows_of,
)


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


# ------------------------------------------------------------------------------ off the loop


ENVELOPE = {"meta": {"rows": 3}}
HEADERS = {"X-Model-Version": "v1"}


def _app(columns: dict, make_hook: Callable[[], None]) -> FastAPI:
    """The real helpers (`cached`, `render`, the error handlers) behind a one-table route."""
    app = FastAPI()
    app.state.render_cache = RenderCache(2**20)
    install_error_handlers(app)

    @app.get("/table")
    async def table(request: Request, fmt: str = JSON) -> Response:
        def make() -> Response:
            make_hook()
            return render(fmt, columns, envelope=ENVELOPE, headers=HEADERS, filename="t")

        return cached(request, etag_for("v1", fmt), HEADERS, make)

    @app.get("/health")
    async def health() -> Response:
        return Response(b"ok")

    return app


def test_cached_renders_in_a_worker_thread_with_identical_bytes(columns) -> None:
    threads: list[tuple[int, bool]] = []

    def hook() -> None:
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        threads.append((threading.get_ident(), on_loop))

    client = TestClient(_app(columns, hook))
    for fmt in (JSON, CSV, PARQUET):
        direct = render(fmt, columns, envelope=ENVELOPE, headers=HEADERS, filename="t")
        first = client.get(f"/table?fmt={fmt}")
        again = client.get(f"/table?fmt={fmt}")  # from the render cache: not rendered again
        assert first.status_code == again.status_code == 200
        assert first.content == again.content == bytes(direct.body)
        assert first.headers["content-type"] == again.headers["content-type"] == direct.media_type
        assert first.headers["etag"] == again.headers["etag"] == etag_for("v1", fmt)
        assert first.headers["x-model-version"] == "v1"
        if fmt != JSON:
            assert first.headers["content-disposition"] == direct.headers["content-disposition"]
        not_modified = client.get(
            f"/table?fmt={fmt}", headers={"If-None-Match": first.headers["etag"]}
        )
        assert not_modified.status_code == 304
    assert len(threads) == 3  # one rendering per format; hits and 304s render nothing
    assert not any(on_loop for _, on_loop in threads)


def test_an_error_while_rendering_is_still_a_problem_response(columns) -> None:
    def hook() -> None:
        raise ApiError("TICKER_NOT_FOUND", "no prices in that range")

    resp = TestClient(_app(columns, hook)).get("/table")
    assert resp.status_code == 404 and resp.json()["error"] == "TICKER_NOT_FOUND"


@pytest.mark.anyio
async def test_a_slow_rendering_does_not_hold_up_other_requests(columns) -> None:
    """The rendering starts, then waits until /health has been answered: rendered on the event
    loop, it would block the loop, /health could never answer, and the wait would run out."""
    rendering, answered = threading.Event(), threading.Event()
    waited: list[bool] = []

    def hook() -> None:
        rendering.set()
        waited.append(answered.wait(timeout=20))

    transport = httpx.ASGITransport(app=_app(columns, hook))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        table: list[httpx.Response] = []

        async def get_table() -> None:
            table.append(await client.get("/table"))

        async def health() -> None:
            while not rendering.is_set():
                await anyio.sleep(0.01)
            assert (await client.get("/health")).content == b"ok"
            answered.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(get_table)
            tg.start_soon(health)
    assert waited == [True]
    assert table[0].status_code == 200 and table[0].json()["meta"] == {"rows": 3}


def test_large_answers_render_in_the_render_pool_small_ones_beside_it(monkeypatch) -> None:
    """An answer of LARGE_CELLS cells or more waits for the app's render pool (one thread: at
    most one rendering competes with the event loop for the GIL); a small one renders in the
    worker thread that serves it, never behind the large ones."""
    from concurrent.futures import ThreadPoolExecutor

    from eqrisk.api import formats

    app = FastAPI()
    app.state.render_pool = ThreadPoolExecutor(1, thread_name_prefix="render-test")
    rendered_in: dict[int, str] = {}
    json_renderer = formats.RENDERERS[JSON]

    def spy(columns, envelope, filename):  # type: ignore[no-untyped-def]
        rendered_in[len(columns["x"])] = threading.current_thread().name
        return json_renderer(columns, envelope, filename)

    monkeypatch.setitem(formats.RENDERERS, JSON, spy)

    @app.get("/rows/{n}")
    async def rows(request: Request, n: int) -> Response:
        def make() -> dict:
            return {"x": np.arange(n, dtype=np.float64)}

        return formats.answer(
            request, JSON, version="v1", canonical=[("n", n)], headers={}, make=make
        )

    client = TestClient(app)
    big, small = formats.LARGE_CELLS, formats.LARGE_CELLS - 1
    for n in (big, small):
        resp = client.get(f"/rows/{n}")
        assert resp.status_code == 200 and len(resp.json()) == n
        assert resp.json()[-1] == {"x": float(n - 1)}
    assert rendered_in[big].startswith("render-test")
    assert not rendered_in[small].startswith("render-test")
    app.state.render_pool.shutdown()

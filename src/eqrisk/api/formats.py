"""Output formats: one renderer per format, shared by every route of both services.

A route hands over its rows as columns (`Columns`: name -> numpy array or list, all the same
length) plus the envelope parts; the renderer picked by the request writes the body.
- JSON: the values as orjson writes them; NaN becomes null. Service B wraps rows as
  `{data, meta, _metadata}`. Opt-in, `Accept: application/vnd.eqrisk.columns+json`:
  `{name: [values]}` in place of the rows.
- CSV: a header row, the same columns; empty cell = null; `text/csv; charset=utf-8`.
- Parquet: the same columns typed (date32, float64, string); `application/vnd.apache.parquet`.
JSON and CSV are written a column at a time by `writers` (no Python object per row).

Rendering a large answer takes long enough to stall every other request of the worker if it
runs on the event loop, so `cached` renders a cache miss in a worker thread, when the answer
is sent (`DeferredResponse`); 304s and cache hits, which render nothing, stay on the loop.
Large answers queue for the app's render pool (one thread by default), so that at most that
many renderings compete with the event loop for the GIL. A large body goes to the server in
pieces (`PiecewiseResponse`), so the event loop never spends one long step writing megabytes.
"""

from __future__ import annotations

import hashlib
import io
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from typing import Any

import anyio
import numpy as np
import orjson
import pyarrow.parquet as pq
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from eqrisk.api import writers
from eqrisk.api.errors import ApiError

Columns = writers.Columns

JSON, CSV, PARQUET = "json", "csv", "parquet"
# JSON with the rows as parallel arrays, asked for with its media type in Accept (opt-in: the
# specification and the real service's readers fix the row layout of the plain JSON answers).
JSON_COLUMNS = "json-columns"
COLUMNS_MEDIA_TYPE = "application/vnd.eqrisk.columns+json"
# From this many cells (rows x columns, ~1 ms of rendering) an answer renders in the app's
# render pool, not in the thread that serves it (docs/decisions/serving.md).
LARGE_CELLS = 20_000
MEDIA_TYPES = {
    JSON: "application/json",
    JSON_COLUMNS: COLUMNS_MEDIA_TYPE,
    CSV: "text/csv; charset=utf-8",
    PARQUET: "application/vnd.apache.parquet",
}
_ACCEPT = {
    "application/json": JSON,
    COLUMNS_MEDIA_TYPE: JSON_COLUMNS,
    "text/csv": CSV,
    "application/vnd.apache.parquet": PARQUET,
    "application/x-parquet": PARQUET,
    "application/parquet": PARQUET,
}


def negotiate(request: Request, fmt: str | None, allowed: Sequence[str]) -> str:
    """The format of an answer: the `format` parameter, else the Accept header, else JSON.
    Where JSON is allowed, Accept may ask for its column layout (`JSON_COLUMNS`)."""
    if fmt is not None:
        value = fmt.strip().lower()
        if value not in allowed:
            raise ApiError(
                "INVALID_PARAMETER",
                f"format {fmt!r} is not supported here; accepted: {', '.join(allowed)}",
                parameter="format",
                accepted=list(allowed),
            )
        return value
    accept = request.headers.get("accept", "")
    for part in accept.split(","):
        media = part.split(";")[0].strip().lower()
        wanted = _ACCEPT.get(media)
        if wanted in allowed or (wanted == JSON_COLUMNS and JSON in allowed):
            return str(wanted)
    return JSON


def rows_of(columns: Columns) -> list[dict[str, Any]]:
    """Column arrays -> list of row dicts with plain Python values (NaN stays float NaN), for
    small answers built as documents (and the reference the writers are checked against)."""
    names = list(columns)
    lists = [c.tolist() if isinstance(c, np.ndarray) else list(c) for c in columns.values()]
    return [dict(zip(names, values, strict=True)) for values in zip(*lists, strict=True)]


def dumps(doc: Any) -> bytes:
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)


def cells_of(columns: Columns) -> int:
    """Rows x columns: what rendering an answer costs, roughly."""
    return sum(len(col) for col in columns.values())


Renderer = Callable[[Columns, Mapping[str, Any] | None, str], tuple[bytes, dict[str, str]]]


def _enveloped(
    write: Callable[..., bytes], columns: Columns, envelope: Mapping[str, Any] | None
) -> bytes:
    """`{"data": <written>, **envelope}` as orjson writes that dict, without building it: the
    writer puts the envelope's text around the data it writes (no copy of a large body)."""
    if envelope is None:
        return write(columns)
    if "data" in envelope:  # the envelope's data replaces the rows, as in {"data": rows, **env}
        return dumps({"data": None, **envelope})
    rest = dumps(dict(envelope))
    suffix = b"," + rest[1:] if envelope else b"}"
    return write(columns, prefix=b'{"data":', suffix=suffix)


def _render_json(
    columns: Columns, envelope: Mapping[str, Any] | None, filename: str
) -> tuple[bytes, dict[str, str]]:
    """`{data: rows, **envelope}`; without an envelope a bare array of rows (Service A)."""
    return _enveloped(writers.json_rows, columns, envelope), {}


def _render_json_columns(
    columns: Columns, envelope: Mapping[str, Any] | None, filename: str
) -> tuple[bytes, dict[str, str]]:
    """The opt-in column layout (`COLUMNS_MEDIA_TYPE`): `data` (or the bare answer) is one
    object of parallel arrays `{name: [values]}`, the values written as in the rows."""
    return _enveloped(writers.json_columns, columns, envelope), {}


def _render_csv(
    columns: Columns, envelope: Mapping[str, Any] | None, filename: str
) -> tuple[bytes, dict[str, str]]:
    """A header row, then the rows (the envelope travels in headers), after one comment line
    with the lineage when the envelope asks for it (`csv_comment`)."""
    lineage = _lineage(envelope)
    comment = b""
    if (envelope or {}).get("csv_comment") and lineage:
        line = ", ".join(f"{k}={v}" for k, v in lineage.items())
        comment = f"# {line}\n".encode()
    body = writers.csv_rows(columns, prefix=comment)
    return body, {"Content-Disposition": f'attachment; filename="{filename}.csv"'}


def _lineage(envelope: Mapping[str, Any] | None) -> dict[str, str]:
    """model_version and data_as_of of the answering snapshot, from the envelope's
    `_metadata` (the file carries them too, not only the headers)."""
    meta = (envelope or {}).get("_metadata") or {}
    return {k: str(meta[k]) for k in ("model_version", "data_as_of") if meta.get(k) is not None}


def _render_parquet(
    columns: Columns, envelope: Mapping[str, Any] | None, filename: str
) -> tuple[bytes, dict[str, str]]:
    """The rows as one Parquet table, snappy-compressed."""
    sink = io.BytesIO()
    table = writers.arrow_table(columns)
    lineage = _lineage(envelope)
    if lineage:
        table = table.replace_schema_metadata({k.encode(): v.encode() for k, v in lineage.items()})
    # Dictionary encoding of float columns costs more than it saves on returns and ratios.
    pq.write_table(table, sink, compression="snappy", use_dictionary=False)
    disposition = f'attachment; filename="{filename}.parquet"'
    return sink.getvalue(), {"Content-Disposition": disposition}


# Format -> renderer: a new layout (column JSON, Arrow) is one function and one entry here.
RENDERERS: dict[str, Renderer] = {
    JSON: _render_json,
    JSON_COLUMNS: _render_json_columns,
    CSV: _render_csv,
    PARQUET: _render_parquet,
}


# Bytes per ASGI body message of a large answer: one socket write of about a tenth of a
# millisecond, after which the event loop may serve other connections.
SEND_PIECE = 256 * 1024


class PiecewiseResponse(Response):
    """A response whose body is sent in pieces of `SEND_PIECE` bytes, with a turn of the event
    loop between two pieces. A multi-megabyte body sent whole is one socket write with the GIL
    held (uvloop tries the write at once), and the loop serves nothing else meanwhile; in
    pieces, another request (`/api/health`) waits at most for one piece. Content-Length is
    the whole body's, as before."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = self.body
        if len(body) <= SEND_PIECE:
            await super().__call__(scope, receive, send)
            return
        start = {"type": "http.response.start", "status": self.status_code}
        await send({**start, "headers": self.raw_headers})
        for at in range(0, len(body), SEND_PIECE):
            more = at + SEND_PIECE < len(body)
            piece = bytes(body[at : at + SEND_PIECE])
            await send({"type": "http.response.body", "body": piece, "more_body": more})
            if more:
                await anyio.sleep(0)
        if self.background is not None:
            await self.background()


def render(
    fmt: str,
    columns: Columns,
    *,
    envelope: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
    filename: str = "data",
) -> Response:
    """One response in `fmt` (a key of `RENDERERS`; `negotiate` admits no other). CSV and
    Parquet carry rows only, as an attachment."""
    body, extra = RENDERERS[fmt](columns, envelope, filename)
    headers = {**(headers or {}), **extra}
    return PiecewiseResponse(body, media_type=MEDIA_TYPES[fmt], headers=headers)


def answer(
    request: Request,
    fmt: str,
    *,
    version: str,
    canonical: Iterable[tuple[str, Any]],
    headers: Mapping[str, str],
    make: Callable[[], Columns],
    envelope: Callable[[], Mapping[str, Any]] | None = None,
    filename: str = "data",
    fresh: bool = False,
) -> Response:
    """The one answer path of both services, after `negotiate` chose `fmt`: the canonical
    query names the ETag (version, path, query, format), then 304, the cached body, or the
    columns `make()` rendered off the event loop (and cached). `fresh` (nocache): always
    rendered anew, never a 304 or a cached body. A large answer (`LARGE_CELLS`) waits for the
    app's render pool: a few threads at most compete with the event loop for the GIL."""
    query = "&".join(f"{k}={v}" for k, v in sorted(canonical))
    etag = etag_for(version, request.url.path, query, fmt)

    pool: Executor | None = getattr(request.app.state, "render_pool", None)

    def rendered() -> Response:
        cols = make()
        doc = envelope() if envelope is not None else None

        def draw() -> Response:
            return render(fmt, cols, envelope=doc, headers=headers, filename=filename)

        if pool is not None and cells_of(cols) >= LARGE_CELLS:
            return pool.submit(draw).result()
        return draw()

    return cached(request, etag, headers, rendered, fresh=fresh)


def json_response(
    doc: Any, *, status_code: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    """A plain JSON document (non-tabular answers: metrics, tickers, estimate, balance...)."""
    return Response(
        dumps(doc),
        status_code=status_code,
        media_type=MEDIA_TYPES[JSON],
        headers=dict(headers or {}),
    )


class RenderCache:
    """Rendered answers by ETag, per process, least recently used out first, bounded in bytes.

    A snapshot never changes and an ETag names (version, route, canonical query, format), so a
    cached body is valid until its version is no longer served; nothing needs invalidating.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, tuple[bytes, str, dict[str, str]]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> Response | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
        body, media_type, headers = item
        return PiecewiseResponse(body, media_type=media_type, headers=headers)

    def put(self, key: str, response: Response) -> None:
        body = bytes(response.body)
        if response.status_code != 200 or len(body) > self.max_bytes // 4:
            return
        headers = {
            k: v for k, v in response.headers.items() if k not in ("content-length", "content-type")
        }
        with self._lock:
            if key in self._items:
                return
            self._items[key] = (body, response.media_type or "", headers)
            self._bytes += len(body)
            while self._bytes > self.max_bytes and self._items:
                _, (old, _, _) = self._items.popitem(last=False)
                self._bytes -= len(old)


class DeferredResponse(Response):
    """An answer rendered when it is sent: `make()` runs in a worker thread (anyio's pool, the
    one sync routes use), then the rendered response is cached under `etag` and sent. An
    ApiError from `make()` still reaches the error handlers: nothing has been sent yet."""

    def __init__(
        self,
        make: Callable[[], Response],
        *,
        etag: str,
        cache: RenderCache | None,
        headers: Mapping[str, str],
    ) -> None:
        super().__init__(status_code=200, headers=headers)
        self._make = make
        self._etag = etag
        self._cache = cache

    def render_now(self) -> Response:
        """The rendered answer, as `cached` would send it (with its ETag; cached)."""
        response = self._make()
        response.headers["ETag"] = self._etag
        if self._cache is not None:
            self._cache.put(self._etag, response)
        return response

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await anyio.to_thread.run_sync(self.render_now)
        if response.background is None:
            response.background = self.background
        await response(scope, receive, send)


def cached(
    request: Request,
    etag: str,
    headers: Mapping[str, str],
    make: Callable[[], Response],
    *,
    fresh: bool = False,
) -> Response:
    """The answer named by `etag`: 304 when the client has it, the cached body when this process
    rendered it before, else `make()` rendered off the event loop (then cached). `headers` go
    on every one of them. `fresh` skips the 304 and the cached body."""
    out_headers = {**headers, "ETag": etag}
    if not fresh and not_modified(request, etag):
        return Response(status_code=304, headers=out_headers)
    cache: RenderCache | None = getattr(request.app.state, "render_cache", None)
    hit = cache.get(etag) if cache is not None and not fresh else None
    if hit is not None:
        return hit
    return DeferredResponse(make, etag=etag, cache=cache, headers=out_headers)


def etag_for(*parts: object) -> str:
    """A strong validator from the snapshot version and the canonical request."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()[:32]
    return f'"{digest}"'


def not_modified(request: Request, etag: str) -> bool:
    """True when the client's If-None-Match already names this representation."""
    header = request.headers.get("if-none-match")
    if not header:
        return False
    if header.strip() == "*":
        return True
    tags = [t.strip().removeprefix("W/") for t in header.split(",")]
    return etag in tags

"""Output formats: one renderer per format, shared by every route of both services.

A route hands over its rows as columns (`Columns`: name -> numpy array or list, all the same
length) plus the envelope parts; the renderer picked by the request writes the body.
- JSON: orjson; NaN becomes null. Service B wraps rows as `{data, meta, _metadata}`.
- CSV: a header row, the same columns; empty cell = null; `text/csv; charset=utf-8`.
- Parquet: the same columns typed (date32, float64, string); `application/vnd.apache.parquet`.
"""

from __future__ import annotations

import hashlib
import io
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from starlette.requests import Request
from starlette.responses import Response

from eqrisk.api.errors import ApiError

Columns = Mapping[str, Sequence[Any] | np.ndarray]

JSON, CSV, PARQUET = "json", "csv", "parquet"
MEDIA_TYPES = {
    JSON: "application/json",
    CSV: "text/csv; charset=utf-8",
    PARQUET: "application/vnd.apache.parquet",
}
_ACCEPT = {
    "application/json": JSON,
    "text/csv": CSV,
    "application/vnd.apache.parquet": PARQUET,
    "application/x-parquet": PARQUET,
    "application/parquet": PARQUET,
}


def negotiate(request: Request, fmt: str | None, allowed: Sequence[str]) -> str:
    """The format of an answer: the `format` parameter, else the Accept header, else JSON."""
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
        if media in _ACCEPT and _ACCEPT[media] in allowed:
            return _ACCEPT[media]
    return JSON


def rows_of(columns: Columns) -> list[dict[str, Any]]:
    """Column arrays -> list of row dicts with plain Python values (NaN stays float NaN)."""
    names = list(columns)
    lists = [c.tolist() if isinstance(c, np.ndarray) else list(c) for c in columns.values()]
    return [dict(zip(names, values, strict=True)) for values in zip(*lists, strict=True)]


def _arrow(columns: Columns) -> pa.Table:
    arrays = {}
    for name, col in columns.items():
        if isinstance(col, np.ndarray) and col.dtype.kind == "f":
            # NaN -> null through an explicit mask (pyarrow's from_pandas path is ~1000x slower).
            arrays[name] = pa.array(col, type=pa.float64(), mask=np.isnan(col))
        elif isinstance(col, np.ndarray) and col.dtype.kind == "M":
            arrays[name] = pa.array(col.astype("datetime64[D]"), type=pa.date32())
        else:
            arrays[name] = pa.array(col.tolist() if isinstance(col, np.ndarray) else list(col))
    return pa.table(arrays)


def dumps(doc: Any) -> bytes:
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)


def render(
    fmt: str,
    columns: Columns,
    *,
    envelope: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
    filename: str = "data",
) -> Response:
    """One response in `fmt`. JSON with `envelope` = {data: rows, **envelope}; without, a bare
    array of rows (Service A). CSV and Parquet carry rows only, as an attachment."""
    out_headers = dict(headers or {})
    if fmt == JSON:
        rows = rows_of(columns)
        body = dumps({"data": rows, **envelope} if envelope is not None else rows)
    elif fmt == CSV:
        sink = io.BytesIO()
        pacsv.write_csv(_arrow(columns), sink, pacsv.WriteOptions(quoting_style="needed"))
        body = sink.getvalue()
        out_headers["Content-Disposition"] = f'attachment; filename="{filename}.csv"'
    elif fmt == PARQUET:
        sink = io.BytesIO()
        # Dictionary encoding of float columns costs more than it saves on returns and ratios.
        pq.write_table(_arrow(columns), sink, compression="snappy", use_dictionary=False)
        body = sink.getvalue()
        out_headers["Content-Disposition"] = f'attachment; filename="{filename}.parquet"'
    else:  # pragma: no cover - negotiate() admits only the formats above
        raise ValueError(fmt)
    return Response(body, media_type=MEDIA_TYPES[fmt], headers=out_headers)


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
        return Response(body, media_type=media_type, headers=headers)

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


def cached(
    request: Request, etag: str, headers: Mapping[str, str], make: Callable[[], Response]
) -> Response:
    """The answer named by `etag`: 304 when the client has it, the cached body when this process
    rendered it before, else `make()` (then cached). `headers` go on every one of them."""
    out_headers = {**headers, "ETag": etag}
    if not_modified(request, etag):
        return Response(status_code=304, headers=out_headers)
    cache: RenderCache | None = getattr(request.app.state, "render_cache", None)
    hit = cache.get(etag) if cache is not None else None
    if hit is not None:
        return hit
    response = make()
    response.headers["ETag"] = etag
    if cache is not None:
        cache.put(etag, response)
    return response


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

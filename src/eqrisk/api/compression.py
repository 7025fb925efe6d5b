"""Compressed answers: brotli or gzip, negotiated by `Accept-Encoding` (docs/decisions/answers.md).

`Compression` is an ASGI middleware outside the gate: the gate prices, charges and replays the
answer as rendered, and only then are its bytes encoded, so a compressed call is charged what
the same call uncompressed is. It compresses a complete answer (one with a Content-Length) of a
text type (JSON, CSV, HTML, JavaScript...) of at least `MIN_BYTES`, with a status of 200, when
the request accepts br or gzip (q-values honoured; br when both are equally preferred). It
never touches Parquet (already compressed), a problem+json answer, an answer already encoded,
or one streamed without a length. Every answer it may compress carries
`Vary: Accept-Encoding`, compressed or not.

An answer with a strong ETag is a function of its snapshot version and request (the ETags of
both services name version, route, query and format; a static file's names its content), so
its compressed bytes are kept per (ETag, encoding) in a bounded cache and never compressed
twice. A compressed answer's ETag is made weak (`W/"..."`): its bytes differ from the
identity answer's, and If-None-Match compares weakly.
"""

from __future__ import annotations

import asyncio
import gzip
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Executor

import anyio
import brotli  # type: ignore[import-untyped]
from isal import igzip
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MIN_BYTES = 1024  # smaller answers gain nothing worth a header and a compression
CACHE_BYTES = 64 * 2**20  # compressed answers kept, per process
OFF_LOOP_BYTES = 256 * 1024  # larger bodies are compressed in a worker thread (`pool`)
GZIP_LEVEL = 6  # zlib's default
BROTLI_QUALITY = 5  # of 0-11: near gzip -9's ratio, faster than gzip -6 on JSON and CSV
# Larger bodies get fast encoders: on a 50 MB batch answer brotli 5 took 1.43 s of CPU and 1
# took 0.23 s (11.7 -> 12.3 MB); zlib's gzip 6 3.2 s, ISA-L's gzip 2 0.17 s (20.6 -> 21.3 MB),
# so what a large answer costs the server stays near its price (docs/decisions/answers.md).
# From 256 KiB on (the bodies compressed off the loop): on the 1.0 MB answer of a 5,000-position
# portfolio brotli 5 took 20-22 ms of CPU, more than the rest of the call, quality 1 3.2 ms
# (231 kB either way); on the 672 kB answer of a 5,000/5,000 book 3.7 and 0.6 ms (27 -> 37 kB).
FAST_BYTES = 256 * 1024
FAST_GZIP_LEVEL = 2  # of ISA-L's 0-3
FAST_BROTLI_QUALITY = 1
ENCODINGS = ("br", "gzip")  # preferred first when equally acceptable
_TEXT_TYPES = (
    "application/json",
    "application/vnd.eqrisk.columns+json",
    "application/javascript",
    "text/",
    "image/svg+xml",
)
_NEVER = ("application/problem+json", "application/vnd.apache.parquet")


def choose_encoding(accept_encoding: str) -> str | None:
    """The encoding to answer with: the acceptable one of br and gzip with the highest q-value
    (`*` stands for any not named; `x-gzip` is gzip), br on a tie; None for identity."""
    q: dict[str, float] = {}
    for part in accept_encoding.split(","):
        token, _, rest = part.partition(";")
        name = token.strip().lower()
        if not name:
            continue
        value = 1.0
        for param in rest.split(";"):
            key, _, text = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    value = min(max(float(text.strip()), 0.0), 1.0)
                except ValueError:
                    value = 0.0
        name = "gzip" if name == "x-gzip" else name
        q[name] = max(value, q.get(name, 0.0)) if name in q else value
    star = q.get("*", 0.0)
    best, best_q = None, 0.0
    for encoding in ENCODINGS:
        weight = q.get(encoding, star)
        if weight > best_q:
            best, best_q = encoding, weight
    return best


def compress(body: bytes, encoding: str) -> bytes:
    """`body` encoded; the same bytes for the same body (gzip's header carries no time). A body
    of `FAST_BYTES` or more is encoded at the fastest level."""
    fast = len(body) >= FAST_BYTES
    if encoding == "br":
        out: bytes = brotli.compress(body, quality=FAST_BROTLI_QUALITY if fast else BROTLI_QUALITY)
        return out
    if fast:
        return igzip.compress(body, compresslevel=FAST_GZIP_LEVEL, mtime=0)
    return gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0)


class CompressedCache:
    """Compressed bodies by (ETag, encoding), least recently used out first, bounded in bytes."""

    def __init__(self, max_bytes: int = CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0

    def get(self, key: tuple[str, str]) -> bytes | None:
        with self._lock:
            body = self._items.get(key)
            if body is not None:
                self._items.move_to_end(key)
                self.hits += 1
            return body

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def put(self, key: tuple[str, str], body: bytes) -> None:
        if len(body) > self.max_bytes // 4:
            return
        with self._lock:
            if key in self._items:
                return
            self._items[key] = body
            self._bytes += len(body)
            while self._bytes > self.max_bytes and self._items:
                _, old = self._items.popitem(last=False)
                self._bytes -= len(old)


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def _compressible(headers: list[tuple[bytes, bytes]]) -> bool:
    kind = (_header(headers, b"content-type") or b"").decode("latin-1").lower()
    if not kind or any(kind.startswith(t) for t in _NEVER):
        return False
    return any(kind.startswith(t) for t in _TEXT_TYPES)


def _with_vary(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    out, merged = [], False
    for key, value in headers:
        if key.lower() == b"vary" and not merged:
            if b"accept-encoding" not in value.lower():
                value = value + b", Accept-Encoding"
            merged = True
        out.append((key, value))
    if not merged:
        out.append((b"vary", b"Accept-Encoding"))
    return out


def _weak_if_asked(headers: list[tuple[bytes, bytes]], scope: Scope) -> list[tuple[bytes, bytes]]:
    """A 304 for a compressed answer the client holds (it sent the weak tag) names it by the
    tag it was sent with, the weak one."""
    asked = _header(list(scope["headers"]), b"if-none-match") or b""
    out = []
    for key, value in headers:
        if key.lower() == b"etag" and not value.startswith(b"W/") and b"W/" + value in asked:
            value = b"W/" + value
        out.append((key, value))
    return out


class Compression:
    """The ASGI middleware (see the module's docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        min_bytes: int = MIN_BYTES,
        cache: CompressedCache | None = None,
        encoder: Callable[[bytes, str], bytes] = compress,
        pool: Executor | None = None,
    ) -> None:
        self.app = app
        self.min_bytes = min_bytes
        self.cache = cache if cache is not None else CompressedCache()
        self.encoder = encoder
        self.pool = pool  # where large bodies are encoded (None: anyio's worker threads)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] == "HEAD":
            await self.app(scope, receive, send)
            return
        accept = (_header(list(scope["headers"]), b"accept-encoding") or b"").decode("latin-1")
        encoding = choose_encoding(accept)
        start: Message | None = None
        parts: list[bytes] = []

        async def wrapped(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                status = message["status"]
                if status == 304:
                    headers = _with_vary(headers)
                    if encoding is not None:
                        headers = _weak_if_asked(headers, scope)
                    await send({**message, "headers": headers})
                    return
                if not _compressible(headers):
                    await send(message)
                    return
                headers = _with_vary(headers)
                whole = _header(headers, b"content-length") is not None
                encoded = _header(headers, b"content-encoding") is not None
                if status != 200 or encoding is None or encoded or not whole:
                    await send({**message, "headers": headers})
                    return
                start = {**message, "headers": headers}
                return
            if message["type"] != "http.response.body" or start is None:
                await send(message)
                return
            parts.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            await self._finish(start, b"".join(parts), encoding, send)

        await self.app(scope, receive, wrapped)

    async def _off_loop(self, body: bytes, encoding: str) -> bytes:
        if self.pool is None:
            out: bytes = await anyio.to_thread.run_sync(self.encoder, body, encoding)
            return out
        return await asyncio.get_running_loop().run_in_executor(
            self.pool, self.encoder, body, encoding
        )

    async def _finish(self, start: Message, body: bytes, encoding: str | None, send: Send) -> None:
        headers: list[tuple[bytes, bytes]] = start["headers"]
        if encoding is None or len(body) < self.min_bytes:
            await send(start)
            await send({"type": "http.response.body", "body": body})
            return
        etag = _header(headers, b"etag")
        key = (etag.decode("latin-1"), encoding) if etag and not etag.startswith(b"W/") else None
        packed = self.cache.get(key) if key is not None else None
        if packed is None:
            if len(body) >= OFF_LOOP_BYTES:
                packed = await self._off_loop(body, encoding)
            else:
                packed = self.encoder(body, encoding)
            if key is not None:
                self.cache.put(key, packed)
        out = []
        for name, value in headers:
            low = name.lower()
            if low == b"content-length":
                value = str(len(packed)).encode()
            elif low == b"etag" and not value.startswith(b"W/"):
                value = b"W/" + value
            out.append((name, value))
        out.append((b"content-encoding", encoding.encode()))
        await send({**start, "headers": out})
        await send({"type": "http.response.body", "body": packed})

"""Compressed answers: zstd, brotli or gzip, negotiated by `Accept-Encoding`
(docs/decisions/answers.md).

`Compression` is an ASGI middleware outside the gate: the gate prices, charges and replays the
answer as rendered, and only then are its bytes encoded, so a compressed call is charged what
the same call uncompressed is. It compresses a complete answer (one with a Content-Length) of a
text type (JSON, CSV, HTML, JavaScript...) of at least `MIN_BYTES`, with a status of 200, when
the request accepts zstd, br or gzip (q-values honoured; on a tie br for answers under
`FAST_BYTES`, zstd from there on: `choose_encoding`). A request refusing identity
(`identity;q=0`, or `*;q=0` without identity named) gets every compressible answer encoded
whatever its size, and a 406 (free: before the gate) when it accepts none of the three. It
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
import zstandard
from isal import igzip
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from eqrisk.api.bounds import send_problem
from eqrisk.api.errors import ApiError

MIN_BYTES = 1024  # smaller answers gain nothing worth a header and a compression
CACHE_BYTES = 64 * 2**20  # compressed answers kept, per process
OFF_LOOP_BYTES = 256 * 1024  # larger bodies are compressed in a worker thread (`pool`)
GZIP_LEVEL = 6  # zlib's default
BROTLI_QUALITY = 5  # of 0-11: near gzip -9's ratio, faster than gzip -6 on JSON and CSV
# Larger bodies get fast encoders: on a 50 MB batch answer brotli 5 took 1.43 s of CPU and 1
# took 0.23 s (11.7 -> 12.3 MB); zlib's gzip 6 3.2 s, ISA-L's gzip 2 0.17 s (20.6 -> 21.3 MB),
# so what a large answer costs the server stays near its price (docs/decisions/answers.md).
# From 16 KiB on: on the 252 kB answer of a year of `/api/ticker-returns` brotli 5 took 5.7 ms of
# CPU for 62.7 kB, zstd 1 0.5 ms for 61.5 kB; on a 40 kB answer 0.8 and 0.07 ms, with zstd 1's
# body no larger (docs/decisions/answers.md). brotli 5 keeps the smaller bodies under that.
FAST_BYTES = 16 * 1024
FAST_GZIP_LEVEL = 2  # of ISA-L's 0-3
FAST_BROTLI_QUALITY = 1
ZSTD_LEVEL = 3  # zstd's default
FAST_ZSTD_LEVEL = 1
# Preferred first when equally acceptable: brotli's ratio on small answers (its dictionary knows
# JSON's words), zstd's speed and ratio from 16 KiB on (docs/decisions/answers.md has the figures).
ENCODINGS = ("br", "zstd", "gzip")
FAST_ENCODINGS = ("zstd", "br", "gzip")
_TEXT_TYPES = (
    "application/json",
    "application/vnd.eqrisk.columns+json",
    "application/javascript",
    "text/",
    "image/svg+xml",
)
_NEVER = ("application/problem+json", "application/vnd.apache.parquet")


class Accepted:
    """A request's `Accept-Encoding`, read once: the q-value of each coding named (`*` stands
    for any not named; `x-gzip` is gzip). No header accepts identity only."""

    def __init__(self, accept_encoding: str) -> None:
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
            q[name] = max(value, q[name]) if name in q else value
        self.q = q
        star = q.get("*")
        # identity is acceptable unless refused by name, or by `*;q=0` without being named
        self.identity = q.get("identity", 1.0 if star is None or star > 0 else 0.0) > 0

    def weight(self, encoding: str) -> float:
        return self.q.get(encoding, self.q.get("*", 0.0))

    def any(self) -> bool:
        """Some coding this server writes is acceptable."""
        return any(self.weight(e) > 0 for e in ENCODINGS)

    def choose(self, size: int) -> str | None:
        """The acceptable coding with the highest q-value for a body of `size` bytes, ties
        broken by `ENCODINGS` (under `FAST_BYTES`) or `FAST_ENCODINGS`; None for identity."""
        best, best_q = None, 0.0
        for encoding in FAST_ENCODINGS if size >= FAST_BYTES else ENCODINGS:
            weight = self.weight(encoding)
            if weight > best_q:
                best, best_q = encoding, weight
        return best


def choose_encoding(accept_encoding: str, size: int = 0) -> str | None:
    """The encoding to answer a body of `size` bytes with (`Accepted.choose`)."""
    return Accepted(accept_encoding).choose(size)


def _not_acceptable(accept: str) -> ApiError:
    return ApiError(
        "NOT_ACCEPTABLE",
        f"Accept-Encoding {accept!r} refuses identity and accepts none of "
        f"{', '.join(ENCODINGS)}; accepted: any of them, or identity",
        accepted=[*ENCODINGS, "identity"],
    )


def compress(body: bytes, encoding: str) -> bytes:
    """`body` encoded; the same bytes for the same body (gzip's header carries no time). A body
    of `FAST_BYTES` or more is encoded at the fastest level."""
    fast = len(body) >= FAST_BYTES
    if encoding == "zstd":
        # one frame with its content size, no checksum (HTTP's own framing covers transport)
        level = FAST_ZSTD_LEVEL if fast else ZSTD_LEVEL
        return _zstd(level).compress(body)
    if encoding == "br":
        out: bytes = brotli.compress(body, quality=FAST_BROTLI_QUALITY if fast else BROTLI_QUALITY)
        return out
    if fast:
        return igzip.compress(body, compresslevel=FAST_GZIP_LEVEL, mtime=0)
    return gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0)


_ZSTD = threading.local()


def _zstd(level: int) -> zstandard.ZstdCompressor:
    """A compressor per thread and level (a ZstdCompressor must not be shared by threads)."""
    mine: dict[int, zstandard.ZstdCompressor] | None = getattr(_ZSTD, "by_level", None)
    if mine is None:
        mine = _ZSTD.by_level = {}
    out = mine.get(level)
    if out is None:
        out = mine[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return out


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
        accepted = Accepted(accept)
        if not accepted.identity and not accepted.any():
            await send_problem(
                send, _not_acceptable(accept), scope.get("state", {}).get("request_id")
            )
            return
        start: Message | None = None
        encoding: str | None = None
        parts: list[bytes] = []

        async def wrapped(message: Message) -> None:
            nonlocal start, encoding
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                status = message["status"]
                if status == 304:
                    headers = _with_vary(headers)
                    if accepted.any():
                        headers = _weak_if_asked(headers, scope)
                    await send({**message, "headers": headers})
                    return
                if not _compressible(headers):
                    await send(message)
                    return
                headers = _with_vary(headers)
                length = _header(headers, b"content-length")
                encoded = _header(headers, b"content-encoding") is not None
                if length is not None and status == 200 and not encoded:
                    size = int(length)
                    if size >= self.min_bytes or not accepted.identity:
                        encoding = accepted.choose(size)
                if encoding is None:
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
            assert encoding is not None
            await self._finish(start, b"".join(parts), encoding, send)

        await self.app(scope, receive, wrapped)

    async def _off_loop(self, body: bytes, encoding: str) -> bytes:
        if self.pool is None:
            out: bytes = await anyio.to_thread.run_sync(self.encoder, body, encoding)
            return out
        return await asyncio.get_running_loop().run_in_executor(
            self.pool, self.encoder, body, encoding
        )

    async def _finish(self, start: Message, body: bytes, encoding: str, send: Send) -> None:
        headers: list[tuple[bytes, bytes]] = start["headers"]
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

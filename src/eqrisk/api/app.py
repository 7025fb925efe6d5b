"""The ASGI application: Service A (daily stock data, at the root) and Service B (risk metrics,
under /api) over the current snapshot, one error shape, one request id per request, one access
log line per request."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import re
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import unquote_to_bytes

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import eqrisk
from eqrisk.accounts.book import Accounts
from eqrisk.accounts.db import Pool, Timeouts, make_engine
from eqrisk.accounts.doubt import JOURNAL_DIR
from eqrisk.accounts.limits import SQLITE_FILE, FailedKeys, RateLimiter
from eqrisk.accounts.pricing import PriceTable, usd_to_tokens
from eqrisk.accounts.writer import ChargeWriter
from eqrisk.api import dashboard, outages, records, writers
from eqrisk.api.bounds import Bounds
from eqrisk.api.compression import CompressedCache, Compression
from eqrisk.api.deps import served_snapshot
from eqrisk.api.endpoint import register_all
from eqrisk.api.endpoints import ENDPOINTS, ESTIMATED, check_prices, keyed_service
from eqrisk.api.endpoints.signup import self_service
from eqrisk.api.errors import ApiError, install_error_handlers, problem_body
from eqrisk.api.formats import RenderCache
from eqrisk.api.gate import Gate
from eqrisk.api.security import SecurityHeaders, docs_pages
from eqrisk.api.telemetry import Telemetry, metrics_route
from eqrisk.api.work import work_pool
from eqrisk.settings import Settings, get_settings
from eqrisk.snapshot import row_kernel
from eqrisk.snapshot.served import ServedSnapshot
from eqrisk.snapshot.store import VersionStore

log = logging.getLogger("eqrisk.api")
access = logging.getLogger("eqrisk.access")
SERVICES = ("daily", "risk")
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# Query parameters whose value is never logged (a key or secret sent in the URL by mistake).
_SECRET_PARAM = re.compile(rb"(?i)(key|token|secret|password|passwd|signature|auth)")
_UNPRINTABLE = re.compile(rb"[^\x21-\x7e]")
# A key-shaped value, under any name and anywhere in the target: an eqrisk key (`eqk_...`), or a
# run of 16 or more token characters with letters and digits (an imported key, a bearer token,
# base64). Words, dates, lists of tickers and numbers are not key-shaped.
_TOKEN = re.compile(rb"[A-Za-z0-9_\-.~+/=]{16,}")
_LETTER, _DIGIT = re.compile(rb"[A-Za-z]"), re.compile(rb"[0-9]")


def _printable(raw: bytes) -> str:
    """Bytes of a request target as one log field: anything but visible ASCII %-escaped."""
    return _UNPRINTABLE.sub(lambda m: b"%%%02X" % m.group()[0], raw).decode("ascii")


def key_shaped(raw: bytes) -> bool:
    """True when `raw` (as sent: percent-encoded, `+` for space) holds a key-shaped token."""
    text = unquote_to_bytes(raw.replace(b"+", b" "))
    return any(
        b"eqk_" in token or (_LETTER.search(token) and _DIGIT.search(token))
        for token in _TOKEN.findall(text)
    )


def logged_target(scope: Scope) -> str:
    """Path and query string as sent, with the value of any secret-looking parameter, and any
    key-shaped value or path segment whatever its name, masked."""
    path = scope.get("raw_path") or scope["path"].encode("utf-8")
    if key_shaped(path):
        path = b"/".join(b"***" if key_shaped(part) else part for part in path.split(b"/"))
    query = scope.get("query_string", b"")
    if not query:
        return _printable(path)
    parts = []
    for pair in query.split(b"&"):
        name, eq, value = pair.partition(b"=")
        if eq and (_SECRET_PARAM.search(name) or key_shaped(value)):
            pair = name + b"=***"
        elif key_shaped(name):
            pair = b"***" + eq + (b"***" if eq else b"")
        parts.append(pair)
    return _printable(path + b"?" + b"&".join(parts))


class RequestIdMiddleware:
    """Gives every request an id (the caller's X-Request-ID when sane, else a new one), puts it
    on every response, and turns an exception that escaped everything into a problem+json 500
    that carries the id (the framework's last-resort handler would not). With `access_log`,
    writes one line per finished request to the `eqrisk.access` logger: method, target (secrets
    masked), status, duration, response bytes, request id, account id (`-` without a caller);
    never a header, so never a key."""

    def __init__(self, app: ASGIApp, *, access_log: bool = False) -> None:
        self.app = app
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        request_id = incoming if _SAFE_ID.match(incoming) else uuid.uuid4().hex
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        started = False
        status = 0
        sent = 0
        t0 = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal started, status, sent
            if message["type"] == "http.response.start":
                started = True
                status = message["status"]
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode()))
                message["headers"] = headers
            elif message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            log.exception("unhandled error, request %s", request_id)
            if started:
                status = status or 500
                raise
            status, sent = 500, await self._send_500(send, request_id)
        finally:
            if self.access_log:
                caller = state.get("caller")
                access.info(
                    "%s %s %d %.1fms %dB request_id=%s account=%s",
                    scope["method"],
                    logged_target(scope),
                    status,
                    (time.perf_counter() - t0) * 1e3,
                    sent,
                    request_id,
                    caller.account_id if caller is not None else "-",
                )

    @staticmethod
    async def _send_500(send: Send, request_id: str) -> int:
        body = problem_body(
            "INTERNAL_ERROR", "an internal error occurred; quote the request_id", request_id
        )
        await send(
            {
                "type": "http.response.start",
                "status": 500,
                "headers": [
                    (b"content-type", b"application/problem+json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"x-request-id", request_id.encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
        return len(body)


# glibc's malloc: blocks up to this size come from the heap, and up to this much free memory
# stays at its top, so a large answer's buffers reuse pages instead of fresh zeroed ones.
MMAP_THRESHOLD, TRIM_THRESHOLD = 64 << 20, 256 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)


def keep_freed_memory() -> bool:
    """Lets glibc reuse freed memory for the next large answer (`MMAP_THRESHOLD`,
    `TRIM_THRESHOLD`). By default every block over 128 kB (32 MB once adapted) is a fresh
    mapping, and the kernel zeroes each of its pages on first touch: on this VM that cost more
    than formatting the answer (20,000 page faults, 8 ms, with the GIL held, for one 8.8 MB
    JSON answer). False where the C library has no mallopt (not glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )


GIL_SWITCH_S = 0.001
"""How long a thread holding the interpreter lock may keep it while the event loop waits."""

# How much lower than the process's the render threads' CPU priority is (Linux `nice`): when
# a small request wakes the event loop while a render thread computes, the loop gets the core.
RENDER_NICENESS = 10


def lower_thread_priority(step: int = RENDER_NICENESS) -> None:
    """Lowers the calling thread's CPU priority by `step` (Linux schedules threads one by
    one; elsewhere, where the call would lower the whole process, nothing is done)."""
    if sys.platform == "linux":
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(os.getpriority(os.PRIO_PROCESS, tid) + step, 19))


def tune_process() -> None:
    """The serving process's own settings (the allocator): set by `serving_app` in every
    worker process, not by `create_app`, so that a test or a notebook that builds an app keeps
    its allocator as it was. (The interpreter's switch interval is `create_app`'s:
    `GIL_SWITCH_S`, docs/decisions/request-path.md.)"""
    keep_freed_memory()


def create_app(
    settings: Settings | None = None,
    services: Sequence[str] | None = None,
    store: VersionStore | None = None,
) -> FastAPI:
    """Build the application for `services` ("daily" = Service A, "risk" = Service B) over
    the snapshot store `store` (default: the one the settings name)."""
    settings = settings or get_settings()
    store = store or VersionStore.from_settings(settings)
    services = tuple(services if services is not None else settings.services)
    unknown = set(services) - set(SERVICES)
    if unknown or not services:
        raise ValueError(f"services must be a non-empty subset of {SERVICES}; got {services}")
    # The docs page's JavaScript and CSS are served by the app itself (no CDN): it works offline.
    app = FastAPIOffline(
        docs_url=None,  # served by security.docs_pages, under the one security policy
        redoc_url=None,
        title="eqrisk",
        version=eqrisk.__version__,  # the package's (the CLI's, the snapshots')
        description=(
            "Equity risk data computed by eqrisk from daily prices. Service A (daily stock data) "
            "at the root, key in the `apikey` header; Service B (risk metrics) under `/api`, key "
            "as `Authorization: Bearer <key>` or `X-API-Key`. Errors are problem+json."
        ),
    )
    app.state.settings = settings
    app.state.snapshots = ServedSnapshot(
        settings.home_dir, store=store, check_ms=settings.snapshot_check_ms
    )
    app.state.prices = PriceTable.load(settings.pricing_file)
    check_prices(app.state.prices.prices)  # every metered route priced, every price used
    app.state.render_cache = RenderCache(settings.render_cache_mb * 2**20)
    # Large answers render here, one at a time by default (formats.answer), at a lower CPU
    # priority than the event loop's (docs/decisions/serving.md).
    writers.warm_up()
    records.warm_up()  # the portfolio answer's positions
    row_kernel.warm_up()  # a ticker's first long read assembles its row with it
    app.state.render_pool = ThreadPoolExecutor(
        settings.render_threads, thread_name_prefix="render", initializer=lower_thread_priority
    )
    # Plans and renders that compute (threaded endpoints, estimates): off the event loop, in
    # a bounded pool, each call's CPU held to the budget (api/work.py).
    app.state.work_pool = work_pool(settings.work_threads, lower_thread_priority)
    # Large answers are compressed off the loop at the same lower priority (brotli of a 1 MB
    # answer is a few ms of CPU the event loop should not wait behind).
    app.state.compress_pool = ThreadPoolExecutor(
        settings.work_threads, thread_name_prefix="compress", initializer=lower_thread_priority
    )
    # A work thread running Python holds the interpreter lock; the event loop asking for it
    # gets it within this interval (Python's default: 5 ms), so /api/health waits less.
    sys.setswitchinterval(GIL_SWITCH_S)
    app.state.cpu_budget_s = settings.cpu_budget_ms / 1000
    database_url = settings.database_url.get_secret_value() if settings.database_url else None
    timeouts = Timeouts(settings.database_connect_timeout_s, settings.database_timeout_s)
    engine = make_engine(settings.home_dir, database_url, timeouts=timeouts, pool=Pool.of(settings))
    app.state.accounts = Accounts(engine, retry_s=settings.backend_retry_s)
    app.state.accounts.ensure_demo_key(settings.demo_key.get_secret_value())
    app.state.accounts.starting_credit = usd_to_tokens(settings.starting_credit_usd)
    app.state.self_service = self_service(app.state.accounts, settings)
    redis_url = settings.redis_url.get_secret_value() if settings.redis_url else None
    shared = settings.rate_limit_storage == "sqlite"
    app.state.limiter = RateLimiter(
        redis_url,
        sqlite_path=settings.home_dir / SQLITE_FILE if shared else None,
        connect_timeout_s=settings.redis_connect_timeout_s,
        timeout_s=settings.redis_timeout_s,
        retry_s=settings.backend_retry_s,
    )
    install_error_handlers(app)
    outages.include(app)  # 503 for a backend error, whoever raised it
    # Every route from its one Endpoint object (api/endpoints/); /api/estimate prices these.
    register_all(app, [e for e in ENDPOINTS if e.service in services])
    app.state.estimated = {n: e for n, e in ESTIMATED.items() if e.service in services}
    docs_pages(app)
    if settings.metrics == "public":  # else off, or on a port of its own (`eqrisk serve`)
        app.add_route("/metrics", metrics_route(settings.snapshots_dir), include_in_schema=False)
    if "risk" in services:
        dashboard.include(app)  # the page at / is a client of Service B

    # One charge writer per process; its groups whose COMMIT got no answer and could not be
    # settled at once are recorded under the home (accounts/doubt.py).
    app.state.writer = ChargeWriter(app.state.accounts, journal=settings.home_dir / JOURNAL_DIR)
    # Starlette runs the last added middleware first: security headers, metrics, request id and
    # access log, then the size limits (nothing below reads the network), compression, the gate,
    # then routes.
    app.add_middleware(
        Gate,
        accounts=app.state.accounts,
        limiter=app.state.limiter,
        keyed=keyed_service,
        services=services,
        version=lambda: served_snapshot(app.state.snapshots).version,
        writer=app.state.writer,
        failed_keys=FailedKeys(app.state.limiter, settings.invalid_key_limit),
    )
    # Outside the gate: the answer is priced, charged and replayed as rendered, then encoded.
    app.state.compressed = CompressedCache()
    app.add_middleware(Compression, cache=app.state.compressed, pool=app.state.compress_pool)
    app.add_middleware(
        Bounds,
        max_body=settings.max_body_bytes,
        max_headers=settings.max_header_bytes,
        max_query=settings.max_query_bytes,
    )
    app.add_middleware(RequestIdMiddleware, access_log=settings.access_log)
    if settings.metrics != "off":  # counts what the request id middleware answered too
        app.add_middleware(Telemetry, routes=app.router.routes)
    app.add_middleware(SecurityHeaders)  # on every response, whoever answered it
    return app


def serving_app() -> FastAPI:
    """The application as `eqrisk serve` runs it (uvicorn's factory, in each worker): the
    process tuned (`tune_process`), the app built from the environment's settings, the served
    snapshot opened, then everything made so far moved out of the garbage collector's reach.

    Startup leaves a few hundred thousand long-lived objects (modules, FastAPI's and pydantic's
    models, the snapshot's index); every full collection walked them all: 130-330 ms with the
    event loop stopped, a few times in a 5 s load of metered calls (the p99 of those calls was
    160 ms where their charge's p99 was 10 ms). `gc.freeze()` keeps them out of collections;
    they are never garbage, so nothing is lost."""
    tune_process()
    app = create_app()
    # None to serve yet: the routes say so, and the first version opens on demand.
    with contextlib.suppress(ApiError):
        served_snapshot(app.state.snapshots)
    gc.collect()
    gc.freeze()
    return app

"""Prometheus metrics of a server (docs/decisions/operations.md).

Counted per request, in every worker: requests by route template, method and status
(`eqrisk_requests_total`), their latency (`eqrisk_request_duration_seconds`), and what they were
charged (`eqrisk_charged_tokens_total`, `eqrisk_charged_usd_total`, from the gate's
`X-Tokens-Consumed`). Read at each scrape from the store: the current version and its age, and
the builds' durations (recorded by the build, `snapshot/build_times.py`).

`eqrisk serve` sets PROMETHEUS_MULTIPROC_DIR before any worker starts (prometheus_client's
multiprocess mode: each worker writes its counts to files there, a scrape adds them up), so the
numbers are the server's whatever worker answers the scrape. Without it (an app made in a test)
the counts are the process's own.
"""

from __future__ import annotations

import calendar
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from eqrisk.accounts.pricing import TOKEN_USD
from eqrisk.snapshot.build_times import read_build_times
from eqrisk.snapshot.versions import CURRENT, VERSION_RE

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
UNMATCHED = "(unmatched)"  # any path no route answers: one label value, whatever was asked
# Latency buckets, seconds: from a cached small answer (< 1 ms) to a large render.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

REQUESTS = Counter(
    "eqrisk_requests", "HTTP requests answered.", ("route", "method", "status"), registry=None
)
LATENCY = Histogram(
    "eqrisk_request_duration_seconds",
    "Seconds from a request's start to the end of its answer.",
    ("route", "method"),
    buckets=BUCKETS,
    registry=None,
)
CHARGED_TOKENS = Counter(
    "eqrisk_charged_tokens", "Tokens charged to accounts.", ("route",), registry=None
)
CHARGED_USD = Counter("eqrisk_charged_usd", "USD charged to accounts.", ("route",), registry=None)
PER_REQUEST = (REQUESTS, LATENCY, CHARGED_TOKENS, CHARGED_USD)
_TOKEN_USD = float(TOKEN_USD)


def route_template(scope: Scope, routes: Sequence[BaseRoute] = ()) -> str:
    """The template of the route that answered (`/api/metrics/{ticker}`), never the path as
    asked, so label values stay few. A request answered before the router (the gate's 401,
    429, 402) is matched against `routes` here."""
    route = scope.get("route")
    if route is None:
        route = next((r for r in routes if r.matches(scope)[0] == Match.FULL), None)
    path = getattr(route, "path", None)
    return path if isinstance(path, str) and path else UNMATCHED


class Telemetry:
    """Counts every HTTP request in the metrics above, once it is answered (an exception that
    escaped counts as a 500)."""

    def __init__(self, app: ASGIApp, *, routes: Sequence[BaseRoute] = ()) -> None:
        self.app = app
        self.routes = routes  # the app's (the same list: routes added later count)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500
        tokens = 0

        async def counted(message: Message) -> None:
            nonlocal status, tokens
            if message["type"] == "http.response.start":
                status = message["status"]
                for name, value in message.get("headers", ()):
                    if name.lower() == b"x-tokens-consumed":
                        tokens = int(value)
            await send(message)

        try:
            await self.app(scope, receive, counted)
        finally:
            route, method = route_template(scope, self.routes), scope["method"]
            REQUESTS.labels(route, method, str(status)).inc()
            LATENCY.labels(route, method).observe(time.perf_counter() - t0)
            if tokens > 0:
                CHARGED_TOKENS.labels(route).inc(tokens)
                CHARGED_USD.labels(route).inc(tokens * _TOKEN_USD)


class StoreCollector(Collector):
    """What the snapshot store says at scrape time: the current version, its number and age
    (from its name, `v<N>-<UTC build time>`), and the builds' durations per mode."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def collect(self) -> Iterator[Metric]:
        try:
            version = (self.root / CURRENT).read_text().strip()
        except OSError:
            version = ""
        found = VERSION_RE.match(version)
        if found is not None:
            built = calendar.timegm(time.strptime(found.group(2), "%Y%m%dT%H%M%SZ"))
            info = GaugeMetricFamily(
                "eqrisk_snapshot_version",
                "The current snapshot version's number (label: its name).",
                labels=("version",),
            )
            info.add_metric((version,), int(found.group(1)))
            yield info
            yield GaugeMetricFamily(
                "eqrisk_snapshot_age_seconds",
                "Seconds since the current snapshot version was built.",
                value=max(0.0, time.time() - built),
            )
        times = read_build_times(self.root)
        count = CounterMetricFamily("eqrisk_builds", "Builds published, by mode.", labels=("mode",))
        total = CounterMetricFamily(
            "eqrisk_build_seconds", "Seconds spent in published builds, by mode.", labels=("mode",)
        )
        last = GaugeMetricFamily(
            "eqrisk_last_build_duration_seconds",
            "Duration of the last published build of each mode.",
            labels=("mode",),
        )
        for mode, entry in sorted(times.items()):
            count.add_metric((mode,), float(entry.get("count", 0)))
            total.add_metric((mode,), float(entry.get("sum_seconds", 0.0)))
            last.add_metric((mode,), float(entry.get("last_seconds", 0.0)))
        yield from (count, total, last)


def metrics_registry(root: Path) -> CollectorRegistry:
    """What a scrape reports: the request counts (every worker's, in multiprocess mode) and
    the store's collector."""
    registry = CollectorRegistry(auto_describe=True)
    if os.environ.get(MULTIPROC_ENV):
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        for metric in PER_REQUEST:
            registry.register(metric)
    registry.register(StoreCollector(root))
    return registry


def metrics_route(root: Path) -> Callable[[Request], Awaitable[Response]]:
    """The `/metrics` handler of the public port (setting `metrics=public`)."""

    async def metrics(_request: Request) -> Response:
        body = generate_latest(metrics_registry(root))
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return metrics

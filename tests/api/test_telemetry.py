"""Prometheus metrics: a real `eqrisk serve --workers 2` with its metrics on a port of their own
(prometheus_client's multiprocess mode), scraped and parsed with prometheus_client's parser: the
counts by route template and status equal the requests made, whichever worker answered each, the
charges equal the tokens the responses reported, the version is the store's. And in process: off
by default (no /metrics), `public` serves it on the API's port."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from eqrisk.settings import Settings
from eqrisk.snapshot.build_times import read_build_times
from eqrisk.snapshot.versions import VERSION_RE, current_version
from helpers import TEST_KEY, Server, bearer, client_for, free_port


def samples(text: str) -> dict[str, list[Any]]:
    """Every sample of a scrape, by sample name."""
    found: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def by_labels(found: dict[str, list[Any]], name: str, *keys: str) -> dict[tuple[str, ...], float]:
    return {tuple(s.labels[k] for k in keys): s.value for s in found.get(name, [])}


def made(base: str) -> tuple[Counter[tuple[str, str, str]], int]:
    """A mix of requests: (route template, method, status) -> count, and the tokens charged."""
    expected: Counter[tuple[str, str, str]] = Counter()
    tokens = 0
    with httpx.Client(base_url=base, timeout=30) as client:
        calls = [
            ("/api/health", "/api/health", {}),
            ("/api/metrics/NVDA", "/api/metrics/{ticker}", bearer(TEST_KEY)),
            ("/api/metrics/AAPL", "/api/metrics/{ticker}", bearer(TEST_KEY)),
            ("/api/metrics/MSFT", "/api/metrics/{ticker}", bearer("eqk_wrong_key")),
            ("/no/such/page", "(unmatched)", {}),
        ]
        for k in range(3):
            for url, template, headers in calls[: 5 if k < 2 else 2]:
                resp = client.get(url, headers=headers)
                expected[(template, "GET", str(resp.status_code))] += 1
                tokens += int(resp.headers.get("x-tokens-consumed", 0))
    return expected, tokens


def test_multiprocess_counts_equal_the_requests_made(
    demo_home: Path, demo_settings: Settings
) -> None:
    port = free_port()
    with Server(demo_home, workers=2, EQRISK_METRICS=str(port)) as server:
        assert f"metrics:   http://127.0.0.1:{port}/metrics" in server.log()
        scrape = f"http://127.0.0.1:{port}/metrics"
        # What was counted before (the start-up probe of /api/health), as the baseline.
        start = samples(httpx.get(scrape, timeout=10).text)
        baseline = by_labels(start, "eqrisk_requests_total", "route", "method", "status")
        public = httpx.get(f"{server.base}/metrics", timeout=10)
        assert public.status_code == 404  # not on the public port
        made_now, tokens = made(server.base)
        made_now[("(unmatched)", "GET", "404")] += 1  # the probe of /metrics above
        expected = Counter({k: int(v) for k, v in baseline.items()}) + made_now
        assert tokens > 0 and ("/api/metrics/{ticker}", "GET", "401") in expected
        deadline = time.monotonic() + 10
        while True:  # a request is counted as it ends, which can be after its client read it
            text = httpx.get(scrape, timeout=10).text
            found = samples(text)
            counts = by_labels(found, "eqrisk_requests_total", "route", "method", "status")
            if counts == expected or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert len(server.workers()) == 2
    assert counts == {k: float(v) for k, v in expected.items()}
    latency = by_labels(found, "eqrisk_request_duration_seconds_count", "route", "method")
    per_route: Counter[tuple[str, str]] = Counter()
    for (route, method, _), n in expected.items():
        per_route[(route, method)] += n
    assert latency == {k: float(v) for k, v in per_route.items()}
    buckets = [
        s for s in found["eqrisk_request_duration_seconds_bucket"] if s.labels["le"] == "+Inf"
    ]
    assert sum(s.value for s in buckets) == sum(expected.values())
    charged = by_labels(found, "eqrisk_charged_tokens_total", "route")
    assert charged == {("/api/metrics/{ticker}",): float(tokens)}
    usd = by_labels(found, "eqrisk_charged_usd_total", "route")
    assert abs(usd[("/api/metrics/{ticker}",)] - tokens * 0.00002) < 1e-9
    version = current_version(demo_home)
    assert version is not None
    (v,) = found["eqrisk_snapshot_version"]
    assert v.labels["version"] == version and v.value == int(VERSION_RE.match(version).group(1))  # type: ignore[union-attr]
    (age,) = found["eqrisk_snapshot_age_seconds"]
    assert 0 <= age.value < 7 * 86400
    builds = read_build_times(demo_home / "snapshots")
    assert builds, "the demo's build recorded its duration"
    assert by_labels(found, "eqrisk_builds_total", "mode") == {
        (mode,): float(e["count"]) for mode, e in builds.items()
    }
    assert by_labels(found, "eqrisk_last_build_duration_seconds", "mode") == {
        (mode,): e["last_seconds"] for mode, e in builds.items()
    }


def test_off_by_default_and_public_on_the_api_port(
    demo_home: Path, demo_settings: Settings
) -> None:
    assert client_for(demo_home).get("/metrics").status_code == 404
    client = client_for(demo_home, metrics="public")
    before = samples(client.get("/metrics").text)
    client.get("/api/health")
    client.get("/api/health")
    after = samples(client.get("/metrics").text)

    def health(found: dict[str, list[Any]]) -> float:
        counts = by_labels(found, "eqrisk_requests_total", "route", "method", "status")
        return counts.get(("/api/health", "GET", "200"), 0.0)

    assert health(after) - health(before) == 2
    scrapes = by_labels(after, "eqrisk_requests_total", "route", "method", "status")
    assert scrapes[("/metrics", "GET", "200")] >= 1

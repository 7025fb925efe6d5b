"""The work threads (api/work.py) on the demo snapshot: a portfolio's plan and an estimate run
in the app's bounded work pool, not on the event loop, so /api/health answers while every work
thread is busy; a call over the CPU budget is a 503 problem+json and is not charged."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient

from eqrisk.api.app import create_app
from eqrisk.settings import Settings
from helpers import TEST_KEY

AUTH = {"Authorization": f"Bearer {TEST_KEY}"}
BOOK = {"positions": {"NVDA": 0.5, "AAPL": 0.3, "MSFT": 0.2}, "benchmark": "SPY"}


@pytest.fixture(scope="module")
def client(demo_settings: Settings) -> TestClient:
    settings = demo_settings.model_copy(update={"work_threads": 1})
    with TestClient(create_app(settings)) as c:
        yield c


def _balance(client: TestClient) -> int:
    return int(client.get("/api/balance", headers=AUTH).json()["balance_tokens"])


def test_health_answers_while_the_work_threads_are_busy(client: TestClient) -> None:
    assert client.post("/api/portfolio/risk", json=BOOK, headers=AUTH).status_code == 200
    pool = client.app.state.work_pool  # type: ignore[attr-defined]
    release, holding = threading.Event(), threading.Event()

    def hold() -> None:  # the one work thread, busy until released
        holding.set()
        release.wait(60)

    blocker = pool.submit(hold)
    assert holding.wait(30)
    with ThreadPoolExecutor(2) as callers:
        risk = callers.submit(client.post, "/api/portfolio/risk", json=BOOK, headers=AUTH)
        estimate = callers.submit(
            client.post,
            "/api/estimate",
            json={"endpoint": "portfolio/risk", "params": BOOK},
            headers=AUTH,
        )
        for _ in range(5):  # the loop is free: health answers though no work thread is
            assert client.get("/api/health").status_code == 200
        # Both wait for the work thread (their plans run there, not on the loop).
        assert not risk.done() and not estimate.done()
        release.set()
        blocker.result(30)
        assert risk.result(60).status_code == 200
        doc = estimate.result(60).json()
        assert doc["estimated_tokens"] > 0


def test_a_call_over_the_cpu_budget_is_a_free_503(client: TestClient) -> None:
    state = client.app.state  # type: ignore[attr-defined]
    before = _balance(client)
    budget = state.cpu_budget_s
    state.cpu_budget_s = 0.0  # every computing call is over it
    try:
        resp = client.post("/api/portfolio/risk", json=BOOK, headers=AUTH)
        health = client.get("/api/health")
    finally:
        state.cpu_budget_s = budget
    assert resp.status_code == 503, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    doc = resp.json()
    assert doc["error"] == "SERVICE_UNAVAILABLE"
    assert "EQRISK_CPU_BUDGET_MS" in doc["detail"] and "not charged" in doc["detail"]
    assert doc["budget_ms"] == 0.0 and doc["cpu_ms"] > 0.0
    assert health.status_code == 200  # not a computing call
    assert _balance(client) == before
    assert client.post("/api/portfolio/risk", json=BOOK, headers=AUTH).status_code == 200
    assert _balance(client) < before


def test_a_body_is_read_screened_and_planned_in_one_hop(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A threaded POST route goes to the work threads twice: its body, screen, format and plan
    in one hop, its render in the other (the body was a hop of its own); the answer and the
    charge are those of the same call made with the body parsed on its own."""
    from eqrisk.api import endpoint, work

    pieces: list[str] = []
    real = work.offload

    async def counted(request, fn, *args):  # type: ignore[no-untyped-def]
        pieces.append(fn.__name__)
        return await real(request, fn, *args)

    monkeypatch.setattr(endpoint, "offload", counted)
    before = _balance(client)
    answer = client.post("/api/portfolio/risk", json=BOOK, headers=AUTH)
    assert answer.status_code == 200
    assert pieces == ["read_and_plan", "render"]
    spent = before - _balance(client)
    assert spent == int(answer.headers["x-tokens-consumed"]) > 0
    # The estimate prices the same call: the same tokens.
    quote = client.post(
        "/api/estimate", json={"endpoint": "portfolio/risk", "params": BOOK}, headers=AUTH
    )
    assert quote.json()["estimated_tokens"] == spent

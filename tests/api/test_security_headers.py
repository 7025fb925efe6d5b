"""The same security headers on every response (api/security.py): the page and its files, the
interactive documentation and its files, the OpenAPI document, API answers and errors; the
documentation pages' policy names exactly their own inline script."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from eqrisk.accounts.book import Accounts
from eqrisk.api.security import SECURITY_HEADERS
from helpers import bearer, client_for, new_key


@pytest.fixture(scope="module")
def client(demo_home: Path, tmp_path_factory: pytest.TempPathFactory) -> TestClient:
    import shutil

    home = tmp_path_factory.mktemp("security") / "home"
    shutil.copytree(demo_home / "snapshots", home / "snapshots")
    return client_for(home, max_body_bytes=4096)


def _policy(value: str) -> dict[str, list[str]]:
    return {d.split()[0]: d.split()[1:] for d in (p.strip() for p in value.split(";")) if d}


def test_every_response_carries_the_security_headers(client: TestClient) -> None:
    app = client.app
    accounts = Accounts(app.state.accounts.engine)  # type: ignore[attr-defined]
    _, key = new_key(accounts)
    answers = {
        "page": client.get("/"),
        "page script": client.get("/static/js/app.js"),
        "page style": client.get("/static/dashboard.css"),
        "plotly, gzipped": client.get(
            "/static/vendor/plotly.min.js", headers={"Accept-Encoding": "gzip"}
        ),
        "missing asset": client.get("/static/nope.js"),
        "swagger ui": client.get("/docs"),
        "swagger ui's script": client.get("/static-offline-docs/swagger-ui-bundle.js"),
        "redoc": client.get("/redoc"),
        "openapi": client.get("/openapi.json"),
        "health": client.get("/api/health"),
        "metered answer": client.get("/api/metrics/NVDA", headers=bearer(key)),
        "csv answer": client.get("/api/ticker-returns?ticker=NVDA&format=csv", headers=bearer(key)),
        "service a": client.get(
            "/daily?symbols=NVDA&start_time=2026-10-01", headers={"apikey": key}
        ),
        "no key": client.get("/api/metrics/NVDA"),
        "unknown route": client.get("/nowhere"),
        "body too large": client.post(
            "/api/batch/analyze", content=b"x" * 5000, headers=bearer(key)
        ),
    }
    for name, resp in answers.items():
        assert resp.status_code < 500, name
        for header, value in SECURITY_HEADERS.items():
            if header == "Content-Security-Policy" and name in ("swagger ui", "redoc"):
                continue  # their own policy, below
            assert resp.headers.get(header) == value, (name, header)
        assert resp.headers.get_list("x-content-type-options") == ["nosniff"], name
    assert answers["plotly, gzipped"].headers["content-encoding"] == "gzip"


@pytest.mark.parametrize("path", ["/docs", "/redoc"])
def test_the_documentation_pages_allow_their_own_inline_script_and_nothing_else(
    client: TestClient, path: str
) -> None:
    resp = client.get(path)
    assert resp.status_code == 200
    page = _policy(SECURITY_HEADERS["Content-Security-Policy"])
    docs = _policy(resp.headers["content-security-policy"])
    inline = re.findall(r"<script>(.*?)</script>", resp.text, re.DOTALL)
    hashes = [
        "'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() + "'"
        for s in inline
    ]
    assert docs["script-src"] == ["'self'", *hashes]
    assert len(hashes) == (1 if path == "/docs" else 0)
    # Every other directive is the page's (ReDoc also starts a worker from a blob).
    others = {k: v for k, v in docs.items() if k not in ("script-src", "worker-src")}
    assert others == {k: v for k, v in page.items() if k != "script-src"}
    assert docs.get("worker-src") == (["'self'", "blob:"] if path == "/redoc" else None)
    # Its scripts and styles come from this server.
    for src in re.findall(r'(?:src|href)="([^"]+)"', resp.text):
        assert src.startswith("/"), src
        assert client.get(src).status_code == 200, src

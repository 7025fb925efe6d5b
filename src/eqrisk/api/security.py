"""The security headers of every response, pages and assets included (`SecurityHeaders`), and the
API documentation pages under the same policy (`docs_pages`).

Every answer says what it is and may do: `X-Content-Type-Options: nosniff` (a CSV or JSON answer
is never sniffed as a page), a Content-Security-Policy that lets a page load scripts, styles and
data from this server only and be framed by nobody, and no Referer sent on. The dashboard at `/`
and its files under `/static`, the interactive documentation at `/docs` and `/redoc` with
theirs, the OpenAPI document and every API answer or error carry them. The documentation pages
start their viewer with one inline script: the policy of those two pages names that script by
its SHA-256 (nothing else inline may run), and lets ReDoc start its worker from a blob.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterable

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.responses import HTMLResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

DOCS_ASSETS = "/static-offline-docs"  # where fastapi_offline serves Swagger UI's and ReDoc's files


def content_security_policy(
    scripts: Iterable[str] = (), workers: bool = False, provider: Iterable[str] = ()
) -> str:
    """The one policy; `scripts`: SHA-256 sources of inline scripts a page may run, `workers`:
    the page starts workers from blobs (ReDoc); `provider`: the payment provider's origins the
    sign-up and account pages load Stripe.js from, call and frame (its card fields)."""
    origins = list(provider)
    script_src = " ".join(["'self'", *scripts, *origins])
    connect_src = " ".join(["'self'", *origins])
    frames = f"; frame-src {' '.join(origins)}" if origins else ""
    policy = (
        f"default-src 'self'; script-src {script_src}; style-src 'self' 'unsafe-inline'; "
        f"img-src 'self' data: blob:; connect-src {connect_src}; object-src 'none'; "
        f"base-uri 'none'; frame-ancestors 'none'{frames}"
    )
    return policy + ("; worker-src 'self' blob:" if workers else "")


# The page loads scripts and styles from this server only; plotly sets inline styles on its SVG.
SECURITY_HEADERS = {
    "Content-Security-Policy": content_security_policy(),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
_ADDED = [(name.lower().encode(), value.encode()) for name, value in SECURITY_HEADERS.items()]


class SecurityHeaders:
    """ASGI middleware: `SECURITY_HEADERS` on every HTTP response that does not set its own."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers.extend(h for h in _ADDED if h[0] not in present)
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)


_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)


def inline_script_sources(html: str) -> list[str]:
    """CSP sources (`'sha256-...'`) of the inline scripts of a page."""
    return [
        "'sha256-" + base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() + "'"
        for body in _INLINE_SCRIPT.findall(html)
    ]


def _under_policy(page: HTMLResponse, workers: bool = False) -> HTMLResponse:
    html = bytes(page.body).decode()
    policy = content_security_policy(inline_script_sources(html), workers)
    page.headers["Content-Security-Policy"] = policy
    return page


def docs_pages(app: FastAPI) -> None:
    """`/docs` (Swagger UI) and `/redoc` (ReDoc) from the files served by the app itself (no
    CDN), under the one policy (see the module doc)."""

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        page = get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{DOCS_ASSETS}/favicon.png",
            swagger_ui_parameters=app.swagger_ui_parameters,
        )
        return _under_policy(page)

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        page = get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{DOCS_ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{DOCS_ASSETS}/favicon.png",
            with_google_fonts=False,
        )
        return _under_policy(page, workers=True)

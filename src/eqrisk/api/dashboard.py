"""The dashboard: a static page at `/` that is one more client of the public API.

It is served outside `/api` and outside Service A's routes, so the gate and the price table never
see it; it calls the same routes with the same keys as any client. Plotting uses the JavaScript
bundled in the installed `plotly` Python package (no CDN: the page works offline). The only things
filled in on the server are the keys the page offers to visitors: the configured demo key (a
public value) and, on the server `eqrisk demo` starts, its local evaluation key.
"""

from __future__ import annotations

import html
import importlib.util
import os
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI
from starlette.middleware.gzip import GZipMiddleware
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

from eqrisk.api.security import content_security_policy

STATIC_DIR = Path(__file__).resolve().parent / "static"
STATIC_PREFIX = "/static"
DEMO_KEY_MARK = "{{DEMO_KEY}}"
EVALUATION_KEY_MARK = "{{EVALUATION_KEY}}"


def plotly_bundle() -> Path:
    """plotly.js as shipped inside the installed `plotly` package (found without importing it)."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the dashboard needs the 'plotly' package: pip install plotly")
    path = Path(next(iter(spec.submodule_search_locations))) / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise RuntimeError(f"plotly is installed but {path} is missing; reinstall plotly")
    return path


@lru_cache(maxsize=4)
def index_html(demo_key: str, evaluation_key: str = "") -> str:
    """The page, with the keys it offers filled in (escaped for an HTML attribute); an empty
    evaluation key: the page offers none."""
    text = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
    text = text.replace(EVALUATION_KEY_MARK, html.escape(evaluation_key, quote=True))
    return text.replace(DEMO_KEY_MARK, html.escape(demo_key, quote=True))


class DashboardFiles(StaticFiles):
    """The page's own files, plus plotly.js from the installed package at `vendor/plotly.min.js`."""

    def __init__(self, plotly: Path) -> None:
        super().__init__(directory=STATIC_DIR)
        self.plotly = plotly

    def lookup_path(self, path: str) -> tuple[str, os.stat_result | None]:
        if Path(path).as_posix() == "vendor/plotly.min.js":
            return str(self.plotly), os.stat(self.plotly)
        return super().lookup_path(path)


def provider_origins(settings: Any) -> tuple[str, ...]:
    """The origins of Stripe.js and Stripe's API (and the frames of its card fields) that the
    pages need, when Stripe is configured."""
    if not settings.stripe_enabled:
        return ()
    found = [settings.stripe_js_url, settings.stripe_api_base or "https://api.stripe.com"]
    if settings.stripe_api_base is None:
        found += ["https://js.stripe.com", "https://hooks.stripe.com"]
    origins = []
    for url in found:
        parts = urlsplit(url)
        origins.append(f"{parts.scheme}://{parts.netloc}")
    return tuple(dict.fromkeys(origins))


def _page(name: str, policy: str) -> Any:
    text = (STATIC_DIR / f"{name}.html").read_text(encoding="utf-8")

    async def page() -> HTMLResponse:
        return HTMLResponse(
            text, headers={"Cache-Control": "no-store", "Content-Security-Policy": policy}
        )

    return page


def include(app: FastAPI) -> None:
    """Serve the page at `/` and its files under `/static` on `app`."""
    files = DashboardFiles(plotly_bundle())
    settings = app.state.settings
    demo_key = settings.demo_key.get_secret_value()
    evaluation = settings.evaluation_key
    evaluation_key = evaluation.get_secret_value() if evaluation is not None else ""

    @app.get("/", include_in_schema=False)
    async def dashboard() -> HTMLResponse:
        # The security headers are every response's (api/security.py); no-store: the page may
        # carry the evaluation key, a secret of this machine's demo.
        return HTMLResponse(
            index_html(demo_key, evaluation_key), headers={"Cache-Control": "no-store"}
        )

    # The sign-up and account pages (api/static/signup.html, account.html): static, with the
    # policy widened to Stripe's origins when Stripe is configured (its script, API and frames).
    policy = content_security_policy(provider=provider_origins(settings))
    for page in ("signup", "account"):
        app.add_api_route(f"/{page}", _page(page, policy), methods=["GET"], include_in_schema=False)

    # plotly.min.js is 4.8 MB; gzip sends about a third of that.
    app.mount(STATIC_PREFIX, GZipMiddleware(files, minimum_size=1024), name="static")

"""`eqrisk mcp` (the MCP server over stdio, for a local assistant) and the app `eqrisk serve`
runs: the API with the MCP endpoint mounted at /mcp when the `mcp` extra is installed.

The composition lives here, at the top layer, because the MCP server is a client of the API
(`eqrisk.mcp` imports `eqrisk.client`, never the server) and the API may not import the client.
Mounted, its tools call the app they are mounted beside in process (an httpx ASGI transport)
with the caller's key: every tool call goes through the same gate, limits, prices and ledger
as the same call over the network, and shows in the access log as that route.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Annotated, Any

import typer

from eqrisk.cli.app import app, err

MCP_PATH = "/mcp"
INTERNAL_URL = "http://eqrisk.internal"  # the in-process API's base URL (never resolved)


def mcp_available() -> bool:
    return importlib.util.find_spec("mcp") is not None


def mounts_mcp(services: list[str]) -> bool:
    """Whether `serve` mounts /mcp: the SDK is installed and Service B (its tools' routes) is
    served."""
    return mcp_available() and "risk" in services


def mcp_line(base: str, services: list[str]) -> str:
    """What `eqrisk serve` says about the MCP endpoint."""
    if mounts_mcp(services):
        return f"{base}{MCP_PATH} (streamable HTTP, Authorization: Bearer <key>)"
    if "risk" not in services:
        return "off (its tools call Service B, which is not served)"
    return "off (pip install 'eqrisk[mcp]')"


class WithMcp:
    """ASGI: /mcp to the MCP app (behind the API's request ids, access log and size bounds),
    everything else to the API. Lifespan events run the MCP app's (its task group); the API
    has none."""

    def __init__(self, api: Any, mcp: Any) -> None:
        self.api = api
        self.mcp = mcp

    async def __call__(
        self, scope: dict[str, Any], receive: Callable[[], Awaitable[Any]], send: Any
    ) -> None:
        path = scope.get("path", "")
        if scope["type"] == "lifespan" or path == MCP_PATH or path.startswith(MCP_PATH + "/"):
            await self.mcp(scope, receive, send)
        else:
            await self.api(scope, receive, send)


def with_mcp(api: Any) -> Any:
    """`api` with the MCP endpoint mounted at /mcp (requests without a key are answered 401
    problem+json, like a route's)."""
    import httpx

    from eqrisk.api.app import RequestIdMiddleware
    from eqrisk.api.bounds import Bounds
    from eqrisk.client import AsyncClient
    from eqrisk.mcp.server import http_app
    from eqrisk.mcp.tools import key_of

    settings = api.state.settings
    demo_key = settings.demo_key.get_secret_value()
    server_side = httpx.ASGITransport(api)

    def connect(key: str | None, address: tuple[str, int] | None) -> AsyncClient:
        # Tools always have the caller's key (a request without one is refused below) and
        # address: the API sees each tool call from the MCP client's own address, so its
        # limits (the invalid-key one counts per address) count that client, never the
        # server's. The static resources get no request, and read public lineage with the
        # demo key from the server's side.
        transport = server_side if address is None else httpx.ASGITransport(api, client=address)
        return AsyncClient(INTERNAL_URL, key or demo_key, transport=transport)

    inner = http_app(connect)

    async def keyed(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and key_of(_headers(scope)) is None:
            await _unauthorized(scope, send)
            return
        await inner(scope, receive, send)

    bounded = Bounds(
        keyed,
        max_body=settings.max_body_bytes,
        max_headers=settings.max_header_bytes,
        max_query=settings.max_query_bytes,
    )
    return WithMcp(api, RequestIdMiddleware(bounded, access_log=settings.access_log))


def _headers(scope: MutableMapping[str, Any]) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


async def _unauthorized(scope: MutableMapping[str, Any], send: Any) -> None:
    from eqrisk.api.bounds import send_problem
    from eqrisk.api.errors import ApiError

    problem = ApiError(
        "AUTHENTICATION_REQUIRED",
        "the MCP endpoint needs your API key: send `Authorization: Bearer <key>` (or X-API-Key)",
    )
    extra = {"www-authenticate": 'Bearer realm="eqrisk"'}
    await send_problem(send, problem, scope.get("state", {}).get("request_id"), extra)


def serving_app() -> Any:
    """What `eqrisk serve` runs in each worker: the API (`eqrisk.api.app.serving_app`), with
    /mcp mounted when the `mcp` package is installed and Service B is served."""
    from eqrisk.api.app import serving_app as api_app
    from eqrisk.cli.lifeline import follow_parent

    follow_parent()  # a worker of `serve --workers N` ends with the serving process
    api = api_app()
    return with_mcp(api) if mounts_mcp(api.state.settings.services) else api


@app.command()
def mcp(
    url: Annotated[
        str | None,
        typer.Option(help="The eqrisk server to call (default EQRISK_URL, else the local one)."),
    ] = None,
) -> None:
    """Serve the MCP tools over stdio for a local assistant. The key is EQRISK_API_KEY
    (never an argument: it would show in the process list). stdout carries the protocol."""
    if not mcp_available():
        err.print("error: the MCP server needs the mcp package: pip install 'eqrisk[mcp]'")
        raise typer.Exit(3)
    from eqrisk.mcp.server import run_stdio

    run_stdio(url)

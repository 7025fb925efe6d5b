"""The MCP server: the tools of `tools.py` and two resources, over stdio or streamable HTTP.

Streamable HTTP runs stateless with JSON answers: every MCP request stands alone (no session
to keep), so `eqrisk serve --workers N` can answer any of them from any worker, and the key
travels on each request, like on every route.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette

from eqrisk.client import AsyncClient
from eqrisk.mcp.tools import TOOLS, Connect

INSTRUCTIONS = (
    "eqrisk computes equity risk from daily prices: for each stock, the hedge ratios on its "
    "market, sector and subsector ETFs (levels L1, L2, L3) and the share of its variance each "
    "explains. Find tickers with search_tickers; check a price with estimate_cost before an "
    "expensive call. Every call is metered on the user's key: each result says what it cost "
    "and the balance left."
)
MODEL_URI, LINEAGE_URI = "eqrisk://docs/model", "eqrisk://lineage/current"
MCP_PATH = "/mcp"


class EqriskMCP(MCPServer):
    """An MCPServer whose tools call eqrisk through `connect` (see `tools.api`)."""

    def __init__(self, connect: Connect, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.connect = connect


def _readme() -> str:
    """The README: the checkout's (an editable install: the text being edited), else the one
    the installed package carries as its description."""
    checkout = Path(__file__).resolve().parents[3] / "README.md"
    if checkout.is_file() and (checkout.parent / "pyproject.toml").is_file():
        return checkout.read_text(encoding="utf-8")
    try:
        text = importlib.metadata.metadata("eqrisk").get_payload()  # type: ignore[attr-defined]
    except importlib.metadata.PackageNotFoundError:
        text = None
    return str(text or "")


def model_documentation() -> str:
    """The README's "The model" section."""
    found = re.search(r"^## The model\n(.*?)(?=^## )", _readme(), re.M | re.S)
    if found is None:
        return "The model's documentation is the README of eqrisk, section 'The model'."
    return "# The eqrisk model\n" + found.group(1).strip() + "\n"


def build(connect: Connect) -> EqriskMCP:
    """The server with every registered tool and the two resources."""
    server = EqriskMCP(
        connect,
        name="eqrisk",
        title="eqrisk equity risk",
        instructions=INSTRUCTIONS,
        version=importlib.metadata.version("eqrisk"),
        log_level="WARNING",
    )
    for fn in TOOLS:
        server.add_tool(fn, structured_output=True)

    @server.resource(
        MODEL_URI,
        name="model",
        title="How eqrisk's risk model works",
        description="The hierarchical hedge-ratio model: levels, formulas, windows, conventions.",
        mime_type="text/markdown",
    )
    def model() -> str:
        return model_documentation()

    @server.resource(
        LINEAGE_URI,
        name="lineage",
        title="The served model version",
        description="The current snapshot's version, data date, source, universe and method, "
        "and the risk forecast's measured accuracy (bias statistics), which every build stores.",
        mime_type="application/json",
    )
    async def lineage() -> str:
        # A static resource gets no request context: the configured key (mounted: the demo
        # key) asks the free estimate, whose answer carries the lineage as every answer does.
        # The risk forecast's accuracy on the snapshot's data (every build stores it) comes with
        # the version from the free /api/health.
        async with connect(None, None) as client:
            answer = await client.estimate("tickers")
            health = await client.health()
        lineage = dict(answer.get("_metadata") or {})
        lineage["risk_accuracy"] = health.get("risk_accuracy")
        return json.dumps(lineage, indent=2)

    return server


def http_app(connect: Connect) -> Starlette:
    """The streamable HTTP transport at `MCP_PATH`: stateless, JSON answers. The DNS
    rebinding guard is off because the endpoint takes a key on every request, never a
    cookie or an ambient credential a foreign page could use."""
    return build(connect).streamable_http_app(
        streamable_http_path=MCP_PATH,
        stateless_http=True,
        json_response=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )


def run_stdio(url: str | None = None) -> None:
    """Serve over stdin/stdout with the key of EQRISK_API_KEY (the client's default)."""
    build(lambda key, address: AsyncClient(url, key)).run("stdio")

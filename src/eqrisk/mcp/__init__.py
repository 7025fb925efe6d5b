"""eqrisk's Model Context Protocol server: tools and resources for an AI assistant, over stdio
(`eqrisk mcp`, for a local assistant) and streamable HTTP (mounted by `eqrisk serve` at /mcp).

A client of the public API, like `eqrisk.client` under it: every tool is one or a few calls of
`AsyncClient` with the caller's own key, so keys, limits, prices and the ledger are the routes'.
It imports nothing of the server (import-linter keeps it so); `eqrisk.cli` mounts it.
"""

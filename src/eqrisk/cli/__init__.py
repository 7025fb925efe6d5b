"""The `eqrisk` command: `app` (in `eqrisk.cli.app`) with the command groups registered on it
by importing their modules, in the order `eqrisk --help` lists them."""

from eqrisk.cli import data, demo, feeds, serve, mcp, evaluate, snapshots, bucket, accounts, ledger, bench, pictures  # noqa: I001 (help order)
from eqrisk.cli.app import app

__all__ = [
    "accounts",
    "app",
    "bench",
    "bucket",
    "data",
    "demo",
    "evaluate",
    "feeds",
    "ledger",
    "main",
    "mcp",
    "pictures",
    "serve",
    "snapshots",
]


def main() -> None:  # pragma: no cover - console entry point
    app(prog_name="eqrisk")

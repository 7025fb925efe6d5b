"""The `eqrisk` command: `app` (in `eqrisk.cli.app`). Each command group's module registers
its commands on `app` when the command is first asked for (`eqrisk.cli.app.COMMANDS`), so that
`eqrisk --help` imports none of them and `eqrisk update` only eqrisk.cli.data."""

from eqrisk.cli.app import app

__all__ = ["app", "main"]


def main() -> None:  # pragma: no cover - console entry point
    app(prog_name="eqrisk")

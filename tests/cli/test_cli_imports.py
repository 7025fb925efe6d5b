"""`eqrisk --help` and a command's help start without the heavy libraries: the modules their
start imports (read from `python -X importtime`) hold none of numba, dask, fastapi, pandas,
pyarrow, numpy, pydantic, the settings (pydantic-settings) or rich (its consoles are made when a
command first writes); `eqrisk --help` imports no command's module (their one-line help is
`COMMANDS`'), a command's help only its own. The daily job (`eqrisk update`) loads none of the
libraries of serving, Dask or the benches (`NOT_FOR_UPDATE`, asserted on a real update by
tests/cli/test_update_walk.py). Asserted on module names, never on time (the times: `eqrisk
bench imports`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.core import TyperGroup

from eqrisk.cli.app import COMMANDS, OperatorErrors, app

HEAVY = ("numba", "dask", "distributed", "fastapi", "starlette", "pandas", "pyarrow", "uvicorn")
# What the daily job needs none of: the HTTP side, accounts and rate limits, Dask, the object
# store, and the benches' references.
NOT_FOR_UPDATE = (
    "dask", "distributed", "fastapi", "starlette", "uvicorn", "httpx", "sqlalchemy", "redis",
    "limits", "mcp", "stripe", "obstore", "zarr", "prometheus_client", "brotli", "statsmodels",
    "polars", "plotly",
)  # fmt: skip
# Nor a command's help, besides: the model's own libraries and the calendar.
NOT_FOR_HELP = (
    *NOT_FOR_UPDATE, *HEAVY, "scipy", "exchange_calendars", "xxhash", "pydantic",
    "pydantic_core", "pydantic_settings", "rich", "numpy", "asyncio", "logging",
)  # fmt: skip
# What every start imports of the package: the package's lock around `ast.parse`
# (`eqrisk.ast_lock`, standard library only), the app and its output helpers.
START = {"eqrisk", "eqrisk.ast_lock", "eqrisk.cli", "eqrisk.cli.app", "eqrisk.cli.output"}


def not_for(names: set[str], heavy: tuple[str, ...]) -> list[str]:
    """The modules of `names` from the packages of `heavy`."""
    return sorted(n for n in names if n.split(".")[0] in heavy)


def _imported(home: Path, *args: str, module: str = "eqrisk.cli") -> tuple[set[str], str]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", module, *args],
        env={**os.environ, "EQRISK_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = {
        line.rsplit("|", 1)[1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "eqrisk.cli.app" in names  # the parse saw the package's modules
    return names, proc.stdout


def own(names: set[str]) -> set[str]:
    """The package's modules among `names`."""
    return {n for n in names if n.split(".")[0] == "eqrisk"}


@pytest.mark.parametrize("module", ["eqrisk.cli", "eqrisk"])
def test_eqrisk_help_imports_no_heavy_library_no_settings_and_no_command(
    module: str, tmp_path: Path
) -> None:
    names, shown = _imported(tmp_path, "--help", module=module)
    assert "update" in shown and "serve" in shown
    assert not_for(names, NOT_FOR_HELP) == []
    assert "eqrisk.settings" not in names
    assert own(names) == START


@pytest.mark.parametrize("command", ["update", "serve", "bench", "snapshots", "accounts"])
def test_a_commands_help_does_not_import_the_settings_the_kernels_or_the_app(
    command: str, tmp_path: Path
) -> None:
    names, shown = _imported(tmp_path, command, "--help")
    assert "Usage" in shown
    assert not_for(names, NOT_FOR_HELP) == []
    assert "eqrisk.settings" not in names  # a command's help reads no setting, needs no home
    assert "eqrisk.snapshot.versions" not in names and "eqrisk.model.run" not in names
    assert {f"eqrisk.cli.{m}" for m in COMMANDS[command][0]} <= own(names)


def test_update_help_imports_the_data_commands_alone(tmp_path: Path) -> None:
    names, _ = _imported(tmp_path, "update", "--help")
    assert own(names) == START | {"eqrisk.cli.data"}


def test_the_help_lists_every_command_with_its_own_one_line_help() -> None:
    """`COMMANDS` (what `eqrisk --help` lists without importing the commands, in its order)
    names every command of the app, with the one-line help its module gives it. Typer's own
    build registers the commands in the order their modules were first imported, which other
    tests of the same process decide: the names are compared, not that order."""
    group = typer.main.get_command(app)
    assert isinstance(group, OperatorErrors)
    built = {name: group.get_command(None, name) for name in group.list_commands(None)}
    for module in sorted({m for modules, _ in COMMANDS.values() for m in modules}):
        __import__(f"eqrisk.cli.{module}")
    every = typer.main.get_command(app)  # every module imported: typer's own build of the app
    assert isinstance(every, TyperGroup)
    assert sorted(every.commands) == sorted(COMMANDS)
    assert group.list_commands(None) == list(COMMANDS)
    for name, (_, short) in COMMANDS.items():
        assert every.commands[name].get_short_help_str(limit=200) == short
        command = built[name]
        assert command is not None and command.get_short_help_str(limit=200) == short


def test_a_mistyped_command_is_answered_with_the_nearest_one(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "eqrisk", "updat"],
        env={**os.environ, "EQRISK_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "No such command 'updat'. Did you mean 'update'?" in proc.stderr

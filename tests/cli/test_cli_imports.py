"""`eqrisk --help` starts without the heavy libraries: the modules its start imports (read
from `python -X importtime`) hold none of numba, dask, fastapi, pandas, pyarrow, numpy, the
settings (pydantic-settings) or rich (its consoles are made when a command first writes), and
a command's own help loads the settings but not the model's kernels. The daily job (`eqrisk update`) loads none of the libraries of serving, Dask or the
benches (`NOT_FOR_UPDATE`, asserted on a real update by tests/cli/test_update_walk.py).
Asserted on module names, never on time (the times: `eqrisk bench imports`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("numba", "dask", "distributed", "fastapi", "starlette", "pandas", "pyarrow", "uvicorn")
# What the daily job needs none of: the HTTP side, accounts and rate limits, Dask, the object
# store, and the benches' references.
NOT_FOR_UPDATE = (
    "dask", "distributed", "fastapi", "starlette", "uvicorn", "httpx", "sqlalchemy", "redis",
    "limits", "mcp", "stripe", "obstore", "zarr", "prometheus_client", "brotli", "statsmodels",
    "polars", "plotly",
)  # fmt: skip
# Nor a command's help, besides: the model's own libraries and the calendar.
NOT_FOR_HELP = (*NOT_FOR_UPDATE, *HEAVY, "scipy", "exchange_calendars", "xxhash")


def not_for(names: set[str], heavy: tuple[str, ...]) -> list[str]:
    """The modules of `names` from the packages of `heavy`."""
    return sorted(n for n in names if n.split(".")[0] in heavy)


def _imported(home: Path, *args: str) -> tuple[set[str], str]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "eqrisk.cli", *args],
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
    assert "eqrisk.cli.data" in names  # the parse saw the command's own modules
    return names, proc.stdout


def test_eqrisk_help_imports_no_heavy_library_and_no_settings(tmp_path: Path) -> None:
    names, shown = _imported(tmp_path, "--help")
    assert "update" in shown and "serve" in shown
    assert not_for(names, NOT_FOR_HELP) == []
    assert {"eqrisk.settings", "pydantic_settings", "numpy", "rich"}.isdisjoint(names)


@pytest.mark.parametrize("command", ["update", "serve", "bench", "snapshots"])
def test_a_commands_help_does_not_import_the_kernels_or_the_app(
    command: str, tmp_path: Path
) -> None:
    names, shown = _imported(tmp_path, command, "--help")
    assert "Usage" in shown
    assert not_for(names, NOT_FOR_HELP) == []
    assert "eqrisk.snapshot.versions" not in names and "eqrisk.model.run" not in names
    assert "eqrisk.settings" in names  # the settings are read, their default rate not parsed

"""`eqrisk --help` starts without the heavy libraries: the modules its start imports (read
from `python -X importtime`) hold none of numba, dask, fastapi, pandas, pyarrow or the
settings (pydantic-settings), and a command's own help loads the settings but not the model's
kernels. Asserted on module names, never on time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("numba", "dask", "distributed", "fastapi", "starlette", "pandas", "pyarrow", "uvicorn")


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
    assert sorted(n for n in names if n.split(".")[0] in HEAVY) == []
    assert {"eqrisk.settings", "pydantic_settings", "numpy"}.isdisjoint(names)


@pytest.mark.parametrize("command", ["update", "serve", "bench", "snapshots"])
def test_a_commands_help_does_not_import_the_kernels_or_the_app(
    command: str, tmp_path: Path
) -> None:
    names, shown = _imported(tmp_path, command, "--help")
    assert "Usage" in shown
    assert sorted(n for n in names if n.split(".")[0] in HEAVY) == []
    assert "eqrisk.snapshot.versions" not in names and "eqrisk.model.run" not in names

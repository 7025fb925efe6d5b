"""The reliability suite (`pytest -m reliability`; every module sets `pytestmark`): each part
reports one line of figures, and the figures are printed in pytest's terminal summary (so CI's log
carries them whatever the capture mode)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from reliability.figures import LINES, add_figures


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if LINES:
        terminalreporter.section("reliability figures")
        for line in LINES:
            terminalreporter.write_line(line)


@pytest.fixture()
def figures(request: pytest.FixtureRequest) -> Callable[..., None]:
    """`figures(name=value, ...)`: one summary line for this test, also junit properties."""

    def report(**values: object) -> None:
        add_figures(request.node.nodeid, **values)
        request.node.user_properties.extend(values.items())

    return report


@pytest.fixture()
def served_home(demo_home: Path, tmp_path: Path) -> Path:
    """A private home with the demo's ingested data and snapshot; accounts start empty."""
    target = tmp_path / "home"
    for name in ("ingested", "snapshots"):
        shutil.copytree(demo_home / name, target / name)
    return target

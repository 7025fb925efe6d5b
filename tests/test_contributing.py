"""docs/CONTRIBUTING.md says what the code is: every file and symbol its recipes name exists, and
its route table is the one the app registers its routes from (datasette's documentation tests
do the same for its plugin hooks)."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

from eqrisk.api import endpoints
from eqrisk.api.endpoint import Endpoint
from eqrisk.api.endpoints import ENDPOINTS

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "CONTRIBUTING.md"
NAMED = re.compile(r"`((?:src|tests|docs)/[^`\s<>:]+|README\.md)(?:::([A-Za-z_][\w.]*))?`")
ROUTE_ROW = re.compile(r"^\| `(GET|POST) (/[^`]*)` \| (A|B) \| `([^`]+)` \|$")


def named(text: str) -> list[tuple[str, str | None]]:
    """(path, symbol or None) of every file the page names in backticks."""
    return [(m.group(1), m.group(2)) for m in NAMED.finditer(text)]


def defines(source: str, symbol: str) -> bool:
    """`source` defines `symbol` (`Class.method`: the class and, in it, the method)."""
    *outer, name = symbol.split(".")
    if outer and not re.search(rf"^class {re.escape(outer[0])}\b", source, re.MULTILINE):
        return False
    pattern = rf"^\s*(?:async def|def|class) {re.escape(name)}\b|^{re.escape(name)}\s*[:=]"
    return re.search(pattern, source, re.MULTILINE) is not None


def missing(text: str) -> list[str]:
    """What the page names that does not exist."""
    out = []
    for path, symbol in named(text):
        file = ROOT / path
        if not file.exists():
            out.append(path)
        elif symbol is not None and not (file.is_file() and defines(file.read_text(), symbol)):
            out.append(f"{path}::{symbol}")
    return out


def modules_of_endpoints() -> dict[int, str]:
    """id of each Endpoint object -> the file of the module under api/endpoints/ that holds it."""
    found: dict[int, str] = {}
    for info in pkgutil.iter_modules(endpoints.__path__):
        module = importlib.import_module(f"{endpoints.__name__}.{info.name}")
        for value in vars(module).values():
            if isinstance(value, Endpoint):
                found[id(value)] = str(Path(module.__file__ or "").relative_to(ROOT))
    return found


def test_every_file_and_symbol_the_recipes_name_exists() -> None:
    text = PAGE.read_text()
    assert len(named(text)) > 60  # the parser reads the page
    assert missing(text) == []


def test_the_route_table_is_the_apps() -> None:
    rows = [m.groups() for m in map(ROUTE_ROW.match, PAGE.read_text().splitlines()) if m]
    where = modules_of_endpoints()
    expected = [
        (e.method, e.path, {"risk": "B", "daily": "A"}[e.service], where[id(e)]) for e in ENDPOINTS
    ]
    assert rows == expected


@pytest.mark.parametrize(
    "line",
    [
        "`src/eqrisk/api/nowhere.py`",
        "`src/eqrisk/api/gate.py::NoSuchThing`",
        "`src/eqrisk/api/gate.py::Meter.no_such_method`",
        "`tests/api/test_request_path.py::test_that_was_never_written`",
    ],
)
def test_a_wrong_name_would_fail_the_check(line: str) -> None:
    assert missing(line) == [line.strip("`")]
    assert missing("`src/eqrisk/api/gate.py::Meter.admit`") == []

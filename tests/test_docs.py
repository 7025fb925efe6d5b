"""The README says what the code does: every price of the one price table, every setting of the
one settings object and every error code of the one error table, each in its README table (the
project's counterpart of datasette's test_settings_are_documented)."""

from __future__ import annotations

import re
from pathlib import Path

from eqrisk.accounts.pricing import DEFAULT_PRICES
from eqrisk.api.endpoints import route_of
from eqrisk.api.errors import CODES
from eqrisk.settings import Settings

README = Path(__file__).resolve().parents[1] / "README.md"
CONFIGURATION = README.parent / "docs" / "CONFIGURATION.md"  # the settings table, linked
ANSWERS = README.parent / "docs" / "decisions" / "answers.md"  # the error table, linked
README_MAX_LINES = 350  # the user's guide stays short: details go to docs/decisions/<topic>.md
ROW = re.compile(r"^\| `(GET|POST) (/[^`]*)` \| (A|B) \| `([^`]+)` \| (.+?) \|$")


SETTING_ROW = re.compile(r"^\| ((?:`EQRISK_[A-Z0-9_]+`(?:, )?)+) \|")
ERROR_ROW = re.compile(r"^\| `([A-Z_]+)` \| (\d{3}) \| (.+?) \|$")


def section(title: str, text: str | None = None) -> list[str]:
    """The lines of one `## title` section of the README (or of `text`)."""
    text = README.read_text() if text is None else text
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0].splitlines()


def price_rows() -> list[tuple[str, str, str, str, str]]:
    """The rows of the README's price table: (method, path, service, price key, price)."""
    return [m.groups() for m in map(ROW.match, section("Prices")) if m]  # type: ignore[misc]


def documented_settings(text: str | None = None) -> list[str]:
    """The variables named in the first column of the settings table (docs/CONFIGURATION.md,
    which the README's Configuration section links)."""
    text = CONFIGURATION.read_text() if text is None else text
    names: list[str] = []
    for match in filter(None, map(SETTING_ROW.match, section("Settings", text))):
        names += re.findall(r"`(EQRISK_[A-Z0-9_]+)`", match.group(1))
    return names


def documented_errors(text: str | None = None) -> dict[str, int]:
    """The error table (docs/decisions/answers.md, which the README's Errors section links):
    code -> status."""
    text = ANSWERS.read_text() if text is None else text
    rows = filter(None, map(ERROR_ROW.match, section("Errors", text)))
    return {m.group(1): int(m.group(2)) for m in rows}


def test_the_readme_lists_every_price_key_once_with_its_price() -> None:
    rows = price_rows()
    keys = [row[3] for row in rows]
    assert sorted(keys) == sorted(DEFAULT_PRICES), "README price table and DEFAULT_PRICES differ"
    for _, path, _, key, price in rows:
        assert price == DEFAULT_PRICES[key].describe(), (path, key, price)


def test_each_readme_route_is_the_route_its_price_key_meters() -> None:
    for _, path, service, key, _ in price_rows():
        routed = route_of(path.replace("{ticker}", "NVDA"))
        if routed is None:  # open routes (health) are never metered
            assert DEFAULT_PRICES[key].describe() == "free", path
            continue
        assert routed == ({"A": "daily", "B": "risk"}[service], key), path


def test_a_changed_price_would_fail_the_check() -> None:
    """The comparison is on the words the README shows, so a new price is a visible diff."""
    from eqrisk.accounts.pricing import Price

    assert Price(250).describe() == "0.005 USD per call"
    assert Price(100, "ticker", 500).describe() == (
        "0.002 USD per succeeded ticker, minimum 0.01 USD per call"
    )
    assert Price(0).describe() == "free"


def test_every_setting_is_in_the_configuration_table_once() -> None:
    variables = [f"EQRISK_{name.upper()}" for name in Settings.model_fields]
    documented = documented_settings()
    assert len(documented) == len(set(documented)), "a variable is listed twice"
    assert sorted(documented) == sorted(variables), (
        f"missing from docs/CONFIGURATION.md: {sorted(set(variables) - set(documented))}; "
        f"listed but not a setting: {sorted(set(documented) - set(variables))}"
    )


def test_every_error_code_is_in_the_readme_error_table_with_its_status() -> None:
    expected = {code: status for code, (status, _) in CODES.items()}
    assert documented_errors() == expected


def test_a_missing_setting_or_error_code_would_fail_the_checks() -> None:
    """The parsers read the tables as they are: drop one row and its name is gone."""
    text = CONFIGURATION.read_text()
    without = "\n".join(
        line for line in text.splitlines() if not line.startswith("| `EQRISK_MARKET_ETF` |")
    )
    assert "EQRISK_MARKET_ETF" in documented_settings(text)
    assert "EQRISK_MARKET_ETF" not in documented_settings(without)
    assert set(documented_settings(text)) - set(documented_settings(without)) == {
        "EQRISK_MARKET_ETF"
    }
    text = ANSWERS.read_text()
    without = text.replace("| `NO_DATA` | 404 |", "| `NO_DATA` | 410 |")
    assert documented_errors(without)["NO_DATA"] == 410 != documented_errors(text)["NO_DATA"]


# ------------------------------------------------------- the user's guide and the pages it links

ROOT = README.parent
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
DECISIONS = ROOT / "docs" / "decisions"


def linked_pages(start: Path = README) -> dict[Path, str]:
    """The README and every page of the repository reachable from it by relative Markdown links
    (a folder stands for its README.md): path -> text."""
    seen: dict[Path, str] = {}
    todo = [start.resolve()]
    while todo:
        page = todo.pop()
        if page in seen or not page.is_file() or page.suffix != ".md":
            continue
        seen[page] = page.read_text()
        for target in LINK.findall(seen[page]):
            if "://" in target or target.startswith("mailto:"):
                continue
            path = (page.parent / target).resolve()
            todo.append(path / "README.md" if path.is_dir() else path)
    return seen


def broken_links() -> list[str]:
    """Relative links of the README and the docs that point at nothing."""
    out = []
    for page in [README, *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in LINK.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                out.append(f"{page.relative_to(ROOT)} -> {target}")
    return out


def documented(text: str, path: str) -> bool:
    """`path` (a route) is named in `text`: whole, not as the start of a longer path."""
    if path == "/":
        return "`/`" in text
    text = re.sub(r"https?://[\w.:-]+", "", text)  # http://127.0.0.1:8000/docs names /docs
    return re.search(rf"(?<![\w.:/]){re.escape(path)}(?![\w/-])", text) is not None


def app_routes() -> list[str]:
    """Every path the app registers: the endpoints of both services, the open routes, the page,
    its static files and the MCP mount."""
    from fastapi.routing import APIRoute
    from starlette.routing import Mount, Route

    from eqrisk.api.app import create_app
    from eqrisk.cli.mcp import MCP_PATH  # mounted by `eqrisk serve` beside the app

    app = create_app(Settings(_env_file=None))
    paths = [r.path for r in app.routes if isinstance(r, (APIRoute, Route, Mount))]
    return sorted({*paths, MCP_PATH, "/openapi.json"} - {"/docs/oauth2-redirect"})


def test_every_link_of_the_docs_resolves() -> None:
    assert broken_links() == []


def test_the_readme_links_the_decisions_index_and_the_index_every_page() -> None:
    pages = linked_pages()
    index = DECISIONS / "README.md"
    assert index.resolve() in pages
    listed = set(LINK.findall(index.read_text()))
    missing = sorted(p.name for p in DECISIONS.glob("*.md") if p.name != "README.md")
    assert [name for name in missing if name not in listed] == [], "add a line to the index"


def test_every_setting_is_named_in_the_docs() -> None:
    corpus = "\n".join(linked_pages().values())
    variables = [f"EQRISK_{name.upper()}" for name in Settings.model_fields]
    assert [v for v in variables if not re.search(rf"\b{v}\b", corpus)] == []


def test_every_route_the_app_registers_is_named_in_the_docs() -> None:
    routes = app_routes()
    assert {"/api/metrics/{ticker}", "/daily", "/api/health", "/api/ready", "/", "/mcp"} <= set(
        routes
    )
    corpus = "\n".join(linked_pages().values())
    assert [path for path in routes if not documented(corpus, path)] == []


def test_every_error_code_the_api_emits_is_in_the_error_table() -> None:
    """Every code literal passed to the error helpers under src/eqrisk/api is in CODES (which
    they look up, so nothing else can be sent), and every code of CODES is in the error table."""
    import ast

    helpers = {"ApiError", "problem_response", "problem_body", "raw_problem", "_problem"}
    helpers |= {"_refuse", "_write"}
    found: set[str] = set()
    for file in (ROOT / "src" / "eqrisk" / "api").rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name in helpers:
                found |= {
                    a.value
                    for a in node.args
                    if isinstance(a, ast.Constant)
                    and isinstance(a.value, str)
                    and re.fullmatch(r"[A-Z]+(?:_[A-Z]+)+", a.value)
                }
    assert len(found) > 10  # the scan reads the calls
    assert found <= set(CODES), found - set(CODES)
    assert set(documented_errors()) == set(CODES)


def test_a_missing_route_or_page_would_fail_the_checks() -> None:
    text = README.read_text()
    assert documented(text, "/api/ticker-returns")
    assert not documented(text.replace("/api/ticker-returns", "/api/x"), "/api/ticker-returns")
    assert not documented("`/api/metrics/{ticker}/more`", "/api/metrics/{ticker}")
    assert not documented("see /dailyx", "/daily")
    assert documented("at http://127.0.0.1:8000/docs.", "/docs")


SHELL = re.compile(r"^( *)```(?:bash|sh|shell)\n(.*?)^\1```", re.M | re.S)


def shell_examples(text: str) -> list[str]:
    """The lines of every shell block of a Markdown text, comments dropped."""
    lines = []
    for _, block in SHELL.findall(text):
        lines += [line.split(" #", 1)[0].strip() for line in block.splitlines()]
    return [line for line in lines if line]


def outside_files(line: str) -> list[str]:
    """Paths in a shell line that name a file the reader does not have: a parent folder, an
    absolute path other than a scratch one, or an input file that no command of the README
    makes (`eqrisk demo --export` writes the example data)."""
    from eqrisk.data.demo import EXPORT_FILES

    out = []
    tokens = line.replace("=", " ").split()
    for i, token in enumerate(tokens):
        token = token.strip("'\"")
        if "://" in token:
            continue
        if "../" in token or (token.startswith("/") and not token.startswith("/tmp/")):
            out.append(token)
        elif re.search(r"\.(csv|csv\.gz|parquet|json)$", token) and tokens[i - 1] != "--out":
            exported = token.startswith("demo-data/") and token[10:] in EXPORT_FILES.values()
            out += [] if exported else [token]
    return out


def test_the_readme_shell_examples_use_only_files_the_reader_has() -> None:
    lines = shell_examples(README.read_text())
    assert any(line.startswith("eqrisk demo --export demo-data") for line in lines)
    assert any("demo-data/prices.csv.gz" in line for line in lines)
    assert {line: outside_files(line) for line in lines if outside_files(line)} == {}
    assert outside_files("eqrisk ingest ../shared/data/prices.csv.gz") == [
        "../shared/data/prices.csv.gz"
    ]
    assert outside_files("eqrisk update new_days.csv") == ["new_days.csv"]
    assert outside_files("eqrisk fetch --out new_days.csv") == []


SOURCES = {".py", ".md", ".js", ".toml"}


def test_nothing_names_the_old_decisions_file() -> None:
    """docs/DECISIONS.md became docs/decisions/<topic>.md: no page, source file or test cites it."""
    stale = []
    for folder in ("src", "tests", "docs", "examples"):
        for file in (ROOT / folder).rglob("*"):
            text = file.read_text(errors="replace") if file.suffix in SOURCES else ""
            if "DECISIONS.md" in text and file != Path(__file__):
                stale.append(str(file.relative_to(ROOT)))
    for file in (README, ROOT / "pyproject.toml"):
        if "DECISIONS.md" in file.read_text():
            stale.append(file.name)
    assert stale == []


def test_the_first_screen_says_the_python_it_needs_and_two_commands() -> None:
    """Issue 39: before the first rule, the README names the Python version pyproject requires
    and a virtual environment, and still holds exactly two set-up commands: one starts the
    services on the demo data, one runs the tests."""
    import tomllib

    first = README.read_text().split("\n---\n", 1)[0]
    needs = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    version = needs.removeprefix(">=")
    assert needs.startswith(">=") and f"Python {version} or newer" in first
    assert "virtual environment" in first and "python3 -m venv .venv" in first
    blocks = [block.strip() for _, block in SHELL.findall(first)]
    assert len(blocks) == 2, blocks
    assert blocks[0].endswith("eqrisk demo") and blocks[1].endswith("python -m pytest")


def test_the_readme_stays_a_short_guide() -> None:
    """Issue 34: at most README_MAX_LINES lines; the error table is a link away."""
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    assert "docs/decisions/answers.md#errors" in "\n".join(section("Errors", text))

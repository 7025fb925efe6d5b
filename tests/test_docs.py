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
    """The variables named in the first column of the README's configuration table."""
    names: list[str] = []
    for match in filter(None, map(SETTING_ROW.match, section("Configuration", text))):
        names += re.findall(r"`(EQRISK_[A-Z0-9_]+)`", match.group(1))
    return names


def documented_errors(text: str | None = None) -> dict[str, int]:
    """The README's error table: code -> status."""
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


def test_every_setting_is_in_the_readme_configuration_table_once() -> None:
    variables = [f"EQRISK_{name.upper()}" for name in Settings.model_fields]
    documented = documented_settings()
    assert len(documented) == len(set(documented)), "a variable is listed twice"
    assert sorted(documented) == sorted(variables), (
        f"missing from the README: {sorted(set(variables) - set(documented))}; "
        f"listed but not a setting: {sorted(set(documented) - set(variables))}"
    )


def test_every_error_code_is_in_the_readme_error_table_with_its_status() -> None:
    expected = {code: status for code, (status, _) in CODES.items()}
    assert documented_errors() == expected


def test_a_missing_setting_or_error_code_would_fail_the_checks() -> None:
    """The parsers read the tables as they are: drop one row and its name is gone."""
    text = README.read_text()
    without = "\n".join(
        line for line in text.splitlines() if not line.startswith("| `EQRISK_MARKET_ETF` |")
    )
    assert "EQRISK_MARKET_ETF" in documented_settings(text)
    assert "EQRISK_MARKET_ETF" not in documented_settings(without)
    assert set(documented_settings(text)) - set(documented_settings(without)) == {
        "EQRISK_MARKET_ETF"
    }
    without = text.replace("| `NO_DATA` | 404 |", "| `NO_DATA` | 410 |")
    assert documented_errors(without)["NO_DATA"] == 410 != documented_errors(text)["NO_DATA"]

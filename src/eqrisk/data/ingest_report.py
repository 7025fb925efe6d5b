"""The ingest report: its errors, the issue codes and their severities, the per-code summary
with examples, and its rendering for the terminal. Every step of an ingest adds to one `Issues`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table


class IngestError(ValueError):
    """A file that cannot be read, or whose columns are not recognised."""


class IngestRefused(IngestError):
    """The ingest would lose data (a much smaller data set, mostly rejected rows): nothing was
    written to the data set; `replace=True` (`--replace`) overrides."""


# --------------------------------------------------------------------------------------------
# Report


@dataclass
class IngestReport:
    started_at: str
    finished_at: str
    files: list[str]
    data_source: str
    rows_read: int
    rows_kept: int
    rows_rejected: int
    rows_flagged: int
    symbols: int  # in the ingested data set as written (after a merge: the union)
    sessions: int
    first_date: str | None
    last_date: str | None
    issues: list[dict[str, Any]] = field(default_factory=list)
    report_dir: str = ""
    # --shares: {file, rows, symbols_with_shares, unmatched}; None without a share file
    shares: dict[str, Any] | None = None
    # A merge: per new session {date, symbols, previous, share} (priced symbols against the
    # session before it); and whether it changed nothing (then nothing was written).
    coverage: list[dict[str, Any]] = field(default_factory=list)
    nothing_new: bool = False

    @property
    def ok(self) -> bool:
        """False when any issue has severity error (rejected rows, empty files, bad master rows)."""
        return not any(issue["severity"] == "error" for issue in self.issues)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["ok"] = self.ok
        return out


MAX_EXAMPLES = 5

# Issue codes: severity and the message shown in the report.
_CODES: dict[str, tuple[str, str]] = {
    "MALFORMED_ROW": ("error", "CSV line with the wrong number of fields: rejected"),
    "MISSING_SYMBOL": ("error", "empty symbol: row rejected"),
    "BAD_SYMBOL": (
        "error",
        "symbol outside the accepted set (a letter, digit or ^, then letters, digits and . - / ^ "
        "_, at most 20): row rejected",
    ),
    "BAD_DATE": ("error", "date cannot be parsed: row rejected"),
    "NOT_A_SESSION": ("error", "date is not an NYSE session (weekend or holiday): row rejected"),
    "NON_NUMERIC_PRICE": (
        "error",
        "a price, volume, shares or market-cap cell is not a number: row rejected",
    ),
    "MISSING_PRICE": ("error", "long-format row without a close: row rejected"),
    "NON_POSITIVE_PRICE": ("error", "price, shares or market cap <= 0, or volume < 0: rejected"),
    "PRICE_OUT_OF_RANGE": (
        "error",
        "price outside [min_price, max_price] (no price can be): row rejected",
    ),
    "DUPLICATE_ROW": ("error", "duplicate (symbol, date): the first is kept, the others rejected"),
    "EMPTY": ("error", "file has no usable rows"),
    "NO_DATA": ("error", "no usable price rows at all: the ingested data set was left unchanged"),
    "BAD_ASSET_TYPE": ("error", "master asset_type is not stock, etf or index: treated as stock"),
    "MISSING_FROM_MASTER": (
        "warning",
        "symbol has prices but no master row (and is no known ETF): kept as an unclassified stock",
    ),
    "MISSING_PRICES": ("warning", "master symbol has no prices"),
    "PARTIAL_CAPS": (
        "warning",
        "stock without a market cap or share count while others have one: weighted in group "
        "portfolios by the median cap of its group that day",
    ),
    "UNKNOWN_SECTOR": ("warning", "GICS sector not in the reference table: no sector ETF/factor"),
    "GICS_RENAMED": (
        "info",
        "retired GICS sector or sub-industry name read as its current name (reference table "
        "gics_renames.csv): the stock keeps its levels",
    ),
    "LEVEL_MISSING": (
        "warning",
        "stock without a sector (L2) or subsector (L3) level, with why: every one is listed in "
        "levels.csv",
    ),
    "DUPLICATE_MASTER_ROW": ("warning", "symbol repeated in the master: the first row is kept"),
    "MASTER_NO_SYMBOL": ("warning", "master row without a symbol: skipped"),
    "BAD_SHARES": ("warning", "master shares/market cap not a positive number: left empty"),
    "SHARES_UNMATCHED": ("warning", "share-file symbol not in the master: ignored"),
    "SPLIT_SUSPECTED": (
        "warning",
        "a move of a split ratio whose level stays, with no volume rush nor co-movers: an "
        "unadjusted split? Left out of the model; see return_decisions.csv",
    ),
    "DISTRIBUTION_SUSPECTED": (
        "warning",
        "a large fall that stays, opened at the new level, with no volume rush nor co-movers: a "
        "spin-off or special dividend without a factor? Left out of the model; see "
        "return_decisions.csv",
    ),
    "PRINT_REVERSED": (
        "warning",
        "a print that reverses within three sessions: its returns are left out of the model; "
        "see return_decisions.csv",
    ),
    "FACTOR_MISMATCH": (
        "warning",
        "a jump the vendor's split/dividend factors do not explain: left out of the model like a "
        "split without a factor; see return_decisions.csv",
    ),
    "RETURN_DECISIONS": (
        "info",
        "returns kept, left out or adjusted as the return-decisions file says",
    ),
    "ACTIONS_APPLIED": (
        "info",
        "symbols whose closes were adjusted with the corporate-actions file (total returns)",
    ),
    "LARGE_MOVE": ("warning", "one-day |return| above max_move: row kept, listed in flagged.csv"),
}


def issue_message(code: str) -> str:
    """The report's message of an issue code."""
    return _CODES[code][1]


# Row-level rejection reasons, in the order they are tested (bit i of a row's flags).
ROW_CODES = (
    "MISSING_SYMBOL",
    "BAD_DATE",
    "NOT_A_SESSION",
    "NON_NUMERIC_PRICE",
    "MISSING_PRICE",
    "NON_POSITIVE_PRICE",
    "PRICE_OUT_OF_RANGE",
    "DUPLICATE_ROW",
    "BAD_SYMBOL",
)
ROW_BIT = {code: np.uint16(1 << i) for i, code in enumerate(ROW_CODES)}


class Issues:
    """Issues summarised per (severity, code): count, message, up to MAX_EXAMPLES examples."""

    def __init__(self) -> None:
        self._items: dict[tuple[str, str], dict[str, Any]] = {}

    def add(
        self,
        code: str,
        count: int,
        examples: Iterable[Any] = (),
        *,
        message: str | None = None,
        severity: str | None = None,
    ) -> None:
        if count <= 0:
            return
        default_severity, default_message = _CODES[code]
        severity = severity or default_severity
        item = self._items.setdefault(
            (severity, code),
            {
                "severity": severity,
                "code": code,
                "count": 0,
                "message": message or default_message,
                "examples": [],
            },
        )
        item["count"] += int(count)
        for example in examples:
            if len(item["examples"]) >= MAX_EXAMPLES:
                break
            item["examples"].append(_jsonable(example))

    def as_list(self) -> list[dict[str, Any]]:
        order = {code: i for i, code in enumerate(_CODES)}
        return sorted(
            self._items.values(),
            key=lambda it: (it["severity"] != "error", order.get(it["code"], 99)),
        )


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return None if value != value else round(value, 10)
    if isinstance(value, pd.Timestamp | datetime):
        return value.strftime("%Y-%m-%d")
    return value


# --------------------------------------------------------------------------------------------
# Rendering


def _format_example(example: Any) -> str:
    if not isinstance(example, dict):
        return str(example)
    if "file" in example and "row" in example and "symbol" in example:
        text = f"{example.get('symbol') or '?'} {example.get('date') or '?'}"
        text += f" ({example['file']}:{example['row']})"
        if example.get("value"):
            text += f" {example['value']}"
        return text
    if "return" in example:
        return (
            f"{example['symbol']} {example['date']} {example['prev_close']:g} -> "
            f"{example['close']:g} ({example['return']:+.0%})"
        )
    return ", ".join(f"{k}={v}" for k, v in example.items())


def render_report(report: IngestReport, console: Console) -> None:
    """A readable summary: status, counts, a table of issues with examples, where files are."""
    status = "[bold green]OK[/]" if report.ok else "[bold red]ERRORS[/]"
    console.print(f"[bold]Ingest[/] {report.data_source}: {status}")
    summary = Table(show_header=False, box=None, pad_edge=False)
    summary.add_column(style="dim")
    summary.add_column()
    summary.add_row("files", "\n".join(report.files) or "-")
    summary.add_row(
        "rows",
        f"{report.rows_read:,} read, {report.rows_kept:,} kept, "
        f"{report.rows_rejected:,} rejected, {report.rows_flagged:,} flagged",
    )
    span = f"{report.first_date} .. {report.last_date}" if report.first_date else "-"
    summary.add_row("data set", f"{report.symbols:,} symbols, {report.sessions:,} sessions, {span}")
    if report.shares is not None:
        summary.add_row(
            "shares",
            f"{report.shares['symbols_with_shares']:,} symbols got a share count from "
            f"{Path(report.shares['file']).name} ({report.shares['rows']:,} rows, "
            f"{report.shares['unmatched']:,} not in the master)",
        )
    for day in report.coverage:
        summary.add_row(
            "session",
            f"{day['date']}: {day['symbols']:,} symbols priced of the {day['previous']:,} the "
            f"session before had ({day['share']:.0%})",
        )
    if report.nothing_new:
        summary.add_row("merge", "nothing new: every row equals the stored one")
    console.print(summary)
    if report.issues:
        table = Table(title="Issues", show_lines=False, expand=False)
        table.add_column("severity")
        table.add_column("code", style="bold")
        table.add_column("count", justify="right")
        table.add_column("what")
        table.add_column("examples", overflow="fold")
        for issue in report.issues:
            colour = "red" if issue["severity"] == "error" else "yellow"
            table.add_row(
                f"[{colour}]{issue['severity']}[/]",
                issue["code"],
                f"{issue['count']:,}",
                issue["message"],
                "\n".join(_format_example(e) for e in issue["examples"]),
            )
        console.print(table)
    else:
        console.print("[green]no issues[/]")
    folder = Path(report.report_dir)
    console.print(
        f"report: {folder / 'report.json'}\n"
        f"rejected rows: {folder / 'rejected.csv'} ({report.rows_rejected:,})\n"
        f"flagged rows: {folder / 'flagged.csv'} ({report.rows_flagged:,})"
    )

"""The read stage of an ingest: every given file read (`read_inputs`), the new rows validated
(`check_rows`) and the rows kept (`kept_rows`); nothing is written here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from eqrisk.data import panel
from eqrisk.data.cells import InputLimits
from eqrisk.data.corporate_actions import apply_actions, read_actions
from eqrisk.data.ingest_report import ROW_BIT, ROW_CODES, IngestError, Issues
from eqrisk.data.master_files import read_master_checked, read_shares_checked
from eqrisk.data.price_files import empty_prices, read_prices
from eqrisk.data.return_decisions import Decision, read_decisions
from eqrisk.data.row_checks import row_examples, validate_rows


@dataclass
class Inputs:
    """What the given files held, before any row is validated."""

    paths: list[Path]
    frames: list[pd.DataFrame]
    malformed: list[tuple[str, int | None, str]]
    actions: pd.DataFrame | None
    master: pd.DataFrame | None
    shares: pd.DataFrame | None
    shares_path: Path | None = None


@dataclass
class Checked:
    """The new price rows (all files, in file order) and the verdict on each row."""

    new: pd.DataFrame
    flags: np.ndarray
    dup_of: dict[int, int]
    kept: np.ndarray


def read_inputs(
    price_paths: list[Path],
    master: Path | None,
    shares: Path | None,
    actions: Path | None,
    how: tuple[str, dict[str, str] | None, str | None, InputLimits],
    issues: Issues,
    say: Callable[[str], None],
) -> Inputs:
    """Every given file read (nothing validated yet); IngestError for one that cannot be.
    `how`: the price basis, the column mapping, the price files' date format, the limits."""
    basis, columns, date_format, limits = how
    action_table = None
    if actions is not None:
        try:
            action_table = read_actions(actions, limits=limits)  # its own date format
        except ValueError as exc:
            raise IngestError(str(exc)) from exc
    inputs = Inputs(price_paths, [], [], action_table, None, None)
    for path in price_paths:
        say(f"reading {path.name}")
        frame = read_prices(
            path, basis=basis, columns=columns, date_format=date_format, limits=limits
        )
        inputs.malformed += [(path.name, n, text) for n, text in frame.attrs.get("malformed", [])]
        inputs.frames.append(frame)
    if master is not None:
        say(f"reading master {Path(master).name}")
        inputs.master = read_master_checked(Path(master), issues, limits)
    if shares is not None:
        say(f"reading share counts {Path(shares).name}")
        inputs.shares_path = Path(shares)
        inputs.shares = read_shares_checked(inputs.shares_path, issues, limits)
    return inputs


def check_rows(inputs: Inputs, issues: Issues, limits: InputLimits) -> Checked:
    """All new rows in one frame, validated; each rejection reason and each file that kept no
    row becomes an issue."""
    nonempty = [f for f in inputs.frames if len(f)]
    if nonempty:
        new = pd.concat(nonempty, ignore_index=True) if len(nonempty) > 1 else nonempty[0]
    else:
        new = empty_prices()
    new.attrs = {}
    flags, dup_of = validate_rows(new, (limits.min_price, limits.max_price))
    issues.add(
        "MALFORMED_ROW",
        len(inputs.malformed),
        [{"file": f, "row": n, "text": t[:200]} for f, n, t in inputs.malformed],
    )
    for code in ROW_CODES:
        rows = np.flatnonzero(flags & ROW_BIT[code])
        detail = code in ("NON_NUMERIC_PRICE", "NON_POSITIVE_PRICE", "PRICE_OUT_OF_RANGE")
        message = None
        if code == "PRICE_OUT_OF_RANGE":
            message = (
                f"price outside [{limits.min_price:g}, {limits.max_price:g}] (settings "
                "min_price, max_price; --min-price, --max-price): row rejected"
            )
        bounds = (limits.min_price, limits.max_price)
        examples = row_examples(new, rows, detail=detail, bounds=bounds)
        issues.add(code, len(rows), examples, message=message)
    kept = flags == 0
    offset = 0
    for path, frame in zip(inputs.paths, inputs.frames, strict=True):
        n_kept = int(kept[offset : offset + len(frame)].sum()) if len(frame) else 0
        offset += len(frame)
        if n_kept == 0:
            issues.add("EMPTY", 1, [{"file": str(path), "rows_read": len(frame)}])
    return Checked(new, flags, dup_of, kept)


def kept_rows(checked: Checked, inputs: Inputs, issues: Issues) -> pd.DataFrame:
    """The rows this ingest keeps, split-adjusted by the action table."""
    kept = checked.new.loc[checked.kept, panel.PRICE_COLUMNS]
    if inputs.actions is not None:
        kept, adjusted = apply_actions(kept, inputs.actions)
        issues.add("ACTIONS_APPLIED", len(adjusted), adjusted)
    return kept


def decisions_file(path: Path | None) -> list[Decision]:
    if path is None:
        return []
    try:
        return read_decisions(Path(path))
    except ValueError as exc:
        raise IngestError(str(exc)) from exc

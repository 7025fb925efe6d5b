"""Ingestion: daily price files and a security master -> the ingested data set, with a report.

Price files are CSV, CSV.gz or Parquet, WIDE (`date` + one column per symbol) or LONG
(`date, symbol, close|adjusted_close, [open, high, low, volume, shares|market_cap]`). Every row
is validated; bad rows are rejected into `rejected.csv` with their reason, suspicious ones are
kept and listed in `flagged.csv`, and `report.json` summarises it all, so nothing is lost
silently. `eqrisk ingest` calls `ingest()` and `render_report()`.

Cells are read as text (pyarrow) and parsed with vectorised kernels, so a stray text cell is
reported rather than crashing the read; the two real data files ingest in a few seconds.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from eqrisk.data import ingested, panel
from eqrisk.data.caps import uncapped_stocks
from eqrisk.data.cells import PRICE_SUFFIXES, InputLimits
from eqrisk.data.columns import (
    expand_price_paths,
)
from eqrisk.data.daily import (
    basis_for,
    cap_day,
    coverage,
    coverage_refusal,
    kept_breaks,
    merged_meta,
    same_master,
)
from eqrisk.data.ingest_read import (
    Checked,
    Inputs,
    check_rows,
    decisions_file,
    kept_rows,
    read_inputs,
)
from eqrisk.data.ingest_refusals import refused
from eqrisk.data.ingest_report import (
    MAX_EXAMPLES,
    IngestError,
    IngestRefused,
    IngestReport,
    Issues,
)
from eqrisk.data.levels import level_issue, missing_levels
from eqrisk.data.master import Mappings, etf_registry
from eqrisk.data.master_files import (
    apply_shares,
    last_prices,
)
from eqrisk.data.merge_rows import Combined, combine, previous_master, whole_reasons
from eqrisk.data.price_files import source_label
from eqrisk.data.return_cleaning import Cleaned, clean_returns, report_cleaning
from eqrisk.data.return_decisions import Decision, decisions_from_meta, merged
from eqrisk.data.return_signatures import price_kind
from eqrisk.data.row_checks import large_moves, rejected_frame


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _make_report_dir(home: Path, now: datetime) -> Path:
    base = home / "reports"
    base.mkdir(parents=True, exist_ok=True)
    stamp = now.strftime("%Y%m%dT%H%M%S%f")
    for k in range(1000):
        folder = base / (f"ingest-{stamp}" if k == 0 else f"ingest-{stamp}-{k}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise RuntimeError(f"cannot create a report folder under {base}")


def _empty_master() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in panel.RAW_MASTER_COLUMNS})


def ingest(
    prices: list[Path],
    master: Path | None,
    *,
    home: Path,
    max_move: float | None = None,
    merge: bool = False,
    replace: bool = False,
    prices_basis: str | None = None,
    actions: Path | None = None,
    keep_split_moves: bool | None = None,
    columns: dict[str, str] | None = None,
    data_source: str | None = None,
    progress: Callable[[str], None] | None = None,
    shares: Path | None = None,
    return_decisions: Path | None = None,
    rejudge: bool = False,
    partial: bool = False,
    min_coverage: float = 0.5,
    date_format: str | None = None,
    limits: InputLimits | None = None,
    mappings: Mappings | None = None,
    whole: bool = False,
    block_symbols: int | None = None,
    skip_bad_rows: bool = False,
) -> IngestReport:
    """Read, validate and store price files (and a master); write the report folder.

    Rejected rows (errors) are left out and listed in `rejected.csv`; large moves are kept and
    listed in `flagged.csv`; `report.json` holds `IngestReport.to_dict()`. Without a master the
    previously ingested one is kept (else an empty one). `merge=True` unions with the previously
    ingested data set, new rows replacing old ones for the same (symbol, date) and new master
    rows replacing old ones. When no row at all is usable, the ingested data set is left as it
    was (issue NO_DATA). `shares` is a share-count file (`read_shares`) merged into the master's
    `shares` (the report's `shares` says how many symbols got one). Raises IngestError for a file
    that cannot be read or whose columns are not recognised (before anything is written), and
    IngestRefused (after writing the report, leaving the data set as it was) for an ingest
    without `merge` that would replace the data set with a much smaller one or whose rows are
    mostly rejected, unless `replace=True`. Dates are read with one format per file:
    `date_format` (`dates.DATE_FORMATS` or a strptime pattern), else the one each file's date
    column admits (IngestError, naming the formats seen, for an ambiguous or mixed column).
    `limits` (settings `min_price`, `max_price`, `max_line_bytes`, `max_cell_bytes`): a price
    outside the bounds rejects its row (PRICE_OUT_OF_RANGE); a longer line or cell is an
    IngestError at once. Every stock that will lack a sector or subsector level under
    `mappings` (default: the project's tables) is listed in `levels.csv` with why.

    The basis options (`daily.BASIS_OPTIONS`: `prices_basis`, `max_move`, `keep_split_moves`,
    `columns`, `date_format`; None = not stated) are recorded with the data set; a merge runs with the
    recorded ones and raises `daily.BasisConflict` (nothing read, nothing written) for a stated
    one that differs. A merge judges returns (the cleaning stage) only on the (symbol, date)
    pairs it adds or changes, keeping the stored verdicts on the others, unless `rejudge`. It
    keeps the data set's name (`merged_files` lists what was merged), writes nothing when it
    changes nothing (`report.nothing_new`), and raises IngestRefused (report written) when a
    new session has prices for less than `min_coverage` of the symbols of the session before
    it, unless `partial`. A merge reads and rewrites only the partitions its rows fall in and
    the rows around them (`merge_rows`), unless it must see the whole history (`rejudge`,
    return decisions, a share-count file, master market caps) or `whole` asks for it. A new
    data set stores `block_symbols` symbols per block (None: `ingested.BLOCK_SYMBOLS`); a merge
    keeps the stored set's.

    All or nothing: an ingest with any rejected row (or malformed line) raises IngestRefused
    (report written, data set unchanged) unless `skip_bad_rows`, which takes the good rows
    (`report.rows_kept` of them).
    """
    say = progress or (lambda _message: None)
    started = _utc_now()
    home = Path(home).expanduser()
    ingested.recover_ingested(home)
    price_paths, found = _given_and_stored(prices, home, merge)
    old_meta = found.meta if found is not None else None
    given = {"prices_basis": prices_basis, "max_move": max_move, "date_format": date_format,
             "keep_split_moves": keep_split_moves, "columns": columns}  # fmt: skip
    basis = _basis(given, old_meta, merge)
    issues = Issues()
    decisions = decisions_file(return_decisions)
    limits = limits or InputLimits()
    # Read: every file, then every new row validated.
    inputs = read_inputs(
        price_paths,
        master,
        shares,
        actions,
        (basis["prices_basis"], basis["columns"] or None, basis["date_format"], limits),
        issues,
        say,
    )
    kind = _price_kind(basis["prices_basis"], inputs, old_meta)
    say("validating")
    checked = check_rows(inputs, issues, limits)
    # Merge and judge: the kept rows over the stored ones, their returns cleaned.
    why_whole = whole_reasons(
        found, rejudge=rejudge, decisions=bool(decisions), shares=inputs.shares is not None,
        master_caps=_caps_need_prices(inputs.master), whole=whole,
    )  # fmt: skip
    old_master = _old_master(found, home, merge or master is not None)
    how = (inputs, old_master, home, old_meta, decisions, kind, basis["keep_split_moves"])
    combined, cleaned = _merge_and_judge(
        kept_rows(checked, inputs, issues), found, why_whole, block_symbols, how, rejudge
    )
    report_cleaning(cleaned, basis["keep_split_moves"], issues)
    final = cleaned.final
    flagged = _flag_moves(final, float(basis["max_move"]), issues)
    fresh = bool(final["_fresh"].any())
    final = final.drop(columns=["_new", "_fresh"])
    placed = combined.placed(final)
    # The master and the sessions the data set will hold.
    symbols, counts = placed.stats.symbols(), placed.stats.sessions()
    cap_dates, days = _cap_days(old_meta, counts, master, shares)
    out_master, shares_summary = _master_out(
        inputs, old_master, merge, (final, symbols), issues, days
    )
    unchanged = _nothing_new(old_meta, fresh or bool(decisions), inputs, out_master, old_master)
    sessions = coverage(counts, combined.old_days) if old_meta is not None else []
    levels = missing_levels(out_master, set(symbols["symbol"]), mappings or Mappings.load())
    issues.add("LEVEL_MISSING", *level_issue(levels))
    # The report, then the verdict: refused (nothing changes), or written.
    say("writing")
    report_dir = _make_report_dir(home, started)
    _write_tables(report_dir, checked, inputs, flagged, cleaned.table)
    levels.to_csv(report_dir / "levels.csv", index=False)
    if not len(counts):
        issues.add("NO_DATA", 1, [{"files": [str(p) for p in price_paths]}])
    files = [str(p) for p in [*price_paths, master, shares] if p is not None]
    first = source_label([Path(p) for p in prices], price_paths)
    source, merged_files = merged_meta(old_meta, files, data_source, first)
    report = _report(started, files, source, (checked, inputs), (symbols, counts), len(flagged),
                     report_dir)  # fmt: skip
    report.shares = shares_summary
    report.coverage = [c.to_dict() for c in sessions]
    report.nothing_new = unchanged
    refusal = refused(
        home, report, issues, (merge, replace, partial, skip_bad_rows), unchanged,
        lambda: coverage_refusal(sessions, min_coverage),
    )  # fmt: skip
    if refusal is not None:
        _write_report(report, issues, {"ok": False, "refused": refusal})
        raise IngestRefused(f"{refusal}; nothing changed (report: {report_dir})")
    if len(counts) and not unchanged:
        meta = _meta(
            report,
            (source, files, merged_files, old_meta),
            {"merge": merge, "basis": basis, "cap_dates": cap_dates, "kind": kind},
            cleaned,
            actions,
            _counts(report, int(counts.sum()), len(out_master)),
        )
        if merge and why_whole:
            say(f"rewriting the whole data set ({'; '.join(why_whole)})")
        ingested.write_ingested(home, placed, out_master, meta)
    _write_report(report, issues, {})
    return report


def _meta(
    report: IngestReport,
    sources: tuple[str, list[str], list[str], dict[str, Any] | None],
    how: dict[str, Any],
    cleaned: Cleaned,
    actions: Path | None,
    counts: dict[str, int],
) -> dict[str, Any]:
    """What the data set records of this ingest: `sources`, its name, the files read, the files
    merged and the stored meta (whose file list a merge keeps); `how`: merge, the basis, the
    market-cap days and the kind of closes."""
    source, files, merged_files, old_meta = sources
    basis = how["basis"]
    return {
        "data_source": source,
        "files": files if old_meta is None else old_meta.get("files", files),
        "merged_files": merged_files,
        "ingested_at": _utc_now().isoformat(),
        "report_dir": report.report_dir,
        "merge": how["merge"],
        "basis": basis,
        "cap_dates": how["cap_dates"],
        "max_move": float(basis["max_move"]),
        "prices_basis": basis["prices_basis"],
        "price_kind": how["kind"],
        "actions": None if actions is None else str(actions),
        "return_breaks": cleaned.breaks,
        "return_decisions": [d.to_dict() for d in cleaned.decisions],
        "counts": counts,
    }


def _price_kind(basis: str | None, inputs: Inputs, old_meta: dict[str, Any] | None) -> str:
    """The kind of closes the files hold (`return_signatures.price_kind`)."""
    return price_kind(
        basis,
        [str(f.attrs.get("basis", "unknown")) for f in inputs.frames],
        old_meta.get("price_kind") if old_meta is not None else None,
    )


def _nothing_new(
    old_meta: dict[str, Any] | None,
    news: bool,
    inputs: Inputs,
    out_master: pd.DataFrame,
    old_master: pd.DataFrame | None,
) -> bool:
    """A merge that changes nothing: no fresh row or decision (`news`), no share file, the
    same master."""
    if old_meta is None or news or inputs.shares is not None:
        return False
    return same_master(out_master, old_master)


def _given_and_stored(
    prices: list[Path], home: Path, merge: bool
) -> tuple[list[Path], ingested.Stored | None]:
    """The price files given (folders and globs expanded) and, on a merge, the stored data
    set; IngestError when no price file is given to a new data set."""
    price_paths = expand_price_paths([Path(p) for p in prices], PRICE_SUFFIXES)
    if not price_paths and not merge:
        raise IngestError("no price file given")
    return price_paths, ingested.stored(home) if merge else None


def _old_master(
    found: ingested.Stored | None, home: Path, keep_stored: bool
) -> pd.DataFrame | None:
    """The master the new one merges over: the stored data set's, else (a new data set
    without a master file, `keep_stored` False) the previously ingested one."""
    if not keep_stored:
        return previous_master(home)
    return ingested.read_master(found) if found is not None else None


def _cap_days(
    old_meta: dict[str, Any] | None, counts: pd.Series, master: Path | None, shares: Path | None
) -> tuple[dict[str, str], tuple[str | None, str | None]]:
    """The stored market-cap days, and the price day of the master's and the share file's
    caps (`daily.cap_day`: the data set's last session unless recorded)."""
    last = counts.index.max().strftime("%Y-%m-%d") if len(counts) else None
    cap_dates = dict(old_meta.get("cap_dates", {})) if old_meta is not None else {}
    return cap_dates, (cap_day(master, last, cap_dates), cap_day(shares, last, cap_dates))


def _basis(given: dict[str, Any], old_meta: dict[str, Any] | None, merge: bool) -> dict[str, Any]:
    """The basis options in force (`daily.basis_for`), `max_move` checked."""
    basis = basis_for(given, old_meta, merge=merge)
    max_move = float(basis["max_move"])
    if not max_move > 0:
        raise IngestError(f"--max-move must be > 0, got {max_move:g}")
    return basis


def _merge_and_judge(
    kept: pd.DataFrame,
    found: ingested.Stored | None,
    why_whole: list[str],
    block_symbols: int | None,
    how: tuple[Inputs, pd.DataFrame | None, Path, dict[str, Any] | None, list[Decision], str, bool],
    rejudge: bool,
) -> tuple[Combined, Cleaned]:
    """The kept rows combined with the stored ones (`merge_rows.combine`: only the partitions
    they fall in unless `why_whole` says why not) and the returns judged (`_clean`: on a merge
    only the fresh rows, unless `rejudge`). A split or distribution found in the new rows
    re-bases a history: then the whole data set is combined and judged again (the reason is
    appended to `why_whole`)."""
    size = block_symbols or ingested.BLOCK_SYMBOLS
    old_meta = how[3]
    combined = combine(kept, found, not why_whole, size)
    final = combined.frame
    judged = None if rejudge or old_meta is None else final["_fresh"].to_numpy(dtype=bool)
    cleaned = _clean(final, how, judged)
    if cleaned.rebased and combined.base is not None:
        # A level the stage re-based reaches back through the symbol's whole history.
        why_whole.append("a split or distribution found in the new rows rescales a history")
        combined = combine(kept, found, False, size)
        final = combined.frame
        cleaned = _clean(final, how, None if rejudge else final["_fresh"].to_numpy(dtype=bool))
    return combined, cleaned


def _caps_need_prices(master: pd.DataFrame | None) -> bool:
    """A master file with market caps and no share counts: its caps become share counts at
    each symbol's last price."""
    if master is None or "market_cap" not in master.columns:
        return False
    return bool((master["market_cap"].notna() & master["shares"].isna()).any())


def _flag_moves(final: pd.DataFrame, max_move: float, issues: Issues) -> pd.DataFrame:
    """One-day moves above `max_move` that involve a new or changed row: kept, listed as
    LARGE_MOVE (rows a merge gives again unchanged are not flagged again)."""
    flagged = large_moves(final, final["_fresh"].to_numpy(dtype=bool), max_move)
    if len(flagged):
        top = flagged.reindex(flagged["return"].abs().sort_values(ascending=False).index)
        issues.add(
            "LARGE_MOVE",
            len(flagged),
            top.head(MAX_EXAMPLES).to_dict("records"),
            message=f"one-day |return| above {max_move:g}: row kept, listed in flagged.csv",
        )
    return flagged


def _master_out(
    inputs: Inputs,
    old_master: pd.DataFrame | None,
    merge: bool,
    rows: tuple[pd.DataFrame, pd.DataFrame],
    issues: Issues,
    days: tuple[str | None, str | None] = (None, None),
) -> tuple[pd.DataFrame, dict[str, Any] | None]:
    """The master to store: the new one (merged over the old one), else the old one, else
    empty; share counts applied; and the summary of the share counts (None without). Market
    caps without a price become share counts at the master's and the share file's price day
    (`days`, see `cap_day`). `rows`: the price rows the ingest holds (every row where a cap or
    a share file needs prices) and the data set's symbols (`Stats.symbols`)."""
    final, symbols = rows
    master_frame = inputs.master
    if master_frame is not None:
        out_master = master_frame
        if merge and old_master is not None and len(old_master):
            old_m = old_master.reindex(columns=panel.RAW_MASTER_COLUMNS).assign(market_cap=np.nan)
            out_master = pd.concat([master_frame, old_m], ignore_index=True)
            out_master = out_master.drop_duplicates("symbol", keep="first")
        need = out_master["shares"].isna() & out_master["market_cap"].notna()
        if need.any():
            base = out_master.loc[need, "symbol"].map(last_prices(final, days[0]))
            out_master.loc[need, "shares"] = out_master.loc[need, "market_cap"] / base
        out_master = out_master[panel.RAW_MASTER_COLUMNS].reset_index(drop=True)
        price_symbols = set(symbols["symbol"].astype(str))
        registry = set(etf_registry()["symbol"])
        missing_master = sorted(price_symbols - set(out_master["symbol"]) - registry)
        issues.add("MISSING_FROM_MASTER", len(missing_master), missing_master)
        missing_prices = sorted(set(master_frame["symbol"]) - price_symbols)
        issues.add("MISSING_PRICES", len(missing_prices), missing_prices)
    elif old_master is not None:
        out_master = old_master
    else:
        out_master = _empty_master()
    summary = None
    if inputs.shares is not None and inputs.shares_path is not None:
        out_master, summary = apply_shares(
            out_master, inputs.shares, final, inputs.shares_path, issues, days[1]
        )
    uncapped = uncapped_stocks(symbols, out_master, set(etf_registry()["symbol"]))
    issues.add("PARTIAL_CAPS", len(uncapped), uncapped)
    return out_master, summary


def _report(
    started: datetime,
    files: list[str],
    source: str,
    read: tuple[Checked, Inputs],
    stored: tuple[pd.DataFrame, pd.Series],
    n_flagged: int,
    report_dir: Path,
) -> IngestReport:
    """The report's counts and span (its issues are filled in when it is written): `read`,
    the rows read and their verdicts; `stored`, the data set's symbols and rows per session."""
    checked, inputs = read
    symbols, counts = stored
    dates = counts.index
    n_malformed = len(inputs.malformed)
    return IngestReport(
        started_at=started.isoformat(),
        finished_at="",
        files=files,
        data_source=source,
        rows_read=len(checked.new) + n_malformed,
        rows_kept=int(checked.kept.sum()),
        rows_rejected=int((~checked.kept).sum()) + n_malformed,
        rows_flagged=n_flagged,
        symbols=len(symbols),
        sessions=len(dates),
        first_date=dates.min().strftime("%Y-%m-%d") if len(dates) else None,
        last_date=dates.max().strftime("%Y-%m-%d") if len(dates) else None,
        issues=[],
        report_dir=str(report_dir),
    )


def _counts(report: IngestReport, rows_stored: int, master_rows: int) -> dict[str, int]:
    return {
        "rows_read": report.rows_read,
        "rows_kept": report.rows_kept,
        "rows_rejected": report.rows_rejected,
        "rows_flagged": report.rows_flagged,
        "rows_stored": rows_stored,
        "symbols": report.symbols,
        "sessions": report.sessions,
        "master_rows": master_rows,
    }


def _write_tables(
    report_dir: Path,
    checked: Checked,
    inputs: Inputs,
    flagged: pd.DataFrame,
    decisions: pd.DataFrame,
) -> None:
    """The report's row tables: rejected, flagged (large moves) and the return decisions."""
    rejected = rejected_frame(checked.new, checked.flags, checked.dup_of, inputs.malformed)
    rejected.to_csv(report_dir / "rejected.csv", index=False)
    flagged.to_csv(report_dir / "flagged.csv", index=False)
    decisions.to_csv(report_dir / "return_decisions.csv", index=False)


def _write_report(report: IngestReport, issues: Issues, extra: dict[str, Any]) -> None:
    """Finish the report (issues, end time) and write `report.json` into its folder."""
    report.issues = issues.as_list()
    report.finished_at = _utc_now().isoformat()
    doc = {**report.to_dict(), **extra}
    Path(report.report_dir, "report.json").write_text(json.dumps(doc, indent=2, default=str))


def _clean(
    final: pd.DataFrame,
    how: tuple[Inputs, pd.DataFrame | None, Path, dict[str, Any] | None, list[Decision], str, bool],
    judged: np.ndarray | None,
) -> Cleaned:
    """The return-cleaning stage (`return_cleaning.clean_returns`) on the combined rows, each
    stock grouped with its GICS sector and judged as `kind` closes; on a merge the decisions stored with the data set stay
    in force under the new ones, and only the `judged` rows are judged (the stored verdicts
    stand on the others). `how`: the inputs, the stored master, the home, the stored meta, the
    user's decisions, the kind of closes and --keep-split-moves."""
    inputs, old_master, home, old_meta, decisions, kind, keep = how
    masters = [m for m in (inputs.master, old_master) if m is not None]
    if not masters and (previous := previous_master(home)) is not None:
        masters.append(previous)
    groups: dict[str, str] = {}
    for m in reversed(masters):
        stocks = m[m["asset_type"].fillna("stock").astype(str) == "stock"]
        sectors = stocks.dropna(subset=["gics_sector"])
        groups.update(
            zip(sectors["symbol"].astype(str), sectors["gics_sector"].astype(str), strict=True)
        )
    applied: list[Decision] = []
    stored: list[list[str]] | None = None
    if old_meta is not None:
        applied = decisions_from_meta(old_meta.get("return_decisions"))
        stored = old_meta.get("return_breaks", []) if judged is not None else None
    cleaned = clean_returns(
        final, groups, decisions=merged(applied, decisions), applied=applied, keep_detected=keep,
        judged=judged, kind=kind,
    )  # fmt: skip
    if stored is not None and judged is not None:
        decided = {(d.symbol, d.date) for d in cleaned.decisions}
        cleaned.breaks = kept_breaks(cleaned.breaks, stored, cleaned.final, judged, decided)
    return cleaned

"""Why an ingest changes nothing (all or nothing): its rejected rows, a replacement that would
lose data, or a new session that prices too few symbols. `ingest` asks `refused` once, after
every row is read and checked and before anything is written."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from eqrisk.data import ingested, panel
from eqrisk.data.ingest_report import ROW_CODES, IngestReport, Issues

# More than this share of rejected rows means a wrong file or layout, not a few bad rows.
MAX_REJECTED_SHARE = 0.5


def refused(
    home: Path,
    report: IngestReport,
    issues: Issues,
    how: tuple[bool, bool, bool, bool],
    unchanged: bool,
    coverage_check: Callable[[], str | None],
) -> str | None:
    """Why this ingest changes nothing, or None: rejected rows (all or nothing, unless
    --skip-bad-rows), a much smaller or mostly rejected replacement (unless --replace), a new
    session that prices too few symbols (unless --partial). `how`: merge, replace, partial,
    skip_bad_rows."""
    merge, replace, partial, skip_bad_rows = how
    if not (merge or replace or not report.sessions):
        refusal = replacement_refusal(home, report)
        if refusal is not None:
            return refusal
    if report.rows_rejected and not skip_bad_rows:
        return bad_rows_refusal(report, issues)
    return None if partial or unchanged else coverage_check()


def bad_rows_refusal(report: IngestReport, issues: Issues) -> str:
    """The one line of an ingest refused for its rejected rows (all or nothing)."""
    codes = (*ROW_CODES, "MALFORMED_ROW")
    reasons = ", ".join(f"{i['count']} {i['code']}" for i in issues.as_list() if i["code"] in codes)
    return (
        f"refused: {report.rows_rejected} of {report.rows_read} rows rejected ({reasons}; listed "
        f"in {Path(report.report_dir) / 'rejected.csv'}): all or nothing, so nothing was taken; "
        f"fix the file, or pass --skip-bad-rows to take the {report.rows_kept} good rows"
    )


def replacement_refusal(home: Path, report: IngestReport) -> str | None:
    """Why replacing the ingested data set with `report`'s would lose data, or None."""
    if report.rows_read and report.rows_rejected > MAX_REJECTED_SHARE * report.rows_read:
        share = report.rows_rejected / report.rows_read
        return (
            f"refused: {share:.0%} of the rows were rejected ({report.rows_rejected} of "
            f"{report.rows_read}; at most {MAX_REJECTED_SHARE:.0%} without --replace), which "
            "looks like a wrong file or layout; see rejected.csv, or pass --replace "
            "--skip-bad-rows to keep the good rows anyway"
        )
    old = ingested.ingested_counts(home)
    if old is None:
        return None
    why = panel.shrink_reason(old, (report.symbols, report.sessions))
    if why is None:
        return None
    return (
        f"refused to replace the ingested data set ({old[0]} symbols x {old[1]} sessions) with "
        f"{report.symbols} x {report.sessions}: {why}; pass --replace to replace it anyway or "
        "--merge to add to it"
    )

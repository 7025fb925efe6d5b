"""`eqrisk accounts export` and `eqrisk accounts reconcile`: the ledger and the balances for
the books, and the check that every balance equals its ledger (eqrisk.accounts.audit)."""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterable
from typing import Annotated, Any

import typer

from eqrisk.cli.accounts import _accounts, accounts_app
from eqrisk.cli.app import JsonOpt, fail
from eqrisk.cli.output import print_json, result, result_table, say_error

TABLES = ("ledger", "balances")


def _write(rows: Iterable[dict[str, Any]], columns: tuple[str, ...], fmt: str) -> int:
    """Rows on stdout as CSV (a header line) or as one JSON array, written as they come."""
    count = 0
    if fmt == "csv":
        writer = csv.DictWriter(sys.stdout, columns, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow(row)
            count += 1
        return count
    sys.stdout.write("[")
    for row in rows:
        sys.stdout.write(("\n  " if count == 0 else ",\n  ") + json.dumps(row, default=str))
        count += 1
    sys.stdout.write("\n]\n" if count else "]\n")
    return count


@accounts_app.command("export")
def accounts_export(
    table: Annotated[
        str, typer.Argument(metavar="TABLE", help="ledger (every entry) or balances.")
    ] = "ledger",
    fmt: Annotated[str, typer.Option("--format", help="csv or json.")] = "csv",
    account: Annotated[str | None, typer.Option(help="Only this account's rows.")] = None,
) -> None:
    """Write the ledger or the balances as CSV or JSON. On stdout; amounts in tokens and in
    exact USD; balances beside their ledger's credits and charges."""
    from eqrisk.accounts.audit import BALANCE_COLUMNS, LEDGER_COLUMNS, account_totals, ledger_rows

    if table not in TABLES:
        raise fail(f"TABLE must be one of {', '.join(TABLES)}; got {table!r}", 2)
    if fmt not in ("csv", "json"):
        raise fail(f"--format must be csv or json; got {fmt!r}", 2)
    engine = _accounts().engine
    if table == "ledger":
        _write(ledger_rows(engine, account), LEDGER_COLUMNS, fmt)
        return
    rows = (t.row() for t in account_totals(engine) if account is None or t.account_id == account)
    _write(rows, BALANCE_COLUMNS, fmt)


@accounts_app.command("reconcile")
def accounts_reconcile(as_json: JsonOpt = False) -> None:
    """Check balances and monthly usage against the ledger.

    Each account's balance must equal the credits minus the charges of its ledger
    rows, and each (account, month, route) of the usage table the charges of that month and
    route; exit 1 naming what differs."""
    from eqrisk.accounts.audit import account_totals, usage_differences

    engine = _accounts().engine
    totals = account_totals(engine)
    wrong = [t for t in totals if t.difference_tokens != 0]
    usage = usage_differences(engine)
    if as_json:
        print_json(
            {
                "accounts": len(totals),
                "ok": not wrong and not usage,
                "differences": [t.row() for t in wrong],
                "usage_differences": [u.row() for u in usage],
            }
        )
    else:
        if wrong:
            result_table(
                ("account", "balance", "credits - charges", "difference USD"),
                (
                    (t.account_id, t.balance_tokens, t.expected_tokens, t.row()["difference_usd"])
                    for t in wrong
                ),
            )
        if usage:
            result_table(
                ("account", "month", "route", "usage requests/tokens", "ledger requests/tokens"),
                (
                    (
                        u.account_id,
                        u.month,
                        u.route,
                        f"{u.usage_requests}/{u.usage_tokens}",
                        f"{u.ledger_requests}/{u.ledger_tokens}",
                    )
                    for u in usage
                ),
            )
        if not wrong and not usage:
            result(
                f"{len(totals)} accounts: every balance equals credits - charges of its ledger, "
                "and the monthly usage equals the ledger's charges"
            )
    problems = []
    if wrong:
        names = ", ".join(f"{t.account_id} ({t.difference_tokens:+d} tokens)" for t in wrong)
        problems.append(f"{len(wrong)} of {len(totals)} accounts differ from their ledger: {names}")
    if usage:
        names = ", ".join(sorted({f"{u.account_id} {u.month}" for u in usage}))
        problems.append(f"the monthly usage differs from the ledger's charges for {names}")
    if problems:
        say_error("; ".join(problems))
        raise typer.Exit(1)

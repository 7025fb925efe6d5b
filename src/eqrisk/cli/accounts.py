"""`eqrisk accounts` and `eqrisk keys`: the operator's side of accounts, credits and API keys."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from eqrisk.cli.app import JsonOpt, app, fail, get_settings
from eqrisk.cli.output import print_json, result, result_table, show

if TYPE_CHECKING:
    from eqrisk.settings import Settings

accounts_app = typer.Typer(
    help="Accounts: create, verify a card, credit, suspend, list. Verifying a card grants the "
    "starting credit once."
)
keys_app = typer.Typer(help="API keys: create (shown once), list, revoke.")
app.add_typer(accounts_app, name="accounts")
app.add_typer(keys_app, name="keys")


AccountArg = Annotated[
    str, typer.Argument(metavar="ACCOUNT_ID", help="The account's id (acc_...).")
]


def _accounts(settings: Settings | None = None) -> Any:
    from eqrisk.accounts.book import Accounts
    from eqrisk.accounts.db import Pool, make_engine

    settings = settings or get_settings()
    url = settings.database_url.get_secret_value() if settings.database_url else None
    return Accounts(make_engine(settings.home_dir, url, pool=Pool.of(settings)))


def _account_op(fn: Callable[[], Any]) -> Any:
    from eqrisk.accounts.book import AccountError

    try:
        return fn()
    except AccountError as exc:
        raise fail(str(exc)) from exc


@accounts_app.command("create")
def accounts_create(
    name: Annotated[str, typer.Option(help="Account holder's name.")],
    email: Annotated[str | None, typer.Option(help="Contact e-mail.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create an account. Its state is `created`: no credit until its card is verified."""
    acc = _account_op(lambda: _accounts().create_account(name, email))
    show(acc, as_json, f"account {acc['account_id']} created, state {acc['state']}")


@accounts_app.command("verify")
def accounts_verify(
    account_id: AccountArg,
    reference: Annotated[str | None, typer.Option(help="Card check reference.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Confirm the account's card (grants the starting credit once). The operator confirms it,
    as the default payment provider."""
    from eqrisk.accounts.book import STARTING_CREDIT_TOKENS
    from eqrisk.accounts.payments import OperatorProvider
    from eqrisk.accounts.pricing import tokens_to_usd

    accounts = _accounts()
    granted = _account_op(lambda: OperatorProvider(accounts).confirm_card(account_id, reference))
    credit = tokens_to_usd(STARTING_CREDIT_TOKENS) if granted else 0.0
    account = accounts.get_account(account_id)
    balance = tokens_to_usd(account["balance_tokens"])
    doc = {**account, "starting_credit_granted": granted, "credit_granted_usd": credit}
    said = (
        f"starting credit of {credit:.2f} USD granted"
        if granted
        else "no credit granted (the starting credit is granted once, at the first verification)"
    )
    show(doc, as_json, f"account {account_id} verified; {said}; balance {balance:.2f} USD")


@accounts_app.command("suspend")
def accounts_suspend(account_id: AccountArg) -> None:
    """Suspend an account: its keys stop working until reinstated."""
    _account_op(lambda: _accounts().set_state(account_id, "suspended"))
    result(f"account {account_id} suspended")


@accounts_app.command("reinstate")
def accounts_reinstate(account_id: AccountArg) -> None:
    """Reinstate a suspended account. Its card must have been verified; no second starting
    credit."""
    _account_op(lambda: _accounts().set_state(account_id, "verified"))
    result(f"account {account_id} reinstated")


@accounts_app.command("credit")
def accounts_credit(
    account_id: AccountArg,
    usd: Annotated[str, typer.Option(help="Amount in USD, e.g. 10 or 0.25.")],
    reason: Annotated[str, typer.Option(help="Ledger note.")] = "operator credit",
    as_json: JsonOpt = False,
) -> None:
    """Add credit to an account (a ledger row records it)."""
    from eqrisk.accounts.pricing import tokens_to_usd, usd_to_tokens

    try:
        tokens = usd_to_tokens(usd)
    except (ValueError, ArithmeticError) as exc:
        raise fail(f"--usd must be a USD amount in steps of 0.00002; got {usd!r}", 2) from exc
    balance = _account_op(lambda: _accounts().credit(account_id, tokens, reason))
    doc = {"account_id": account_id, "balance_usd": tokens_to_usd(balance)}
    show(doc, as_json, f"account {account_id}: balance {doc['balance_usd']:.5f} USD")


@accounts_app.command("list")
def accounts_list(as_json: JsonOpt = False) -> None:
    """List the accounts: state, balance, how verified.

    How each was verified: `operator`, `stripe` with its SetupIntent, or `webhook`; a note
    when a card's starting credit was refused."""
    from eqrisk.accounts.pricing import tokens_to_usd
    from eqrisk.accounts.selfservice import SelfService

    accounts = _accounts()
    how = SelfService(accounts).how_verified()
    rows = [
        {
            **a,
            "balance_usd": tokens_to_usd(a["balance_tokens"]),
            "verified_by": how.get(a["account_id"]),
        }
        for a in accounts.list_accounts()
    ]
    if as_json:
        print_json(rows)
        return

    def verified(row: dict[str, Any]) -> str:
        by = row["verified_by"]
        if by is None:
            return "-"
        words = str(by["provider"]) + (f" {by['reference']}" if by["reference"] else "")
        return words + (f" ({by['note']})" if by["note"] else "")

    result_table(
        ("account", "name", "state", "balance USD", "verified by"),
        (
            (r["account_id"], r["name"], r["state"], f"{r['balance_usd']:.5f}", verified(r))
            for r in rows
        ),
    )


@keys_app.command("create")
def keys_create(
    account: Annotated[str, typer.Option(help="Account id.")],
    label: Annotated[str | None, typer.Option(help="A name for the key.")] = None,
    rate_limit: Annotated[str, typer.Option(help="Moving-window limit, e.g. 120/minute.")] = (
        "120/minute"
    ),
    as_json: JsonOpt = False,
) -> None:
    """Create a key. It is printed once and stored only as a hash: keep it."""
    from limits import parse

    try:
        parse(rate_limit)
    except ValueError as exc:
        raise fail(
            f"--rate-limit must look like '120/minute' or '10/second'; got {rate_limit!r}", 2
        ) from exc
    doc = _account_op(lambda: _accounts().create_key(account, label=label, rate_limit=rate_limit))
    show(doc, as_json, f"key {doc['key_id']} for {account}: [bold]{doc['key']}[/] (shown once)")


@keys_app.command("list")
def keys_list(
    account: Annotated[str | None, typer.Option(help="Only this account's keys.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List keys (ids only; keys themselves are never stored)."""
    rows = _accounts().list_keys(account)
    if as_json:
        print_json(rows)
        return
    result_table(
        ("key id", "account", "label", "rate limit", "revoked"),
        (
            (r["key_id"], r["account_id"], r["label"] or "", r["rate_limit"], r["revoked_at"] or "")
            for r in rows
        ),
    )


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(metavar="KEY_ID", help="The key's id (keys list).")],
) -> None:
    """Revoke a key at once. Every server refuses it from its next request on."""
    _account_op(lambda: _accounts().revoke_key(key_id))
    result(f"key {key_id} revoked")

"""The `eqrisk` command. Results a script would read go to stdout (`--json`: one JSON document);
progress and logs go to stderr. Exit codes: 0 success, 1 failure, 2 bad usage."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from eqrisk.settings import Settings, get_settings

app = typer.Typer(
    help="eqrisk: equity-risk data services computed from daily prices.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)
out = Console()

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]


def _settings(**overrides: Any) -> Settings:
    base = get_settings()
    clean = {k: v for k, v in overrides.items() if v is not None}
    return base.model_copy(update=clean) if clean else base


def _print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")


def _print_mapping(doc: dict[str, Any], as_json: bool, heading: str) -> None:
    """A flat mapping as one JSON document, or as a two-column table for people."""
    if as_json:
        _print_json(doc)
        return
    table = Table(heading, "value")
    for key, value in doc.items():
        table.add_row(key, str(value))
    out.print(table)


def _fail(message: str, code: int = 1) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code)


@contextmanager
def _stages(title: str) -> Iterator[Callable[[str], None]]:
    """A spinner on stderr showing the current stage and the elapsed time."""
    start = time.perf_counter()
    with err.status(title) as status:

        def say(message: str) -> None:
            status.update(f"{title}: {message} [dim]({time.perf_counter() - start:.1f}s)[/]")

        yield say
    err.print(f"[green]done[/] {title} in {time.perf_counter() - start:.1f}s")


@app.command()
def config(as_json: JsonOpt = False) -> None:
    """Print the effective settings (secrets masked)."""
    _print_mapping(get_settings().masked(), as_json, "setting")


@app.command()
def ingest(
    prices: Annotated[list[Path], typer.Argument(help="Price files: CSV, CSV.gz or Parquet.")],
    master: Annotated[
        Path | None, typer.Option(help="Security master (symbol, name, asset_type, GICS...).")
    ] = None,
    merge: Annotated[bool, typer.Option(help="Merge into the ingested data set.")] = False,
    source: Annotated[str | None, typer.Option(help="data_source label.")] = None,
    max_move: Annotated[
        float | None, typer.Option(help="Flag one-day |return| above this.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Validate and ingest daily prices and a security master. Rejected rows go to the report;
    the good rows are kept. Exit 1 when any row was rejected."""
    from eqrisk.data.ingest import IngestError, render_report
    from eqrisk.data.ingest import ingest as run_ingest

    settings = _settings(max_move=max_move)
    for path in [*prices, *([master] if master else [])]:
        if not path.exists():
            raise _fail(f"no such file: {path}", 2)
    try:
        with _stages("ingest") as say:
            report = run_ingest(
                prices,
                master,
                home=settings.home_dir,
                max_move=settings.max_move,
                merge=merge,
                data_source=source,
                progress=say,
            )
    except IngestError as exc:
        raise _fail(str(exc)) from exc
    if as_json:
        _print_json(report.to_dict())
    else:
        render_report(report, err)
    if not report.ok:
        raise typer.Exit(1)


@app.command()
def build(
    window: Annotated[int | None, typer.Option(help="Rolling window in sessions.")] = None,
    min_obs: Annotated[int | None, typer.Option(help="Observations before publishing.")] = None,
    halflife: Annotated[float | None, typer.Option(help="EWMA half-life (sessions).")] = None,
    keep: Annotated[int, typer.Option(help="Snapshot versions to keep.")] = 3,
    as_json: JsonOpt = False,
) -> None:
    """Build the risk model on the ingested data into a new snapshot and make it current."""
    from eqrisk.model.risk import ModelParams
    from eqrisk.snapshot.build import build_snapshot

    settings = _settings(window=window, min_obs=min_obs, halflife=halflife)
    try:
        params = ModelParams(settings.window, settings.min_obs, settings.halflife)
        with _stages("build") as say:
            manifest = build_snapshot(
                settings.home_dir,
                params,
                market_etf=settings.market_etf,
                sector_map=settings.sector_map,
                subsector_map=settings.subsector_map,
                keep=keep,
                progress=say,
            )
    except (FileNotFoundError, ValueError) as exc:
        raise _fail(str(exc)) from exc
    summary = {k: manifest[k] for k in _SUMMARY_KEYS}
    if as_json:
        _print_json(summary)
    else:
        err.print(_summary_line(summary))


_SUMMARY_KEYS = (
    "model_version",
    "data_as_of",
    "data_source",
    "universe_size",
    "sessions",
    "method",
)


def _summary_line(s: dict[str, Any]) -> str:
    return (
        f"snapshot [bold]{s['model_version']}[/]: {s['universe_size']} symbols x "
        f"{s['sessions']} sessions, data as of {s['data_as_of']}, source {s['data_source']}"
    )


@app.command()
def snapshots(as_json: JsonOpt = False) -> None:
    """List the snapshot versions (the current one marked)."""
    from eqrisk.snapshot.store import Snapshot, current_version, list_versions, snapshots_dir

    home = get_settings().home_dir
    current = current_version(home)
    rows = []
    for version in list_versions(home):
        manifest = Snapshot.open(snapshots_dir(home) / version).manifest
        rows.append({**{k: manifest[k] for k in _SUMMARY_KEYS}, "current": version == current})
    if as_json:
        _print_json({"current": current, "versions": rows})
        return
    table = Table("version", "current", "data as of", "source", "symbols", "sessions", "method")
    for row in rows:
        method = row["method"]
        table.add_row(
            row["model_version"],
            "*" if row["current"] else "",
            row["data_as_of"],
            row["data_source"],
            str(row["universe_size"]),
            str(row["sessions"]),
            f"{method['weighting']} w={method['window']} min={method['min_obs']}",
        )
    out.print(table if rows else "no snapshots yet: run `eqrisk build` or `eqrisk demo`")


@app.command()
def demo(
    serve: Annotated[bool, typer.Option(help="Serve the demo snapshot once built.")] = True,
    seed: Annotated[int, typer.Option(help="Generator seed (same seed, same market).")] = 7,
    as_json: JsonOpt = False,
) -> None:
    """Generate the synthetic demo market, ingest it, build it, and (by default) serve it."""
    from eqrisk.data.demo import DATA_SOURCE, generate_demo, write_demo_files
    from eqrisk.data.ingest import ingest as run_ingest
    from eqrisk.model.risk import ModelParams
    from eqrisk.snapshot.build import build_snapshot

    settings = get_settings()
    home = settings.home_dir
    with _stages("demo data") as say:
        say("generating")
        market = generate_demo(seed=seed)
        files = write_demo_files(market, home / "demo")
        report = run_ingest(
            [files["prices"]],
            files["master"],
            home=home,
            max_move=settings.max_move,
            data_source=DATA_SOURCE,
            progress=say,
        )
    if not report.ok:
        raise _fail(f"the demo data failed validation; see {report.report_dir}")
    with _stages("build") as say:
        manifest = build_snapshot(
            home,
            ModelParams(settings.window, settings.min_obs, settings.halflife),
            market_etf=settings.market_etf,
            progress=say,
        )
    summary = {k: manifest[k] for k in _SUMMARY_KEYS}
    if as_json:
        _print_json(summary)
    else:
        err.print(_summary_line(summary))
    if serve:
        _serve(settings, settings.host, settings.port, 1)


accounts_app = typer.Typer(
    help="Accounts: create, verify a card (grants the starting credit), suspend."
)
keys_app = typer.Typer(help="API keys: create (shown once), list, revoke.")
app.add_typer(accounts_app, name="accounts")
app.add_typer(keys_app, name="keys")


def _accounts(settings: Settings | None = None) -> Any:
    from eqrisk.accounts.db import make_engine
    from eqrisk.accounts.service import Accounts

    settings = settings or get_settings()
    url = settings.database_url.get_secret_value() if settings.database_url else None
    return Accounts(make_engine(settings.home_dir, url))


def _account_op(fn: Callable[[], Any]) -> Any:
    from eqrisk.accounts.service import AccountError

    try:
        return fn()
    except AccountError as exc:
        raise _fail(str(exc)) from exc


def _show(doc: Any, as_json: bool, line: str) -> None:
    if as_json:
        _print_json(doc)
    else:
        out.print(line)


@accounts_app.command("create")
def accounts_create(
    name: Annotated[str, typer.Option(help="Account holder's name.")],
    email: Annotated[str | None, typer.Option(help="Contact e-mail.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create an account (state: created; no credit until a card is verified)."""
    acc = _account_op(lambda: _accounts().create_account(name, email))
    _show(acc, as_json, f"account {acc['account_id']} created ({acc['state']})")


@accounts_app.command("verify")
def accounts_verify(
    account_id: str,
    reference: Annotated[str | None, typer.Option(help="Card check reference.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Confirm the account's card as the operator (the default payment provider)."""
    from eqrisk.accounts.payments import OperatorProvider

    accounts = _accounts()
    granted = _account_op(lambda: OperatorProvider(accounts).confirm_card(account_id, reference))
    doc = {**accounts.get_account(account_id), "starting_credit_granted": granted}
    _show(doc, as_json, f"account {account_id} verified; credit granted: {granted}")


@accounts_app.command("suspend")
def accounts_suspend(account_id: str) -> None:
    """Suspend an account: its keys stop working until it is reinstated."""
    _account_op(lambda: _accounts().set_state(account_id, "suspended"))
    err.print(f"account {account_id} suspended")


@accounts_app.command("reinstate")
def accounts_reinstate(account_id: str) -> None:
    """Reinstate a suspended account whose card was verified (no second starting credit)."""
    _account_op(lambda: _accounts().set_state(account_id, "verified"))
    err.print(f"account {account_id} reinstated")


@accounts_app.command("credit")
def accounts_credit(
    account_id: str,
    usd: Annotated[str, typer.Option(help="Amount in USD, e.g. 10 or 0.25.")],
    reason: Annotated[str, typer.Option(help="Ledger note.")] = "operator credit",
    as_json: JsonOpt = False,
) -> None:
    """Add credit to an account (a ledger row records it)."""
    from eqrisk.accounts.pricing import tokens_to_usd, usd_to_tokens

    try:
        tokens = usd_to_tokens(usd)
    except (ValueError, ArithmeticError) as exc:
        raise _fail(f"--usd must be a USD amount in steps of 0.00002; got {usd!r}", 2) from exc
    balance = _account_op(lambda: _accounts().credit(account_id, tokens, reason))
    doc = {"account_id": account_id, "balance_usd": tokens_to_usd(balance)}
    _show(doc, as_json, f"account {account_id}: balance {doc['balance_usd']:.5f} USD")


@accounts_app.command("list")
def accounts_list(as_json: JsonOpt = False) -> None:
    """List the accounts with state and balance."""
    from eqrisk.accounts.pricing import tokens_to_usd

    rows = [
        {**a, "balance_usd": tokens_to_usd(a["balance_tokens"])}
        for a in _accounts().list_accounts()
    ]
    if as_json:
        _print_json(rows)
        return
    table = Table("account", "name", "state", "balance USD")
    for row in rows:
        table.add_row(row["account_id"], row["name"], row["state"], f"{row['balance_usd']:.5f}")
    out.print(table)


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
        raise _fail(
            f"--rate-limit must look like '120/minute' or '10/second'; got {rate_limit!r}", 2
        ) from exc
    doc = _account_op(lambda: _accounts().create_key(account, label=label, rate_limit=rate_limit))
    _show(doc, as_json, f"key {doc['key_id']} for {account}: [bold]{doc['key']}[/] (shown once)")


@keys_app.command("list")
def keys_list(
    account: Annotated[str | None, typer.Option(help="Only this account's keys.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List keys (ids only; keys themselves are never stored)."""
    rows = _accounts().list_keys(account)
    if as_json:
        _print_json(rows)
        return
    table = Table("key id", "account", "label", "rate limit", "revoked")
    for row in rows:
        table.add_row(
            row["key_id"],
            row["account_id"],
            row["label"] or "",
            row["rate_limit"],
            str(row["revoked_at"] or ""),
        )
    out.print(table)


@keys_app.command("revoke")
def keys_revoke(key_id: str) -> None:
    """Revoke a key at once (every server sees it on the next request)."""
    _account_op(lambda: _accounts().revoke_key(key_id))
    err.print(f"key {key_id} revoked")


bench_app = typer.Typer(help="Benchmarks, each side by side with the alternative, in one run.")
app.add_typer(bench_app, name="bench")


@bench_app.command("model")
def bench_model(
    symbols: Annotated[int, typer.Option(help="Synthetic symbols.")] = 5000,
    sessions: Annotated[int, typer.Option(help="Sessions (7560 = 30 years).")] = 7560,
    baseline: Annotated[int, typer.Option(help="Symbols timed with RollingOLS.")] = 10,
    as_json: JsonOpt = False,
) -> None:
    """The L3 cascade vs statsmodels RollingOLS per stock: speed ratio and max difference."""
    from eqrisk.bench.model import ModelBench, run

    result = run(
        ModelBench(symbols=symbols, sessions=sessions, baseline_symbols=baseline),
        say=lambda m: err.print(m),
    )
    _print_mapping(result, as_json, "measure")


@bench_app.command("serve")
def bench_serve(
    seconds: Annotated[float, typer.Option(help="Load duration per target.")] = 5.0,
    connections: Annotated[int, typer.Option(help="Concurrent connections.")] = 8,
    generator: Annotated[str, typer.Option(help="auto, wrk or httpx.")] = "auto",
    as_json: JsonOpt = False,
) -> None:
    """Requests/s and p50/p99 of data routes next to /api/health, same server and generator."""
    from eqrisk.bench.serve import run

    if generator not in ("auto", "wrk", "httpx"):
        raise _fail("--generator must be auto, wrk or httpx", 2)
    result = run(seconds=seconds, connections=connections, generator=generator, say=err.print)
    if as_json:
        _print_json(result)
        return
    table = Table("target", "cache", "kB", "req/s", "p50 ms", "p99 ms", "req/s vs health")
    for row in result["results"]:
        table.add_row(
            row["target"],
            row["cache"],
            f"{row['bytes'] / 1e3:.0f}",
            f"{row['rps']:.0f}",
            f"{row['p50_ms']:.2f}",
            f"{row['p99_ms']:.2f}",
            f"{row['rps_ratio_to_health']:.2f}",
        )
    out.print(table)
    out.print(
        f"generator {result['generator']}, {result['connections']} connections, "
        f"{result['seconds_per_target']:g}s per target, {result['server']}"
    )


def _serve(settings: Settings, host: str, port: int, workers: int) -> None:
    import uvicorn

    from eqrisk.snapshot.store import current_version

    if current_version(settings.home_dir) is None:
        raise _fail(
            f"no snapshot under {settings.home_dir}: run `eqrisk demo` or `eqrisk build` first"
        )
    base = f"http://{host}:{port}"
    err.print(
        f"serving snapshot {current_version(settings.home_dir)} at [bold]{base}[/]\n"
        f"  Service A: {base}/daily ... (header apikey)\n"
        f"  Service B: {base}/api/... (Authorization: Bearer <key>)\n"
        f"  docs:      {base}/docs\n"
        f"  demo key:  {settings.demo_key.get_secret_value()}"
    )
    uvicorn.run(
        "eqrisk.api.app:create_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level="warning",
    )


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Interface to bind.")] = None,
    port: Annotated[int | None, typer.Option(help="Port.")] = None,
    workers: Annotated[int, typer.Option(min=1, help="Worker processes.")] = 1,
    service: Annotated[
        str, typer.Option(help="Which services: all, daily (Service A) or risk (Service B).")
    ] = "all",
) -> None:
    """Serve Service A and/or Service B over the current snapshot (new snapshots are picked up
    without a restart)."""
    choices = {"all": ["daily", "risk"], "daily": ["daily"], "risk": ["risk"]}
    if service not in choices:
        raise _fail(f"--service must be one of {', '.join(choices)}; got {service!r}", 2)
    # Worker processes build the app from the settings, so the choice travels in the environment.
    os.environ["EQRISK_SERVICES"] = json.dumps(choices[service])
    get_settings.cache_clear()
    settings = get_settings()
    _serve(settings, host or settings.host, port or settings.port, workers)


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    app()

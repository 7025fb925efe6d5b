"""`eqrisk demo`: generate the synthetic demo market, ingest it, build it, make the local
evaluation account's key, and (by default) serve it all. Everything it needs to serve is
checked before the build starts."""

from __future__ import annotations

import ipaddress
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from eqrisk.cli.app import (
    SUMMARY_KEYS,
    JsonOpt,
    app,
    fail,
    get_settings,
    reload_settings,
    summary_line,
)
from eqrisk.cli.output import note, print_json, result, stages
from eqrisk.cli.serve import HostOpt, PortOpt, preflight, run_server

if TYPE_CHECKING:
    from eqrisk.settings import Settings
    from eqrisk.snapshot.store import VersionStore

EVALUATION_KEY_FILE = Path("demo") / "evaluation-key"  # under the demo's home, mode 0600


def _demo_may_write(home: Path, demo_source: str, store: VersionStore | None = None) -> None:
    """Refuse to let the demo overwrite someone's own data set or current snapshot (of
    `store`: the home's own, `<home>/snapshots`, when None)."""
    from eqrisk.data.ingested import ingested_source
    from eqrisk.snapshot.versions import store_of

    found = []
    if store is None:
        store = store_of(home)
    source = ingested_source(home)
    if source not in (None, demo_source):
        found.append(f"an ingested data set from {source!r}")
    version = store.current()
    if version is not None:
        try:
            manifest = json.loads((store.path(version) / "manifest.json").read_text())
            snap_source = manifest.get("data_source")
        except (OSError, ValueError):
            snap_source = "unknown"
        if snap_source != demo_source:
            found.append(f"a current snapshot {version} from {snap_source!r}")
    if found:
        raise fail(
            f"EQRISK_HOME {home} holds {' and '.join(found)}; the demo would replace it. Run "
            "the demo in a home of its own, e.g. `EQRISK_HOME=/tmp/eqrisk-demo eqrisk demo`"
        )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def evaluation_key(settings: Settings) -> dict[str, Any] | None:
    """The demo home's evaluation key (made on the first run, the same one afterwards), or None
    where the accounts live in a shared database (EQRISK_DATABASE_URL): the demo makes
    accounts in its own home only."""
    from eqrisk.accounts.book import Accounts
    from eqrisk.accounts.db import make_engine
    from eqrisk.accounts.evaluation import ensure_evaluation_key

    if settings.database_url is not None:
        note(
            "no evaluation key: EQRISK_DATABASE_URL is set and the demo makes accounts in its "
            "own home only; use the demo key, or `eqrisk accounts create` and `eqrisk keys create`"
        )
        return None
    path = settings.home_dir / EVALUATION_KEY_FILE
    stored = path.read_text().strip() if path.is_file() else None
    engine = make_engine(settings.home_dir, None)
    try:
        doc = ensure_evaluation_key(Accounts(engine), stored)
    finally:
        engine.dispose()
    if doc["created"]:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(doc["key"] + "\n")
    return {**doc, "file": str(path)}


def _export(folder: Path, seed: int, as_json: bool) -> None:
    """`--export`: the demo market as files a user ingests; no home is read or written."""
    from eqrisk.data.demo import export_demo_files, generate_demo

    with stages("demo --export") as say:
        say("generating the demo market")
        market = generate_demo(seed=seed)
        say("writing")
        try:
            paths = export_demo_files(market, folder)
        except OSError as exc:
            raise fail(f"cannot write the demo's files into {folder}: {exc}") from None
    files = {name: str(path) for name, path in paths.items()}
    if as_json:
        print_json({"seed": seed, "files": files})
        return
    for name, path in files.items():
        result(f"{name}: {path}")
    note(
        f"ingest them in a home of your own: eqrisk ingest {paths['prices']} "
        f"--master {paths['master']}; then eqrisk build; eqrisk update {paths['new_days']}"
    )


@app.command()
def demo(
    serve: Annotated[bool, typer.Option(help="Serve the demo snapshot once built.")] = True,
    host: HostOpt = None,
    port: PortOpt = None,
    seed: Annotated[int, typer.Option(help="Generator seed (same seed, same market).")] = 7,
    export: Annotated[
        Path | None,
        typer.Option(
            help="Only write the demo market's files into this folder (prices.csv.gz, "
            "new_days.csv, master.csv: the ingest layouts), then stop.",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Build the demo market in its own home, then serve it. The demo market is
    generated, ingested and built; a local evaluation account (20 USD of credit, in this home
    only) gets a key, printed and offered by the page; then the services and the page are
    served. What serving needs (the port included) is checked before the build starts."""
    if export is not None:
        _export(export, seed, as_json)
        return
    from eqrisk.build.demo import DemoDataInvalid, build_demo
    from eqrisk.data.demo import DATA_SOURCE
    from eqrisk.model.run import ModelParams
    from eqrisk.snapshot.store import VersionStore

    settings = get_settings()
    home = settings.home_dir
    host, port = host or settings.host, port or settings.port
    store = VersionStore.from_settings(settings)  # the configured store (EQRISK_SNAPSHOTS)
    _demo_may_write(home, DATA_SOURCE, store)
    home.mkdir(parents=True, exist_ok=True)
    preflight(settings, host, port if serve else None, snapshot=False)
    with stages("demo") as say:
        try:
            manifest = build_demo(
                home,
                seed=seed,
                params=ModelParams(settings.window, settings.min_obs, settings.halflife),
                market_etf=settings.market_etf,
                max_move=settings.max_move,
                replace=True,  # checked above: only the demo's own data set is replaced
                force=True,
                progress=say,
                store=store,
            )
        except DemoDataInvalid as exc:
            raise fail(str(exc)) from None
    summary: dict[str, Any] = {k: manifest[k] for k in SUMMARY_KEYS}
    key = evaluation_key(settings)
    summary["evaluation_key"] = key
    if as_json:
        print_json(summary)
    else:
        result(summary_line(summary))
        if key is not None:
            result(
                f"evaluation key: [bold]{key['key']}[/] (account {key['account_id']}, "
                f"{key['balance_usd']:.2f} USD of credit, {key['rate_limit']}; in {key['file']})"
            )
    if not serve:
        return
    offered = ""
    if key is not None and _is_loopback(host):
        # Worker processes build the app from the settings: the key travels in the environment.
        os.environ["EQRISK_EVALUATION_KEY"] = key["key"]
        settings = reload_settings()
        offered = f"  evaluation key: {key['key']} (offered by the page)\n"
    elif key is not None:
        note(
            f"the page does not offer the evaluation key: {host} is reachable from other "
            "machines; paste the key into the page yourself"
        )
    run_server(settings, host, port, 1, offered=offered)

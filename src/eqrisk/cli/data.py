"""Data commands: ingest, build and update (the demo is in eqrisk.cli.demo)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from eqrisk.cli.app import (
    EXIT_ENVIRONMENT,
    SUMMARY_KEYS,
    JsonOpt,
    app,
    effective_settings,
    fail,
    heavy_imports,
    skip_final_collections,
    summary_line,
    without_huge_pages,
)
from eqrisk.cli.output import note, out, print_json, result, stages

if TYPE_CHECKING:  # imported by the commands that need it, not at start-up
    from eqrisk.data.ingest_report import IngestReport
    from eqrisk.settings import Settings

# `eqrisk ingest`'s longer options, named so that its signature stays readable.
ReplaceOpt = Annotated[
    bool,
    typer.Option(
        "--replace",
        help="Replace the ingested data set even with a much smaller one, or with mostly "
        "rejected rows.",
    ),
]
SharesOpt = Annotated[
    Path | None,
    typer.Option(
        help="Share counts merged into the master: symbol,shares or symbol,market_cap,price "
        "(the S&P constituents_financials layout is read as is)."
    ),
]
PricesBasisOpt = Annotated[
    str | None,
    typer.Option(
        "--prices",
        help="What the closes are: auto (default), adjusted, or raw (total returns from split "
        "and dividend factors; without factors, unadjusted splits are looked for). A merge "
        "uses the data set's.",
    ),
]
KeepMovesOpt = Annotated[
    bool | None,
    typer.Option(
        "--keep-split-moves/--no-keep-split-moves",
        help="Keep the returns the cleaning stage would leave out (splits, spin-offs, "
        "prints that reverse): still reported. A merge uses the data set's.",
    ),
]
RejudgeOpt = Annotated[
    bool,
    typer.Option(
        "--rejudge",
        help="On a merge, run the return-cleaning stage over the whole history again (default: "
        "only the new or changed rows are judged).",
    ),
]
PartialOpt = Annotated[
    bool,
    typer.Option(
        "--partial",
        help="Merge new sessions that price far fewer symbols than the session before them "
        "(EQRISK_MIN_COVERAGE).",
    ),
]
ActionsOpt = Annotated[
    Path | None,
    typer.Option(help="Corporate actions (symbol, date, split, dividend, spinoff, factor)."),
]
ColumnOpt = Annotated[
    list[str] | None,
    typer.Option(
        metavar="CANONICAL=SOURCE",
        help="Map a price column, e.g. symbol=Name (repeatable).",
    ),
]
DateFormatOpt = Annotated[
    str | None,
    typer.Option(
        help="The price files' date format, e.g. DD/MM/YYYY, MM/DD/YYYY, DD.MM.YYYY, YYYYMMDD "
        "or a strptime pattern (default: found from each file's whole date column; a file "
        "whose dates are ambiguous or mixed is refused).",
    ),
]
MinPriceOpt = Annotated[
    float | None,
    typer.Option(help="Reject a price below this (default EQRISK_MIN_PRICE, 1e-4).", min=0),
]
MaxPriceOpt = Annotated[
    float | None,
    typer.Option(help="Reject a price above this (default EQRISK_MAX_PRICE, 1e7).", min=0),
]
SkipBadRowsOpt = Annotated[
    bool,
    typer.Option(
        "--skip-bad-rows",
        help="Take the good rows of a file with rejected rows (default: all or nothing, a file "
        "with any rejected row changes nothing); says how many were taken.",
    ),
]
PricesArg = Annotated[
    list[Path], typer.Argument(metavar="PRICES", help="Price files: CSV, CSV.gz or Parquet.")
]


def _check_basis(prices_basis: str | None) -> None:
    if prices_basis not in (None, "auto", "adjusted", "raw"):
        raise fail(f"--prices {prices_basis!r}: accepted are auto, adjusted, raw", 2)


def _check_files(paths: list[Path]) -> None:
    for path in paths:
        if not path.exists():
            raise fail(f"no such file: {path}", 2)


def use_calendar_cache(settings: Settings) -> None:
    """The data commands keep the NYSE sessions list in `calendar_cache` (data.calendar)."""
    from eqrisk.data.calendar import use_cache

    use_cache(settings.calendar_cache_dir)


def _ingest(
    settings: Settings, prices: list[Path], master: Path | None, **options: Any
) -> IngestReport:
    """Ingest with the stages' progress; a refused ingest is the command's one-line error.
    A first ingest takes the setting's max_move; a merge the data set's (unless given)."""
    with heavy_imports():
        from eqrisk.data.cells import InputLimits
        from eqrisk.data.ingest import ingest as run_ingest
        from eqrisk.data.ingest_report import IngestError
        from eqrisk.data.master import Mappings

    use_calendar_cache(settings)
    skip_final_collections()
    if options.get("max_move") is None and not options.get("merge"):
        options["max_move"] = settings.max_move
    if settings.min_price >= settings.max_price:
        raise fail(f"--min-price {settings.min_price:g} is not below --max-price", 2)
    limits = InputLimits(
        settings.min_price, settings.max_price, settings.max_line_bytes, settings.max_cell_bytes
    )
    try:
        mappings = Mappings.load(settings.sector_map, settings.subsector_map)
    except (OSError, ValueError) as exc:
        raise fail(f"sector/subsector map: {exc}", 2) from exc
    try:
        with stages("ingest") as say:
            return run_ingest(
                prices,
                master,
                home=settings.home_dir,
                min_coverage=settings.min_coverage,
                progress=say,
                limits=limits,
                mappings=mappings,
                **options,
            )
    except IngestError as exc:
        raise fail(str(exc)) from exc


def _taken(report: IngestReport, skip_bad_rows: bool) -> bool:
    """Whether the ingest counts as done: a clean report, or --skip-bad-rows with good rows
    taken (said in one line)."""
    if report.ok:
        return True
    if not (skip_bad_rows and report.rows_kept):
        return False
    note(
        f"--skip-bad-rows: took {report.rows_kept} good rows of {report.rows_read}; "
        f"{report.rows_rejected} rejected rows listed in {Path(report.report_dir) / 'rejected.csv'}"
    )
    return True


@app.command()
def ingest(
    prices: PricesArg,
    master: Annotated[
        Path | None, typer.Option(help="Security master (symbol, name, asset_type, GICS...).")
    ] = None,
    merge: Annotated[
        bool, typer.Option("--merge", help="Merge into the ingested data set.")
    ] = False,
    replace: ReplaceOpt = False,
    source: Annotated[str | None, typer.Option(help="data_source label.")] = None,
    max_move: Annotated[
        float | None, typer.Option(help="Flag one-day |return| above this.")
    ] = None,
    shares: SharesOpt = None,
    prices_basis: PricesBasisOpt = None,
    actions: ActionsOpt = None,
    keep_split_moves: KeepMovesOpt = None,
    rejudge: RejudgeOpt = False,
    partial: PartialOpt = False,
    return_decisions: Annotated[
        Path | None,
        typer.Option(
            help="The report's return_decisions.csv as you edited it: keep, drop or adjust "
            "(with a factor) the return of a symbol on a date."
        ),
    ] = None,
    column: ColumnOpt = None,
    date_format: DateFormatOpt = None,
    min_price: MinPriceOpt = None,
    max_price: MaxPriceOpt = None,
    skip_bad_rows: SkipBadRowsOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Validate and ingest daily prices and a security master. All or nothing: a file with any
    rejected row is refused (exit 1, nothing changed, the rows listed in the report's
    rejected.csv) unless --skip-bad-rows, which takes the good rows and says how many. Refuses
    (exit 1, nothing changed) to replace the data set with one of less than half its symbols
    or sessions, or when more than half of the rows are rejected, unless --replace."""
    with heavy_imports():
        from eqrisk.data.columns import parse_mapping
        from eqrisk.data.ingest_report import render_report

    settings = effective_settings(min_price=min_price, max_price=max_price)
    given = (master, shares, actions, return_decisions)
    _check_files([*prices, *[p for p in given if p is not None]])
    _check_basis(prices_basis)
    try:
        columns = parse_mapping(column) if column else None
    except ValueError as exc:
        raise fail(str(exc), 2) from exc
    report = _ingest(
        settings,
        prices,
        master,
        merge=merge,
        replace=replace,
        data_source=source,
        prices_basis=prices_basis,
        actions=actions,
        keep_split_moves=keep_split_moves,
        return_decisions=return_decisions,
        columns=columns,
        shares=shares,
        max_move=max_move,
        rejudge=rejudge,
        partial=partial,
        date_format=date_format,
        skip_bad_rows=skip_bad_rows,
    )
    if as_json:
        print_json(report.to_dict())
    else:
        render_report(report, out)
    if not _taken(report, skip_bad_rows):
        raise typer.Exit(1)


@app.command()
def build(
    window: Annotated[int | None, typer.Option(help="Rolling window in sessions.")] = None,
    min_obs: Annotated[int | None, typer.Option(help="Observations before publishing.")] = None,
    halflife: Annotated[float | None, typer.Option(help="EWMA half-life (sessions).")] = None,
    keep: Annotated[
        int, typer.Option(min=1, help="Newest versions to keep (pinned ones are kept besides).")
    ] = 3,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Publish even when the universe shrank sharply, or when nothing is new.",
        ),
    ] = False,
    dask: Annotated[
        str | None,
        typer.Option(
            help="Run the model on Dask: 'local' (a LocalCluster) or a scheduler address "
            "(tcp://host:8786); default EQRISK_DASK, else in this process."
        ),
    ] = None,
    dask_workers: Annotated[
        int | None, typer.Option(min=1, help="Worker processes of --dask local (default: cores).")
    ] = None,
    block_rows: Annotated[
        int | None, typer.Option(min=1, help="Symbols per Dask block (default EQRISK_BLOCK_ROWS).")
    ] = None,
    full: FullOpt = False,
    accuracy: Annotated[
        bool,
        typer.Option(
            "--accuracy",
            hidden=True,
            help="Kept for old scripts: every build stores the accuracy record now.",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Build a snapshot from the ingested data; make it current. The risk model runs on the
    ingested data set; the build is incremental when the previous version's history is proved unchanged (only the new
    sessions' chunks are computed and written; the output says why not, otherwise).
    Refuses (exit 1, nothing changed) a universe of less than half the current snapshot's
    symbols or sessions, unless --force. With nothing new (the data and settings of the
    current version) it says so and publishes nothing, unless --force or --full."""
    del accuracy  # every build stores the accuracy record (docs/decisions/risk-forecast.md)
    settings = effective_settings(
        window=window, min_obs=min_obs, halflife=halflife, dask=dask, block_rows=block_rows
    )
    _build(
        settings,
        keep=keep,
        force=force,
        dask_workers=dask_workers,
        full=full,
        as_json=as_json,
    )


FullOpt = Annotated[
    bool, typer.Option("--full", help="Recompute the whole history (no incremental reuse).")
]


def _build(
    settings: Settings,
    *,
    keep: int,
    force: bool,
    dask_workers: int | None,
    full: bool,
    as_json: bool,
) -> None:
    """`eqrisk build` (and the build half of `eqrisk update`)."""
    with heavy_imports():
        from eqrisk.build.distributed import DaskUnavailable
        from eqrisk.build.pipeline import build_snapshot
        from eqrisk.build.unchanged import NothingNew
        from eqrisk.model.run import ModelParams
        from eqrisk.snapshot.store import VersionStore

    use_calendar_cache(settings)
    skip_final_collections()
    try:
        params = ModelParams(settings.window, settings.min_obs, settings.halflife)
        with stages("build") as say:
            manifest = build_snapshot(
                settings.home_dir,
                params,
                market_etf=settings.market_etf,
                sector_map=settings.sector_map,
                subsector_map=settings.subsector_map,
                keep=keep,
                force=force,
                dask=settings.dask,
                dask_workers=dask_workers,
                block_rows=settings.block_rows,
                block_symbols=settings.block_symbols,
                dask_min_cells=settings.dask_min_cells,
                full=full,
                progress=say,
                store=VersionStore.from_settings(settings),
                share_classes=settings.share_classes,
                skip_unchanged=True,
            )
    except NothingNew as same:
        if as_json:
            print_json({"nothing_new": True, "model_version": same.version})
        else:
            result(same.line())
        return
    except DaskUnavailable as exc:
        raise fail(str(exc), EXIT_ENVIRONMENT) from None
    except (FileNotFoundError, ValueError) as exc:
        raise fail(str(exc)) from exc
    from eqrisk.cli.bucket import push_after_build

    push_after_build(str(manifest["model_version"]), keep)
    summary = {k: manifest[k] for k in SUMMARY_KEYS}
    summary["build"] = manifest.get("build")
    if as_json:
        print_json(summary)
    else:
        result(summary_line(summary))
        how = manifest.get("build") or {}
        storage = manifest.get("storage", {})
        result(
            f"{how.get('mode', 'full')} build ({'; '.join(how.get('reasons', []))}): "
            f"{storage.get('chunks_written')} files written "
            f"({storage.get('bytes_written', 0) / 1e6:.1f} MB), "
            f"{storage.get('chunks_shared')} shared with the previous version"
        )


@app.command()
def update(
    prices: Annotated[
        list[Path] | None,
        typer.Argument(metavar="PRICES", help="New price files (new sessions, revisions)."),
    ] = None,
    master: Annotated[Path | None, typer.Option(help="Master rows to merge.")] = None,
    source: Annotated[str | None, typer.Option(help="data_source label.")] = None,
    max_move: Annotated[
        float | None, typer.Option(help="Flag one-day |return| above this.")
    ] = None,
    keep: Annotated[
        int, typer.Option(min=1, help="Newest versions to keep (pinned ones are kept besides).")
    ] = 3,
    full: FullOpt = False,
    from_provider: Annotated[
        str | None,
        typer.Option(
            "--from", help="Fetch the new sessions from a price provider first (yahoo, tiingo)."
        ),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(help="With --from: first session to fetch (default: after the last one)."),
    ] = None,
    prices_basis: PricesBasisOpt = None,
    keep_split_moves: KeepMovesOpt = None,
    rejudge: RejudgeOpt = False,
    partial: PartialOpt = False,
    date_format: DateFormatOpt = None,
    min_price: MinPriceOpt = None,
    max_price: MaxPriceOpt = None,
    skip_bad_rows: SkipBadRowsOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """The daily job: merge new price files, then build. The files are merged into the ingested
    data set (`ingest --merge`), then the build runs (incremental when the history is
    unchanged). All or nothing: a file with rejected rows is refused (exit 1, nothing merged,
    nothing built) unless --skip-bad-rows. `--from PROVIDER`
    fetches the new sessions first (`eqrisk fetch`). The merge keeps the data set's basis (the
    options of its first ingest: a different --prices or --max-move is refused), judges only
    the new rows' returns, and is refused when a new session prices less than
    EQRISK_MIN_COVERAGE of the symbols of the session before it (unless --partial). An update
    that changes nothing prints "nothing new" and publishes no version."""
    with heavy_imports():
        from eqrisk.data.ingest_report import render_report

    with without_huge_pages():
        settings = effective_settings(min_price=min_price, max_price=max_price)
        _check_basis(prices_basis)
        prices = list(prices or [])
        if from_provider is not None:
            from eqrisk.cli.feeds import fetch_file

            fetched, _ = fetch_file(settings, from_provider, since, None, None, None)
            if fetched is None and not prices:
                note(f"nothing new from {from_provider}: the data set and snapshot are unchanged")
                return
            prices += [fetched] if fetched is not None else []
        if not prices:
            raise fail("give the new price files, or --from PROVIDER to fetch them", 2)
        _check_files([*prices, *([master] if master is not None else [])])
        report = _ingest(
            settings,
            prices,
            master,
            merge=True,
            data_source=source,
            max_move=max_move,
            prices_basis=prices_basis,
            keep_split_moves=keep_split_moves,
            rejudge=rejudge,
            partial=partial,
            date_format=date_format,
            skip_bad_rows=skip_bad_rows,
        )
        if not as_json:
            render_report(report, out)
        if not _taken(report, skip_bad_rows):
            if as_json:
                print_json({"ingest": report.to_dict()})
            raise typer.Exit(1)
        if report.nothing_new:
            if as_json:
                print_json({"ingest": report.to_dict(), "build": None, "nothing_new": True})
            else:
                result("nothing new: the data set and the snapshot are unchanged")
            return
        _build(settings, keep=keep, force=False, dask_workers=None, full=full, as_json=as_json)

"""`eqrisk bench`: the benchmarks, each side by side with its alternative."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from eqrisk.cli.app import JsonOpt, app, fail
from eqrisk.cli.output import err, print_json, print_mapping, result, result_table

bench_app = typer.Typer(help="Benchmarks, each beside the alternative, in one run.")
app.add_typer(bench_app, name="bench")


def _quick(help: str, flag: str = "--quick") -> Any:
    """The `--quick` option of a bench: small sizes or a short load that check it."""
    return typer.Option(flag, help=help)


# The options several benches take.
SymbolsOpt = Annotated[int, typer.Option(help="Synthetic symbols.")]
SessionsOpt = Annotated[int, typer.Option(help="Sessions (7560 = 30 years).")]
SmallSizesOpt = Annotated[bool, _quick("Small sizes (300 x 1000): checks the bench.")]


@bench_app.command("model")
def bench_model(
    symbols: SymbolsOpt = 5000,
    sessions: SessionsOpt = 7560,
    baseline: Annotated[int, typer.Option(help="Symbols timed with RollingOLS.")] = 50,
    quick: Annotated[bool, _quick("Small sizes: checks the bench, times nothing.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """The L3 cascade next to its floor, RollingOLS and polars. The floor is the memory
    bandwidth's; RollingOLS runs per stock, polars computes the rolling market beta. Prints
    times, ratios with their spread, peak memory and the largest differences."""
    from eqrisk.bench.model import QUICK, ModelBench, run

    bench = QUICK if quick else ModelBench(symbols, sessions, baseline_symbols=baseline)
    print_mapping(run(bench, say=err.print), as_json, "measure")


@bench_app.command("risk")
def bench_risk(
    repeats: Annotated[int, typer.Option(help="Timed runs per way (fastest kept).")] = 30,
    quick: Annotated[
        bool, _quick("Small portfolios (50, 300): checks the bench.", "--quick/--no-quick")
    ] = False,
    http: Annotated[
        bool, typer.Option(help="The route over HTTP too (builds 5,088 stocks; not --quick).")
    ] = True,
    as_json: JsonOpt = False,
) -> None:
    """A portfolio's risk against the dense covariance. Volatility, Euler contributions and
    hedge of 500 and 5,000 positions through both factor layers, next to a dense N x N
    covariance in numpy (the model's Sigma, and np.cov of returns) on the same data: times,
    ratios and the answers compared; then the route over HTTP."""
    from eqrisk.bench.risk import QUICK, RiskBench, run

    bench = QUICK if quick else RiskBench(repeats=repeats, http=http)
    print_mapping(run(bench, say=err.print), as_json, "measure")


@bench_app.command("cost")
def bench_cost(
    repeats: Annotated[int, typer.Option(help="Timed calls per case (more for a cheap one).")] = 10,
    seconds: Annotated[float, typer.Option(help="Seconds of /api/health per load.")] = 5.0,
    as_json: JsonOpt = False,
) -> None:
    """What a call costs the server per USD it is charged. CPU-seconds per USD per route at each
    route's worst case (largest body, most and most unknown tickers, longest range), the free
    calls' CPU, and /api/health's latency alone and with four worst-case portfolio and estimate
    calls running, on one `eqrisk serve`."""
    from eqrisk.bench.cost import run

    figures = run(repeats=repeats, seconds=seconds, say=err.print)
    if as_json:
        print_json(figures)
        return
    result_table(
        ("route", "case", "status", "USD", "CPU ms", "wall ms", "CPU-s / USD"),
        (
            (
                row["route"],
                row["case"],
                row["status"],
                f"{row['usd']:.4f}",
                f"{row['cpu_ms']:.1f}",
                f"{row['wall_ms']:.1f}",
                "free" if row["cpu_s_per_usd"] is None else f"{row['cpu_s_per_usd']:.2f}",
            )
            for row in figures["routes"]
        ),
    )
    print_mapping(
        {
            **figures["summary"],
            **{f"health_alone_{k}": v for k, v in figures["health_alone"].items()},
            **{f"health_loaded_{k}": v for k, v in figures["health_under_load"].items()},
        },
        False,
        "measure",
    )


@bench_app.command("serve")
def bench_serve(
    seconds: Annotated[float, typer.Option(help="Load duration per target.")] = 5.0,
    connections: Annotated[int, typer.Option(help="Concurrent connections.")] = 8,
    generator: Annotated[str, typer.Option(help="auto, wrk or httpx.")] = "auto",
    quick: Annotated[
        bool, _quick("A small ledger and few balance calls: checks the bench.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Request rates and latencies of data routes next to /api/health. The same server and load
    generator for all: requests/s, p50 and p99."""
    from eqrisk.bench.serve import BALANCE_CALLS, LARGE_LEDGER_ROWS, run

    if generator not in ("auto", "wrk", "httpx"):
        raise fail("--generator must be auto, wrk or httpx", 2)
    figures = run(
        seconds=seconds,
        connections=connections,
        generator=generator,
        ledger_rows=2_500 if quick else LARGE_LEDGER_ROWS,
        balance_calls=20 if quick else BALANCE_CALLS,
        say=err.print,
    )
    if as_json:
        print_json(figures)
        return
    result_table(
        ("target", "cache", "kB", "req/s", "MB/s", "p50 ms", "p99 ms", "req/s vs health"),
        (
            (
                row["target"],
                row["cache"],
                f"{row['bytes'] / 1e3:.0f}",
                f"{row['rps']:.0f}",
                f"{row['mb_per_s']:.0f}",
                f"{row['p50_ms']:.2f}",
                f"{row['p99_ms']:.2f}",
                f"{row['rps_ratio_to_health']:.2f}",
            )
            for row in figures["results"]
        ),
    )
    _print_large_answers(figures)
    result(
        f"generator {figures['generator']}, {figures['connections']} connections, "
        f"{figures['seconds_per_target']:g}s per target, {figures['server']}"
    )
    _print_metered(figures["metered"])


@bench_app.command("wire")
def bench_compression(
    home: Annotated[
        Path | None,
        typer.Option(help="A home with a snapshot (default: a 16-year demo market, built)."),
    ] = None,
    repeats: Annotated[int, typer.Option(help="Timed runs per figure (fastest kept).")] = 7,
    as_json: JsonOpt = False,
) -> None:
    """Compressed answers next to identity, in process. Per large answer and encoding
    (identity, gzip, br): bytes sent, the ratio, the time to compress, and the request's time
    with the compressed cache empty and filled."""
    from eqrisk.bench.compression import run

    figures = run(home, repeats=repeats, say=err.print)
    if as_json:
        print_json(figures)
        return
    result_table(
        ("answer", "encoding", "kB", "ratio", "compress ms", "miss ms", "hit ms"),
        (
            (
                row["target"],
                row["sent_as"],
                f"{row['bytes'] / 1e3:.1f}",
                f"{row['ratio']:.2f}",
                f"{row['compress_ms']:.2f}",
                f"{row['request_miss_ms']:.2f}",
                f"{row['request_hit_ms']:.2f}",
            )
            for row in figures["results"]
        ),
    )


def _print_metered(metered: dict[str, Any]) -> None:
    """Issue 9's figures: metered calls next to /api/health at the same concurrency."""
    result_table(
        (
            f"metered path, {metered['connections']} connections",
            "req/s",
            "p50 ms",
            "p99 ms",
            "req/s vs health",
            "server CPU us/req",
        ),
        (
            (
                row["target"],
                f"{row['rps']:.0f}",
                f"{row['p50_ms']:.2f}",
                f"{row['p99_ms']:.2f}",
                f"{row['rps_ratio_to_health']:.2f}",
                f"{row['server_cpu_us_per_request']:.0f}",
            )
            for row in [*metered["results"], *metered["unpriced"]]
        ),
    )
    lat = metered["balance_latency"]
    result(
        f"/api/balance, one connection: p50 {lat['new_account']['p50_ms']:.2f} ms on a new "
        f"account, {lat['large_ledger']['p50_ms']:.2f} ms with {lat['ledger_rows']:,} ledger "
        f"rows (ratio {lat['p50_ratio_large_to_new']:.2f}); the charge's share of a metered "
        f"call: {metered['charge_cpu_us_per_request']:.0f} us of server CPU; "
        f"checks {metered['checks']}"
    )


def _print_large_answers(figures: dict[str, Any]) -> None:
    """The writers in-process next to orjson on the same rows, then /api/health under load."""
    rows = []
    lines = []
    for answer in figures["writers"]:
        name = f"{answer['answer']} ({answer['rows']} rows)"
        for way, fig in answer["ways"].items():
            rows.append(
                (name, way, f"{fig['mb']:.2f}", f"{fig['ms']:.1f}", f"{fig['mb_per_s']:.0f}")
            )
        lines.append(
            f"{answer['answer']}: the writers take 1/{answer['json_speedup']:.2f} (JSON) and "
            f"1/{answer['csv_speedup']:.2f} (CSV) of the time of the renderers they replaced "
            f"(CSV 1/{answer['csv_speedup_vs_write_csv_alone']:.2f} of pyarrow's write_csv "
            f"alone); same JSON bytes: {answer['json_identical']}, same CSV cells: "
            f"{answer['csv_same_cells']}"
        )
    result_table(("answer", "written by", "MB", "ms", "MB/s"), rows)
    loaded = figures["health_under_large_answers"]
    lines.append(
        f"/api/health while {loaded['connections_fetching_large_answers']} connections fetch "
        f"large answers (render cache off): p50 {loaded['p50_ms']:.2f} ms, p99 "
        f"{loaded['p99_ms']:.2f} ms, max {loaded['max_ms']:.1f} ms over {loaded['probes']} probes"
    )
    for line in lines:
        result(line)


@bench_app.command("build")
def bench_build(
    symbols: SymbolsOpt = 5000,
    sessions: SessionsOpt = 7560,
    reads: Annotated[int, typer.Option(help="Tickers whose full history is read.")] = 200,
    chunk: Annotated[int, typer.Option(help="Sessions per time chunk.")] = 128,
    block: Annotated[int, typer.Option(help="Symbols per block.")] = 1024,
    zarr_fields: Annotated[int, typer.Option(help="Fields also read from Zarr (0: none).")] = 3,
    quick: SmallSizesOpt = False,
    snapshot: Annotated[
        Path | None,
        typer.Option(help="A built version folder: its disk and per-ticker reads instead."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Disk per version and per update, per-ticker reads vs .npy. The disk of a version, the
    disk one more session adds, and one ticker's reads against monolithic .npy files."""
    from eqrisk.bench.build import BuildBench, read_version, run

    if snapshot is not None:
        print_mapping(read_version(snapshot, reads), as_json, "measure")
        return

    if quick:
        symbols, sessions, reads = min(symbols, 300), min(sessions, 1000), min(reads, 50)
    bench = BuildBench(
        symbols=symbols,
        sessions=sessions,
        reads=reads,
        chunk=chunk,
        block=block,
        zarr_fields=zarr_fields,
        model_check=quick,
    )
    print_mapping(run(bench, say=err.print), as_json, "measure")


@bench_app.command("daily")
def bench_daily(
    symbols: SymbolsOpt = 5000,
    sessions: SessionsOpt = 7560,
    dask: Annotated[
        bool, typer.Option(help="Also the Dask driver and workers at two sizes (n, n / 2).")
    ] = True,
    dask_workers: Annotated[
        int | None, typer.Option(min=1, help="Workers of the LocalCluster (default: cores).")
    ] = None,
    reference_full_s: Annotated[
        float | None,
        typer.Option(help="The full build's time to be no slower than (a reference run's)."),
    ] = None,
    quick: SmallSizesOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """The daily job end to end, next to a merge of all history. Each command in its
    own process: the full build (`eqrisk build`), then `eqrisk update` of the next session's
    file (merge, incremental build) beside the same merge over the whole history, then the
    full build on a Dask LocalCluster at n and n / 2 symbols. Wall time and peak memory of each
    process (the workers' measured in the workers), each next to its target."""
    from eqrisk.bench.daily import QUICK, DailyBench, run

    if quick:
        symbols, sessions = min(symbols, QUICK.symbols), min(sessions, QUICK.sessions)
    bench = DailyBench(
        symbols=symbols,
        sessions=sessions,
        dask=dask,
        dask_workers=dask_workers,
        reference_full_s=reference_full_s,
    )
    print_mapping(run(bench, say=err.print), as_json, "measure")


@bench_app.command("imports")
def bench_imports(
    repeats: Annotated[int, typer.Option(min=1, help="Fresh interpreters per command.")] = 5,
    symbols: Annotated[int, typer.Option(help="Symbols of the daily job's data set.")] = 40,
    sessions: Annotated[int, typer.Option(help="Sessions of the daily job's data set.")] = 300,
    as_json: JsonOpt = False,
) -> None:
    """What the CLI's commands import, in fresh interpreters. `eqrisk --help`, `eqrisk update
    --help` and the daily job (`eqrisk update FILE` on a small synthetic data set), each under
    `python -X importtime`, beside the whole package imported at once. Median import time, wall
    time and modules of each, and the daily job's largest packages."""
    from eqrisk.bench.imports import ImportsBench, run

    bench = ImportsBench(repeats=repeats, symbols=symbols, sessions=sessions)
    print_mapping(run(bench, say=err.print), as_json, "measure")


@bench_app.command("cache")
def bench_cache(
    store: Annotated[
        Path | None,
        typer.Option(help="A built store (default: the configured one), two versions or more."),
    ] = None,
    reads: Annotated[int, typer.Option(min=1, help="Tickers whose whole history is read.")] = 100,
    as_json: JsonOpt = False,
) -> None:
    """A new version served from a bucket (cache fill) vs the mount. On a local S3 server
    (moto, from the test extra): the version before the current one published and pulled into
    an empty cache (a new host), then the current one published and followed (only its changed
    chunks downloaded), next to opening it on the store; then every field of `reads` tickers
    read from the cache and from the store."""
    from eqrisk.bench.cache import run
    from eqrisk.cli.app import get_settings

    root = store if store is not None else get_settings().snapshots_dir
    print_mapping(run(root, reads, say=err.print), as_json, "measure")


@bench_app.command("pgbouncer")
def bench_pgbouncer(
    workers: Annotated[int, typer.Option(min=1, help="Worker processes of the server.")] = 40,
    pool: Annotated[int, typer.Option(min=1, help="PgBouncer's server connections.")] = 20,
    connections: Annotated[
        int | None, typer.Option(min=1, help="Concurrent client connections (default 2 x workers).")
    ] = None,
    seconds: Annotated[float, typer.Option(help="Timed load per phase.")] = 20.0,
    admin_url: Annotated[
        str, typer.Option(help="PostgreSQL where the bench creates and drops its own database.")
    ] = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    quick: Annotated[bool, _quick("A short load (1.5 s per phase): checks the bench.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """A server's workers through PgBouncer next to direct. `eqrisk serve --workers N` on
    PostgreSQL through a PgBouncer in transaction mode (started by the bench) and then
    directly, each under a paid load: connection errors, the answers' charges against the
    ledger, p50 and p99 of both and their ratio, PostgreSQL's peak connections."""
    from eqrisk.bench.pgbouncer import QUICK, PgBouncerBench, run

    base = QUICK if quick else PgBouncerBench()
    bench = PgBouncerBench(
        workers=workers,
        pool=pool,
        connections=connections or 2 * workers,
        seconds=min(seconds, base.seconds) if quick else seconds,
        warmup_s=base.warmup_s,
        admin_url=admin_url,
    )
    try:
        figures = run(bench, say=err.print)
    except RuntimeError as exc:
        raise fail(str(exc), 3) from None
    if as_json:
        print_json(figures)
        return
    result_table(
        ("phase", "req/s", "p50 ms", "p99 ms", "failed", "log errors", "PG conns", "ledger ok"),
        (
            (
                row["phase"],
                f"{row['rps']:.0f}",
                f"{row['p50_ms']:.1f}",
                f"{row['p99_ms']:.1f}",
                str(row["failed_requests"]),
                str(row["log_errors"]),
                str(row["peak_server_connections"]),
                str(row["credits_equal_ledger"]),
            )
            for row in figures["phases"]
        ),
    )
    print_mapping({k: v for k, v in figures.items() if k != "phases"}, False, "measure")

"""`eqrisk bench`: the benchmarks, each side by side with its alternative."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from eqrisk.cli.app import (
    JsonOpt,
    app,
    err,
    fail,
    out,
    print_json,
    print_mapping,
)

bench_app = typer.Typer(help="Benchmarks, each side by side with the alternative, in one run.")
app.add_typer(bench_app, name="bench")


@bench_app.command("model")
def bench_model(
    symbols: Annotated[int, typer.Option(help="Synthetic symbols.")] = 5000,
    sessions: Annotated[int, typer.Option(help="Sessions (7560 = 30 years).")] = 7560,
    baseline: Annotated[int, typer.Option(help="Symbols timed with RollingOLS.")] = 50,
    quick: Annotated[
        bool, typer.Option(help="Small sizes: checks the bench, times nothing.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """The L3 cascade next to the bandwidth floor, RollingOLS per stock and polars' rolling
    market beta: times, ratios with their spread, peak memory and max differences."""
    from eqrisk.bench.model import QUICK, ModelBench, run

    bench = QUICK if quick else ModelBench(symbols, sessions, baseline_symbols=baseline)
    result = run(bench, say=lambda m: err.print(m))
    print_mapping(result, as_json, "measure")


@bench_app.command("risk")
def bench_risk(
    repeats: Annotated[int, typer.Option(help="Timed runs per way (fastest kept).")] = 30,
    quick: Annotated[
        bool, typer.Option(help="Small portfolios (50, 300): checks the bench.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """A portfolio's risk (volatility, Euler contributions, hedge) of 500 and 5,000 positions
    through the factor structure, next to a dense N x N covariance in numpy (the model's Sigma,
    and np.cov of returns) on the same data: times, ratios and the answers compared."""
    from eqrisk.bench.risk import QUICK, RiskBench, run

    bench = QUICK if quick else RiskBench(repeats=repeats)
    print_mapping(run(bench, say=lambda m: err.print(m)), as_json, "measure")


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
        raise fail("--generator must be auto, wrk or httpx", 2)
    result = run(seconds=seconds, connections=connections, generator=generator, say=err.print)
    if as_json:
        print_json(result)
        return
    table = Table("target", "cache", "kB", "req/s", "MB/s", "p50 ms", "p99 ms", "req/s vs health")
    for row in result["results"]:
        table.add_row(
            row["target"],
            row["cache"],
            f"{row['bytes'] / 1e3:.0f}",
            f"{row['rps']:.0f}",
            f"{row['mb_per_s']:.0f}",
            f"{row['p50_ms']:.2f}",
            f"{row['p99_ms']:.2f}",
            f"{row['rps_ratio_to_health']:.2f}",
        )
    out.print(table)
    _print_large_answers(result)
    out.print(
        f"generator {result['generator']}, {result['connections']} connections, "
        f"{result['seconds_per_target']:g}s per target, {result['server']}"
    )
    _print_metered(result["metered"])


def _print_metered(metered: dict[str, Any]) -> None:
    """Issue 9's figures: metered calls next to /api/health at the same concurrency."""
    table = Table(
        f"metered path, {metered['connections']} connections",
        "req/s",
        "p50 ms",
        "p99 ms",
        "req/s vs health",
        "server CPU us/req",
    )
    for row in [*metered["results"], *metered["unpriced"]]:
        table.add_row(
            row["target"],
            f"{row['rps']:.0f}",
            f"{row['p50_ms']:.2f}",
            f"{row['p99_ms']:.2f}",
            f"{row['rps_ratio_to_health']:.2f}",
            f"{row['server_cpu_us_per_request']:.0f}",
        )
    out.print(table)
    lat = metered["balance_latency"]
    out.print(
        f"/api/balance, one connection: p50 {lat['new_account']['p50_ms']:.2f} ms on a new "
        f"account, {lat['large_ledger']['p50_ms']:.2f} ms with {lat['ledger_rows']:,} ledger "
        f"rows (ratio {lat['p50_ratio_large_to_new']:.2f}); the charge's share of a metered "
        f"call: {metered['charge_cpu_us_per_request']:.0f} us of server CPU; "
        f"checks {metered['checks']}"
    )


def _print_large_answers(result: dict[str, Any]) -> None:
    """The writers in-process next to orjson on the same rows, then /api/health under load."""
    table = Table("answer", "written by", "MB", "ms", "MB/s")
    lines = []
    for answer in result["writers"]:
        name = f"{answer['answer']} ({answer['rows']} rows)"
        for way, fig in answer["ways"].items():
            table.add_row(
                name, way, f"{fig['mb']:.2f}", f"{fig['ms']:.1f}", f"{fig['mb_per_s']:.0f}"
            )
        lines.append(
            f"{answer['answer']}: the writers take 1/{answer['json_speedup']:.2f} (JSON) and "
            f"1/{answer['csv_speedup']:.2f} (CSV) of the time of the renderers they replaced "
            f"(CSV 1/{answer['csv_speedup_vs_write_csv_alone']:.2f} of pyarrow's write_csv "
            f"alone); same JSON bytes: {answer['json_identical']}, same CSV cells: "
            f"{answer['csv_same_cells']}"
        )
    out.print(table)
    loaded = result["health_under_large_answers"]
    lines.append(
        f"/api/health while {loaded['connections_fetching_large_answers']} connections fetch "
        f"large answers (render cache off): p50 {loaded['p50_ms']:.2f} ms, p99 "
        f"{loaded['p99_ms']:.2f} ms, max {loaded['max_ms']:.1f} ms over {loaded['probes']} probes"
    )
    for line in lines:
        out.print(line)


@bench_app.command("build")
def bench_build(
    symbols: Annotated[int, typer.Option(help="Synthetic symbols.")] = 5000,
    sessions: Annotated[int, typer.Option(help="Sessions (7560 = 30 years).")] = 7560,
    reads: Annotated[int, typer.Option(help="Tickers whose full history is read.")] = 200,
    chunk: Annotated[int, typer.Option(help="Sessions per time chunk.")] = 128,
    block: Annotated[int, typer.Option(help="Symbols per block.")] = 1024,
    zarr_fields: Annotated[int, typer.Option(help="Fields also read from Zarr (0: none).")] = 3,
    quick: Annotated[
        bool, typer.Option(help="Small sizes (300 x 1000): checks the bench.")
    ] = False,
    snapshot: Annotated[
        Path | None,
        typer.Option(help="A built version folder: its disk and per-ticker reads instead."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Disk of a version, disk added by one more session, per-ticker reads vs monolithic .npy."""
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
    print_mapping(run(bench, say=lambda m: err.print(m)), as_json, "measure")

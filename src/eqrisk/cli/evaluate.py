"""`eqrisk evaluate`: how good the model was on the ingested data, out of sample: the risk
forecast's bias statistics next to the weighted-average-volatility baseline, and the realised
hedge quality per level and estimator. Results on stdout, each table under a header that says
what it measures and which way is better; progress on stderr."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from eqrisk.cli.app import JsonOpt, app, effective_settings, fail, out, print_json, stages

FAMILY_ROWS = {
    "single_stocks": "stocks",
    "random_long_only": "long-only",
    "sector": "sectors",
    "long_short": "long-short",
    "hedged_l3": "L3-hedged",
    "hedged_l3_10": "hedged 10",
    "hedged_l3_50": "hedged 50",
    "hedged_l3_100": "hedged 100",
    "hedged_l3_200": "hedged 200",
}


@app.command()
def evaluate(
    window: Annotated[int | None, typer.Option(help="Rolling window in sessions.")] = None,
    min_obs: Annotated[int | None, typer.Option(help="Observations before publishing.")] = None,
    halflife: Annotated[
        list[float] | None,
        typer.Option(metavar="SESSIONS", help="EWMA half-lives to compare (repeatable)."),
    ] = None,
    risk: Annotated[
        bool, typer.Option("--risk/--no-risk", help="Measure the risk forecast.")
    ] = True,
    styles: Annotated[
        bool,
        typer.Option(
            "--styles/--no-styles",
            help="Measure the model with its second layer (style factors; needs market caps) "
            "and the volatility regime adjustment.",
        ),
    ] = False,
    hedges: Annotated[
        bool, typer.Option("--hedges/--no-hedges", help="Measure the hedge quality.")
    ] = True,
    as_json: JsonOpt = False,
) -> None:
    """Out-of-sample accuracy of the risk forecast and the hedges. On the ingested data: the
    risk forecast's bias statistics (next to the weighted-average-volatility baseline) and the
    next-day hedge quality per level and estimator (equal weights, EWMA half-lives)."""
    from eqrisk.build.evaluate import DEFAULT_HALFLIVES
    from eqrisk.build.evaluate import evaluate as run_evaluate
    from eqrisk.model.risk_model import RiskParams
    from eqrisk.model.run import ModelParams

    if not (risk or hedges):
        raise fail("nothing to measure: drop --no-risk or --no-hedges", 2)
    settings = effective_settings(window=window, min_obs=min_obs)
    try:
        params = ModelParams(settings.window, settings.min_obs, None)
        with stages("evaluate") as say:
            report = run_evaluate(
                settings.home_dir,
                params,
                halflives=tuple(halflife) if halflife else DEFAULT_HALFLIVES,
                market_etf=settings.market_etf,
                risk=(RiskParams.served() if styles else RiskParams()) if risk else None,
                hedges=hedges,
                progress=say,
            )
    except (FileNotFoundError, ValueError) as exc:
        raise fail(str(exc)) from exc
    if as_json:
        print_json(report)
        return
    out.print(
        f"Data: {report['symbols']} symbols x {report['sessions']} sessions "
        f"({report['data_source'] or 'unknown source'})."
    )
    if "risk_forecast" in report:
        _print_risk(report["risk_forecast"])
    if "estimators" in report:
        _print_hedges(report["estimators"])


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _print_risk(rec: dict[str, Any]) -> None:
    period = rec["period"]
    out.print(
        f"\n[bold]Risk forecast accuracy[/], out of sample: forecasts of "
        f"{period['first']} .. {period['last']} ({period['sessions']} sessions), each made "
        "with data up to the session before."
    )
    out.print(
        "b = std(realised return / predicted volatility). 1 is right on average; above 1 "
        "the risk was under-predicted, below 1 over-predicted. Closer to 1 is better; within "
        "the band it cannot be told from 1."
    )
    out.print(
        "MAD 12m = mean |b - 1| over rolling 12-month windows: lower is better; floor = what "
        "a forecast right on every session would still show with these fat tails."
    )
    out.print(
        "Baseline = a portfolio's volatility as the weighted average of its positions' "
        "23-session volatilities (what a service without a covariance reports)."
    )
    from rich.table import Table

    table = Table(
        "horizon",
        "portfolios",
        "n",
        "band",
        "b",
        "b base",
        "MAD",
        "MAD base",
        "floor",
        box=None,
        padding=(0, 1),
    )
    for horizon, families in rec["horizons"].items():
        for name, f in families.items():
            lo, hi = f["band"]
            table.add_row(
                horizon,
                FAMILY_ROWS.get(name, name),
                str(f["members"]),
                f"±{(hi - lo) / 2:.3f}",
                _fmt(f["model"]["bias"]),
                _fmt(f["baseline"]["bias"]),
                _fmt(f["model"]["mad_12m"]),
                _fmt(f["baseline"]["mad_12m"]),
                _fmt(f["mad_12m_floor"]),
            )
    out.print(table)
    out.print(
        "b, MAD: the model's; base: the baseline's; band: 1 ± sqrt(2 / independent "
        "observations); portfolios: "
        + "; ".join(f"{FAMILY_ROWS[k]} = {v}" for k, v in rec["families"].items())
        + "."
    )


def _print_hedges(estimators: list[dict[str, Any]]) -> None:
    out.print(
        "\n[bold]Hedge quality[/]: the variance of next-day returns left after the level's ETF "
        "hedge of the session before, over the unhedged variance, per stock. Lower is better "
        "(1 = the hedge removed nothing; 0.46 = 54% of the variance removed). Median over "
        "stocks, pooled (sum of hedged over sum of unhedged variances) in brackets."
    )
    from rich.table import Table

    table = Table("estimator", "stocks", "n", "L1", "L2", "L3", box=None, padding=(0, 1))
    for item in estimators:
        for universe, levels in item["levels"].items():
            cells = [
                f"{levels[lvl]['median']:.3f} ({levels[lvl]['pooled']:.3f})"
                if lvl in levels
                else "-"
                for lvl in ("l1", "l2", "l3")
            ]
            n = next(iter(levels.values()))["stocks"]
            table.add_row(item["estimator"], universe.replace("_", " "), str(n), *cells)
    out.print(table)


@app.command("model-quality")
def model_quality(
    readme: Annotated[
        Path | None,
        typer.Option(help="Write the summary table between the markers of this README."),
    ] = None,
    docs: Annotated[
        Path | None,
        typer.Option(help="Write the full tables between the markers of this page."),
    ] = None,
    full: Annotated[bool, typer.Option("--full", help="Print the full tables.")] = False,
) -> None:
    """Print the current snapshot's accuracy table. The record every build stores, as the
    README's "Model quality" table (`--full`: docs/decisions/risk-forecast.md's tables); with --readme
    or --docs, written between those files' model-quality markers."""
    from eqrisk.snapshot.quality_table import NoMarkers, between_markers, full_tables, summary_table
    from eqrisk.snapshot.versions import current_version, snapshots_dir

    home = effective_settings().home_dir
    version = current_version(home)
    if version is None:
        raise fail("no snapshot: run `eqrisk build` first")
    manifest = json.loads((snapshots_dir(home) / str(version) / "manifest.json").read_text())
    if not manifest.get("risk_accuracy"):
        raise fail(f"{version} carries no accuracy record: build again (every build stores it)")
    short, tables = summary_table(manifest), full_tables(manifest)
    for path, content in ((readme, short), (docs, tables)):
        if path is None:
            continue
        try:
            path.write_text(between_markers(path.read_text(), content))
        except (NoMarkers, OSError) as exc:
            raise fail(f"{path}: {exc}") from exc
        print(f"wrote {path}", file=sys.stderr)
    if readme is None and docs is None:
        out.print(tables if full else short, markup=False, highlight=False, soft_wrap=True)

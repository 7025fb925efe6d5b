"""`eqrisk evaluate`: the model's realised hedge quality on the ingested data."""

from __future__ import annotations

from typing import Annotated

import typer

from eqrisk.cli.app import JsonOpt, app, effective_settings, fail
from eqrisk.cli.output import print_json, result, stages


@app.command()
def evaluate(
    window: Annotated[int | None, typer.Option(help="Rolling window in sessions.")] = None,
    min_obs: Annotated[int | None, typer.Option(help="Observations before publishing.")] = None,
    halflife: Annotated[
        list[float] | None,
        typer.Option(metavar="SESSIONS", help="EWMA half-lives to compare (repeatable)."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """The model's next-day hedge quality on the ingested data. Realised hedged over unhedged
    variance, per level and per estimator (equal weights, EWMA half-lives)."""
    from eqrisk.model.run import ModelParams
    from eqrisk.snapshot.evaluate import DEFAULT_HALFLIVES
    from eqrisk.snapshot.evaluate import evaluate as run_evaluate

    settings = effective_settings(window=window, min_obs=min_obs)
    try:
        params = ModelParams(settings.window, settings.min_obs, None)
        with stages("evaluate") as say:
            report = run_evaluate(
                settings.home_dir,
                params,
                halflives=tuple(halflife) if halflife else DEFAULT_HALFLIVES,
                market_etf=settings.market_etf,
                progress=say,
            )
    except (FileNotFoundError, ValueError) as exc:
        raise fail(str(exc)) from exc
    if as_json:
        print_json(report)
        return
    for item in report["estimators"]:
        for universe, levels in item["levels"].items():
            figures = ", ".join(
                f"{lvl.upper()} {v['median']:.3f} (pooled {v['pooled']:.3f})"
                for lvl, v in levels.items()
            )
            n = next(iter(levels.values()))["stocks"]
            result(f"{item['estimator']:>10} {universe} ({n} stocks): {figures}")

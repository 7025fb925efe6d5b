"""The risk forecast's accuracy per model variant, on the real data set or the demo market: the
table of docs/decisions/risk-forecast.md ("The second layer"), regenerated.

    python -m eqrisk.bench.accuracy --data real --variant etf --variant served
    python -m eqrisk.bench.accuracy --data demo --variant etf --variant served

The data is ingested once into a work folder (`--work`, default a folder under the system's
temporary directory, reused by later runs): the real set as `eqrisk ingest` reads it (the
adjusted closes of `adjclose_wide_2010_2026.csv.gz`, the GICS master, and the share counts of
`constituents_financials.csv`, so caps = close x one share count per stock; that file has no
volume, so no liquidity factor), the demo market as `eqrisk demo` writes it (caps and volume,
specific returns independent by construction: no style in it, so a right second layer leaves
hedged books' b where the ETF layer alone has it). The cascade runs once; each variant is a
`RiskParams` over the same hedge ratios, measured with the record every build stores
(`model.accuracy_state.record_of`: the same code, in one step), which is timed beside the model.
Figures: per family the median b, the median 12-month MAD and the worst 12-month window.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from eqrisk.data.panel import Panel
from eqrisk.model.accuracy import previous
from eqrisk.model.accuracy_state import figures_of, previous_params, record_of
from eqrisk.model.cascade import rolling_std
from eqrisk.model.covariance import CovarianceParams
from eqrisk.model.layout import FactorLayout
from eqrisk.model.regime import RegimeParams
from eqrisk.model.risk_model import RiskParams, StyleInputs, risk_model
from eqrisk.model.run import VOL_SHORT_MIN_OBS, VOL_SHORT_WINDOW, ModelParams, ModelResult
from eqrisk.model.styles import StyleParams

DAILY = np.sqrt(252.0)
ROWS = (
    ("single_stocks", "stocks"),
    ("random_long_only", "long-only"),
    ("sector", "sectors"),
    ("long_short", "long-short"),
    ("hedged_l3", "hedged (Dirichlet 50)"),
    ("hedged_l3_10", "hedged 10"),
    ("hedged_l3_50", "hedged 50"),
    ("hedged_l3_100", "hedged 100"),
    ("hedged_l3_200", "hedged 200"),
)


def variants() -> dict[str, RiskParams]:
    """The model variants by name: `etf` (the ETF layer alone, the served model before issue
    34), `both` (both layers and the regime adjustment, as first measured), `served` (what the
    snapshot serves, `RiskParams.served()`) and single changes to it (`served_corr_raw`:
    correlations of the raw returns, as before)."""
    styles = StyleParams()
    regime = RegimeParams()
    served = RiskParams.served()
    assert served.styles is not None and served.regime is not None
    return {
        "etf": RiskParams(),
        "etf_regime": RiskParams(regime=regime),
        "etf_regime_cal": RiskParams(regime=RegimeParams.calibrated()),
        "both": RiskParams(styles=styles, regime=regime),
        "both_no_regime": RiskParams(styles=styles),
        "served": served,
        "served_no_shrink": replace(served, styles=replace(served.styles, shrink=False)),
        "served_leverage": replace(served, styles=replace(served.styles, leverage=True)),
        "served_old_regime": replace(served, regime=regime),
        "served_no_regime": replace(served, regime=None),
        "served_regime_42": replace(served, regime=RegimeParams(42.0, 42.0)),
        "served_regime_63": replace(served, regime=RegimeParams(63.0, 63.0)),
        "served_regime_half": replace(served, regime=replace(regime, power=0.5)),
        "served_regime_limit": replace(served, regime=replace(regime, limit=4.0)),
        "served_shrink_1": replace(served, styles=replace(served.styles, shrink_power=1.0)),
        "served_shrink_050": replace(served, styles=replace(served.styles, shrink_power=0.5)),
        "served_regime_debias": replace(served, regime=replace(regime, debias=True)),
        "served_equal_weights": replace(served, styles=replace(served.styles, weight_power=0.0)),
        "served_corr_raw": replace(served, covariance=CovarianceParams()),
        "served_corr_raw_252": replace(served, covariance=CovarianceParams(corr_halflife=252.0)),
        "etf_corr_std": RiskParams(covariance=served.covariance),
    }


@dataclass(frozen=True)
class Prepared:
    """One data set with its cascade run: what every variant reads."""

    name: str
    panel: Panel
    result: ModelResult
    layout: FactorLayout
    stocks: np.ndarray
    inputs: StyleInputs
    factor_vol23: np.ndarray


def ingested_home(data: str, work: Path, shared: Path, say: Callable[[str], None]) -> Path:
    """A home with `data` ("real" or "demo") ingested (once: reused when already there)."""
    from eqrisk.data.ingest import ingest

    home = work / data
    if (home / "ingested").exists():
        return home
    home.mkdir(parents=True, exist_ok=True)
    say(f"ingesting the {data} data into {home}")
    if data == "demo":
        from eqrisk.data.demo import generate_demo, write_demo_files

        files = write_demo_files(generate_demo(), home / "demo")
        ingest([files["prices"]], files["master"], home=home, max_move=0.5,
               data_source="demo-synthetic")  # fmt: skip
    else:
        master = _gics_master(shared / "gics_constituents.csv", home)
        ingest([shared / "adjclose_wide_2010_2026.csv.gz"], master, home=home,
               shares=shared / "constituents_financials.csv")  # fmt: skip
    return home


def _gics_master(path: Path, home: Path) -> Path:
    """The S&P GICS file as a master of stocks (symbol, name, asset_type, GICS columns)."""
    gics = pd.read_csv(path)
    out = home / "gics_master.csv"
    pd.DataFrame(
        {
            "symbol": gics["Symbol"],
            "name": gics["Security"],
            "asset_type": "stock",
            "gics_sector": gics["GICS Sector"],
            "gics_sub_industry": gics["GICS Sub-Industry"],
        }
    ).to_csv(out, index=False)
    return out


def prepare(home: Path, name: str, say: Callable[[str], None]) -> Prepared:
    """The ingested set of `home`, its cascade (window 252, 126 observations: the defaults)."""
    from eqrisk.build.evaluate import load_universe
    from eqrisk.build.risk_evaluation import style_inputs
    from eqrisk.model.run import plan_model, run_model

    panel, master, breaks, _ = load_universe(home, "SPY")
    params = ModelParams(252, 126, None)
    say(f"{name}: cascade over {len(panel.symbols)} symbols x {len(panel.sessions)} sessions")
    plan = plan_model(panel, master, params, exclude=breaks)
    result = run_model(panel, master, params, exclude=breaks)
    layout = plan.layout
    stocks = plan.is_stock & (layout.fidx[:, 1] >= 0)
    factor_vol23 = rolling_std(layout.factors, window=VOL_SHORT_WINDOW, min_obs=VOL_SHORT_MIN_OBS)
    inputs = style_inputs(panel, result.symbols, stocks)
    return Prepared(name, panel, result, layout, stocks, inputs, factor_vol23)


def measure(prep: Prepared, params: RiskParams, horizons: tuple[int, ...]) -> dict[str, Any]:
    """The accuracy figures of one variant (`evaluate_forecasts`), and its run time."""
    m = prep.result.arrays()
    lay = prep.layout
    began = time.perf_counter()
    model = risk_model(
        m["return"], lay.factors, lay.fidx, lay.keys, prep.result.symbols, m, params,
        style_inputs=prep.inputs if params.styles is not None else None,
    )  # fmt: skip
    seconds = time.perf_counter() - began
    before = risk_model(m["return"], lay.factors, lay.fidx, lay.keys, prep.result.symbols, m,
                        previous_params(params))  # fmt: skip
    began = time.perf_counter()
    state = record_of(model, m["return"], lay.factors, previous(m["vol_23d"] / DAILY),
                      prep.stocks, np.where(prep.stocks, lay.fidx[:, 1], -1),
                      previous=before)  # fmt: skip
    record = time.perf_counter() - began
    figures = figures_of(state)
    return {
        "model_seconds": round(seconds, 2),
        "record_seconds": round(record, 2),
        "horizons": {f"{h}d": figures[f"{h}d"] for h in horizons},
    }


def table(results: dict[str, dict[str, Any]], horizon: str) -> str:
    """Markdown: a row per family, a column per variant, b / MAD 12m / worst 12m."""
    names = list(results)
    lines = [
        "| portfolios | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for key, label in ROWS:
        cells = []
        for name in names:
            f = results[name]["horizons"].get(horizon, {}).get(key)
            if f is None:
                cells.append("-")
                continue
            mod = f["model"]
            cells.append(" / ".join(_fmt(mod[k]) for k in ("bias", "mad_12m", "worst_12m")))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _line(result: dict[str, Any], horizon: str) -> str:
    """One variant's figures on a line: family b (MAD 12m)."""
    figures = result["horizons"].get(horizon, {})
    return (
        ", ".join(
            f"{label} {_fmt(f['model']['bias'])} ({_fmt(f['model']['mad_12m'])})"
            for key, label in ROWS
            if (f := figures.get(key)) is not None
        )
        + f"; model {result['model_seconds']} s, record {result['record_seconds']} s"
    )


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", choices=("real", "demo"), default="demo")
    parser.add_argument("--variant", action="append", choices=sorted(variants()))
    parser.add_argument("--horizon", type=int, action="append", help="sessions (default 1)")
    parser.add_argument("--shared", type=Path, default=Path("../shared/data"))
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "eqrisk-acc")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    home = ingested_home(args.data, args.work, args.shared, say)
    prep = prepare(home, args.data, say)
    horizons = tuple(args.horizon or [1])
    results: dict[str, dict[str, Any]] = {}
    for name in args.variant or ["etf", "served"]:
        say(f"{args.data}: variant {name}")
        results[name] = measure(prep, variants()[name], horizons)
        say(f"{name}: " + _line(results[name], f"{horizons[0]}d"))
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
    for h in horizons:
        print(f"\n{args.data}, {h} day(s): b / MAD 12m / worst 12m\n")
        print(table(results, f"{h}d"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

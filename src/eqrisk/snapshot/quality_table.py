"""The README's "Model quality" figures and the full tables of docs/decisions/risk-forecast.md,
rendered from a version's accuracy record (`risk_accuracy`, which every build stores), never
typed: `eqrisk model-quality` prints them and, with `--readme` / `--docs`, writes them between
the markers of those files."""

from __future__ import annotations

from typing import Any

from eqrisk.model.accuracy_state import ROW_FAMILIES

BEGIN = "<!-- model-quality: written by `eqrisk model-quality`; do not edit by hand -->"
END = "<!-- /model-quality -->"
NAMES = {
    "single_stocks": "single stocks",
    "random_long_only": "random long-only",
    "sector": "sectors",
    "long_short": "long-short",
    "hedged_l3": "L3-hedged (random)",
    "hedged_l3_10": "L3-hedged, 10 names",
    "hedged_l3_50": "L3-hedged, 50 names",
    "hedged_l3_100": "L3-hedged, 100 names",
    "hedged_l3_200": "L3-hedged, 200 names",
}


def _f(x: Any) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _source(record: dict[str, Any], manifest: dict[str, Any]) -> str:
    period = record["period"]
    return (
        f"Version `{manifest.get('model_version')}` of the data set `{manifest.get('data_source')}`"
        f" ({manifest.get('universe_size')} symbols), forecasts of {period['first']} .. "
        f"{period['last']} ({period['sessions']:,} sessions)."
    )


def _prev(entry: dict[str, Any], key: str) -> str:
    """The previous model's figure `key` of a family's entry ("n/a" where not measured)."""
    prev = entry.get("previous_model")
    return _f(prev.get(key)) if isinstance(prev, dict) else "n/a"


def summary_table(manifest: dict[str, Any]) -> str:
    """The README's table: per family b and MAD 12m at 1 and 21 days, the worst 12-month b
    at 1 day, and the b of the previous model (the ETF layer alone) and of the baseline at
    both horizons."""
    record = manifest["risk_accuracy"]
    one, month = record["horizons"]["1d"], record["horizons"]["21d"]
    lines = [
        _source(record, manifest),
        "",
        "| portfolios | b, 1 day | MAD 12m | worst 12m | b, 21 days | MAD 12m | previous model b, "
        "1 / 21 days | baseline b, 1 / 21 days |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in ROW_FAMILIES:
        if name not in one:
            continue
        a, m = one[name], month.get(name, {})
        lines.append(
            f"| {NAMES[name]} | {_f(a['model']['bias'])} | {_f(a['model']['mad_12m'])} | "
            f"{_f(a['model']['worst_12m'])} | {_f(m.get('model', {}).get('bias'))} | "
            f"{_f(m.get('model', {}).get('mad_12m'))} | {_prev(a, 'bias')} / "
            f"{_prev(m, 'bias')} | {_f(a['baseline']['bias'])} / "
            f"{_f(m.get('baseline', {}).get('bias'))} |"
        )
    return "\n".join(lines)


def full_tables(manifest: dict[str, Any]) -> str:
    """docs/decisions/risk-forecast.md's tables: every family and horizon, the model, the
    baseline and the previous model (b, MAD 12m, worst 12m), the band and the floor."""
    record = manifest["risk_accuracy"]
    lines = [_source(record, manifest)]
    for horizon, figures in record["horizons"].items():
        lines += [
            "",
            f"{horizon[:-1]} day{'s' if horizon != '1d' else ''}:",
            "",
            "| portfolios | rows | b | band | MAD 12m | floor | worst 12m | baseline b | "
            "baseline MAD | baseline worst | previous model b | previous MAD | previous worst |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name in ROW_FAMILIES:
            if name not in figures:
                continue
            e = figures[name]
            model, base = e["model"], e["baseline"]
            lines.append(
                f"| {NAMES[name]} | {e['members']} | {_f(model['bias'])} | "
                f"{_f(e['band'][0])} - {_f(e['band'][1])} | {_f(model['mad_12m'])} | "
                f"{_f(e['mad_12m_floor'])} | {_f(model['worst_12m'])} | {_f(base['bias'])} | "
                f"{_f(base['mad_12m'])} | {_f(base['worst_12m'])} | {_prev(e, 'bias')} | "
                f"{_prev(e, 'mad_12m')} | {_prev(e, 'worst_12m')} |"
            )
    return "\n".join(lines)


class NoMarkers(ValueError):
    """The file has no pair of model-quality markers."""


def between_markers(text: str, content: str) -> str:
    """`text` with what stands between its markers replaced by `content`."""
    start = text.find(BEGIN)
    stop = text.find(END, start + 1)
    if start < 0 or stop < 0:
        raise NoMarkers(f"no {BEGIN!r} ... {END!r} pair")
    return text[: start + len(BEGIN)] + "\n" + content.strip("\n") + "\n" + text[stop:]


def marked(text: str) -> str:
    """What stands between the markers of `text`."""
    start = text.find(BEGIN)
    stop = text.find(END, start + 1)
    if start < 0 or stop < 0:
        raise NoMarkers(f"no {BEGIN!r} ... {END!r} pair")
    return text[start + len(BEGIN) : stop].strip("\n")

"""Returns the stock really had: the cleaning stage between ingest and the model.

A daily move the holder never had is worse for a risk model than a missing return: one -57%
day (a spin-off booked as a loss) dominates a year of variance and, through group portfolios,
every peer's hedge. This stage looks at every large move of the model's close series and sorts
it, on evidence, into a return that stays in the model or one that is left out:

- `bad_print`: a print that reverses within three sessions (back by the next open where the file
  has opens), without a volume rush and without its group: every return of the print is dropped;
- `split`: a move of a split ratio whose level stays, opened at the new level, without the
  dollar turnover of a crash and without co-movers: an unadjusted split (raw closes only);
- `distribution`: a large fall that stays, opened at the new level, without a volume rush and
  without co-movers: a spin-off or special dividend without a factor (raw closes with an open
  or a volume only);
- `factor_mismatch`: one of the two above on a day the vendor's split/dividend factors changed
  the price, or a factor that made a move the traded prices do not show: the factors do not
  explain the jump;
- `move`: a large move that stays in the model (a crash or a rally: volume rush, co-movers, an
  intraday move or a level that does not stay), listed with its evidence.

The evidence per move (`moves`): its log move against the stock's robust daily volatility and
its group's median move that day, the share of the move given back within five sessions, the
share already in the open, the volume against its 63-session median in shares and in dollars,
and how many other symbols moved half as much the same day. Which evidence counts depends on
what the closes are (`return_signatures`: on adjusted closes only a print is left out). The
thresholds are in `CleaningRule`; their figures on the real data are in
docs/decisions/return-cleaning.md. Pure: arrays in, a frame out; the decisions a user feeds back are applied by `eqrisk.data.return_decisions`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from eqrisk.data.calendar import sessions_between
from eqrisk.data.corporate_actions import SPLIT_RATIOS
from eqrisk.data.ingest_report import MAX_EXAMPLES, Issues, issue_message
from eqrisk.data.return_decisions import Decision, price_factors
from eqrisk.data.return_signatures import CleaningRule, classify, describe, rush

__all__ = [
    "DROPPED_KINDS",
    "EVENT_COLUMNS",
    "Cleaned",
    "CleaningRule",
    "PriceRows",
    "clean_returns",
    "detect_events",
    "report_cleaning",
]

# What a move is taken for; all but `move` are left out of the model.
DROPPED_KINDS: tuple[str, ...] = ("bad_print", "split", "distribution", "factor_mismatch")

EVENT_COLUMNS: list[str] = [
    "symbol", "date", "kind", "action", "return", "prev_close", "close", "sigma",
    "group_return", "excess_sigmas", "ratio", "giveback", "open_share", "volume_ratio",
    "dollar_volume_ratio", "co_movers", "factor_day", "reason",
]  # fmt: skip


@dataclass(frozen=True)
class PriceRows:
    """The rows the stage reads, sorted by (symbol, date): the model's close and, where the
    file has them (NaN otherwise), the traded close, the open and the volume in shares;
    `group` is each row's peer group (GICS sector; None: the whole market)."""

    symbol: np.ndarray
    day: np.ndarray
    close: np.ndarray
    close_raw: np.ndarray
    open: np.ndarray
    volume: np.ndarray
    group: np.ndarray

    @classmethod
    def of(cls, frame: pd.DataFrame, groups: dict[str, str] | None = None) -> PriceRows:
        """From an ingest frame (sorted by symbol, date) and symbol -> group."""
        # Each distinct name converted (and mapped to its group) once, then taken per row: the
        # same strings as a row-by-row conversion, without one Python object a row.
        codes, names = pd.factorize(frame["symbol"])
        if (codes < 0).any():  # a missing symbol (never stored): converted row by row
            sym = frame["symbol"].to_numpy(dtype=object)
            group = pd.Series(sym).map(groups or {}).to_numpy(dtype=object)
        else:
            unique = np.asarray(names, dtype=object)
            sym = unique[codes]
            group = pd.Series(unique).map(groups or {}).to_numpy(dtype=object)[codes]

        def col(name: str) -> np.ndarray:
            if name not in frame:
                return np.full(len(frame), np.nan)
            return frame[name].to_numpy(dtype=np.float64, na_value=np.nan)

        return cls(
            symbol=sym,
            day=frame["date"].to_numpy().astype("datetime64[D]"),
            close=col("close"),
            close_raw=col("close_raw"),
            open=col("open"),
            volume=col("volume"),
            group=group,
        )


@dataclass
class _Series:
    """Per-row series the signatures read (log moves on consecutive sessions)."""

    x: np.ndarray  # log return into the row; NaN after a gap or a missing price
    g: np.ndarray  # the group's median log return that session
    e: np.ndarray  # x - g
    step: np.ndarray  # log change of the model/traded close ratio: a vendor factor that day
    session: np.ndarray  # session number of each row
    run_start: np.ndarray  # first row of the row's symbol
    run_end: np.ndarray  # last row of the row's symbol
    by_session: np.ndarray  # rows ordered by session
    session_bounds: np.ndarray  # by_session[bounds[p]:bounds[p+1]]: the rows of session p
    dollars: np.ndarray  # volume x traded close


def detect_events(
    rows: PriceRows,
    rule: CleaningRule | None = None,
    only: np.ndarray | None = None,
    kind: str = "raw",
) -> pd.DataFrame:
    """Every examined move with its evidence, kind and action (`EVENT_COLUMNS`): `drop` for
    the kinds of DROPPED_KINDS (a print drops each of its returns: one row per return), `keep`
    for a `move`. Moves kept are listed when their excess is at least `list_floor`. `only`
    (a row mask): examine the moves into those rows only (all rows still give the context).
    `kind` (`return_signatures.PRICE_KINDS`): what the closes are; on `adjusted` closes only a
    print that reverses is left out."""
    rule = rule or CleaningRule()
    if len(rows.close) < 2:
        return pd.DataFrame(columns=EVENT_COLUMNS)
    judged = None if only is None else np.asarray(only, dtype=bool)
    s = _series(rows, rule, judged)
    ratios = np.array(sorted({*SPLIT_RATIOS, *(1.0 / np.array(SPLIT_RATIOS))}))
    absx = np.abs(s.x)
    candidates = np.flatnonzero(np.abs(s.e) >= rule.floor)
    if judged is not None:
        candidates = candidates[judged[candidates]]
    out: list[dict[str, object]] = []
    consumed: set[int] = set()
    for j in candidates.tolist():
        if j in consumed:
            continue
        sigma, history = _sigma(absx, s.run_start[j], j, rule)
        if abs(s.e[j]) < rule.min_sigmas * sigma:
            continue
        ev = _evidence(rows, s, j, sigma, history, ratios, rule)
        run, why = _print_run(rows, s, j, sigma, ev, rule)
        if run:
            for k, i in enumerate(run):
                consumed.add(i)
                note = "" if k == 0 else f" (return out of the print of {_date(rows, j)})"
                row = ev if k == 0 else _evidence(rows, s, i, sigma, history, ratios, rule)
                out.append(_event(rows, i, row, "bad_print", "drop", why + note))
            continue
        found, why = classify(ev, rule, kind)
        if found == "move" and abs(s.e[j]) < rule.list_floor:
            continue
        out.append(_event(rows, j, ev, found, "keep" if found == "move" else "drop", why))
    frame = pd.DataFrame(out, columns=EVENT_COLUMNS)
    return frame.sort_values(["symbol", "date"], ignore_index=True)


def _series(rows: PriceRows, rule: CleaningRule, only: np.ndarray | None = None) -> _Series:
    """The series of every row; the peer medians (g, e) of the sessions from the first `only`
    row's on (all without `only`), the others NaN: a move examined is into an `only` row, and a
    print's reversal after it, so no earlier session's medians are read."""
    n = len(rows.close)
    sym = rows.symbol
    sessions = sessions_between(rows.day.min(), rows.day.max()).to_numpy().astype("datetime64[D]")
    session = np.searchsorted(sessions, rows.day)
    new_symbol = np.r_[True, sym[1:] != sym[:-1]]
    consecutive = ~new_symbol & np.r_[False, np.diff(session) == 1]
    x = np.full(n, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        x[1:] = np.log(rows.close[1:] / rows.close[:-1])
        ratio = np.where(np.isfinite(rows.close_raw), rows.close / rows.close_raw, 1.0)
        step = np.zeros(n)
        step[1:] = np.log(ratio[1:] / ratio[:-1])
    x[~consecutive | ~np.isfinite(x)] = np.nan
    step[~consecutive | ~np.isfinite(step)] = 0.0
    # The medians' sessions: from the first judged row's on (none when no row is judged), every
    # row of a session or none (the medians are per session: the same numbers).
    first = 0 if only is None else int(session[only].min(initial=len(sessions)))
    medians = session >= first
    # Each distinct group tested once, then taken per row (code -1, a missing one: the last, "").
    codes, groups = pd.factorize(rows.group[medians])
    named = [g if isinstance(g, str) and g else "" for g in groups]
    group = np.asarray([*named, ""], dtype=object)[codes]
    frame = pd.DataFrame({"p": session[medians], "g": group, "x": x[medians]})
    market = frame.groupby("p")["x"].transform("median").to_numpy()
    by_group = frame.groupby(["p", "g"])["x"]
    count = by_group.transform("count").to_numpy()
    median = by_group.transform("median").to_numpy()
    g = np.full(n, np.nan)
    g[medians] = np.nan_to_num(np.where((group != "") & (count >= rule.min_group), median, market))
    idx = np.arange(n)
    run_start = np.maximum.accumulate(np.where(new_symbol, idx, 0))
    last = np.r_[sym[1:] != sym[:-1], True]
    run_end = np.minimum.accumulate(np.where(last, idx, n)[::-1])[::-1]
    order = np.argsort(session, kind="stable")
    bounds = np.searchsorted(session[order], np.arange(len(sessions) + 1))
    traded = np.where(np.isfinite(rows.close_raw), rows.close_raw, rows.close)
    dollars = rows.volume * traded
    return _Series(x, g, x - g, step, session, run_start, run_end, order, bounds, dollars)


def _sigma(absx: np.ndarray, start: int, j: int, rule: CleaningRule) -> tuple[float, int]:
    """Robust daily vol (1.4826 x median |log move|) of the row's previous `lookback` moves."""
    prev = absx[max(start, j - rule.lookback) : j]
    prev = prev[np.isfinite(prev)]
    if len(prev) < rule.min_history:
        return rule.default_sigma, len(prev)
    return max(1.4826 * float(np.median(prev)), rule.sigma_floor), len(prev)


def _median_before(values: np.ndarray, start: int, j: int, rule: CleaningRule) -> float:
    prev = values[max(start, j - rule.lookback) : j]
    prev = prev[np.isfinite(prev) & (prev > 0)]
    return float(np.median(prev)) if len(prev) >= rule.min_history else np.nan


def _evidence(
    rows: PriceRows,
    s: _Series,
    j: int,
    sigma: float,
    history: int,
    ratios: np.ndarray,
    rule: CleaningRule,
) -> dict[str, float]:
    """The evidence on the move into row j (NaN where the file does not say)."""
    x, e = float(s.x[j]), float(s.e[j])
    start, end = int(s.run_start[j]), int(s.run_end[j])
    ahead = rows.close[j + 1 : min(end, j + rule.horizon) + 1]
    ahead = ahead[np.isfinite(ahead) & (ahead > 0)]
    # A share of the move: none where the stock did not move (x = 0, the candidate is its
    # group's move), where dividing by x was a numpy warning and an infinite share.
    giveback = float(np.max(-np.log(ahead / rows.close[j]) / x)) if len(ahead) and x else np.nan
    scale = rows.close[j] / rows.close_raw[j] if np.isfinite(rows.close_raw[j]) else 1.0
    with np.errstate(invalid="ignore", divide="ignore"):
        open_share = float(np.log(rows.open[j] * scale / rows.close[j - 1]) / x)
    shares = _median_before(rows.volume, start, j, rule)
    dollars = _median_before(s.dollars, start, j, rule)
    dist = np.abs(e + np.log(ratios))
    nearest = int(np.argmin(dist))
    size = max(ratios[nearest], 1.0 / ratios[nearest])
    blind = not (np.isfinite(rows.open[j]) or np.isfinite(rows.volume[j]))
    cap = rule.split_max_tolerance if size < 2.5 else rule.split_max_tolerance_large
    tol = min(max(rule.split_tolerance, rule.split_tol_sigmas * sigma), cap)
    if blind:
        tol = rule.split_tolerance
    if abs(size - round(size)) > 1e-9:
        tol = rule.fraction_tolerance  # 3:2 and 5:2 sit where real crashes and rallies fall
    p = int(s.session[j])
    peers = s.x[s.by_session[s.session_bounds[p] : s.session_bounds[p + 1]]]
    peers = peers[np.isfinite(peers)]
    co = int(np.sum(peers * np.sign(x) >= abs(x) / 2)) - 1
    raw_e = np.nan
    if np.isfinite(rows.close_raw[j]) and np.isfinite(rows.close_raw[j - 1]):
        raw_e = float(np.log(rows.close_raw[j] / rows.close_raw[j - 1])) - float(s.g[j])
    return {
        "x": x,
        "e": e,
        "g": float(s.g[j]),
        "sigma": sigma,
        "history": float(history),
        "z": e / sigma,
        "ratio": float(ratios[nearest]) if dist[nearest] <= tol else np.nan,
        "giveback": giveback,
        "open_share": open_share,
        "volume_ratio": rows.volume[j] / shares,
        "dollar_volume_ratio": s.dollars[j] / dollars,
        "co_movers": float(co),
        "co_limit": max(float(rule.comove_min), rule.comove_share * len(peers)),
        "factor_day": float(abs(s.step[j]) > rule.factor_eps),
        "raw_e": raw_e,
        "blind": float(blind),
    }


def _print_run(
    rows: PriceRows, s: _Series, j: int, sigma: float, ev: dict[str, float], rule: CleaningRule
) -> tuple[list[int], str]:
    """The returns of a print that reverses (rows j..j+k) and why, or [] when it is no print."""
    x = ev["x"]
    blind = bool(ev["blind"])
    sigmas = rule.blind_print_sigmas if blind else rule.print_sigmas
    if abs(x) < rule.print_floor or abs(ev["e"]) < sigmas * sigma:
        return [], ""
    if abs(s.g[j]) > rule.group_share * abs(x) or rush(ev, rule):
        return [], ""
    end = int(s.run_end[j])
    back = 0.0
    max_run = rule.blind_max_run if blind else rule.max_run
    for k in range(1, max_run + 1):
        i = j + k
        if i > end or not np.isfinite(s.x[i]):
            return [], ""
        back += float(s.x[i])
        share = -back / x
        if rule.reversal[0] <= share <= rule.reversal[1]:
            last = float(s.x[i])
            if abs(last) < rule.print_floor or abs(s.e[i]) < sigmas * sigma:
                return [], ""
            if abs(s.g[i]) > rule.group_share * abs(last):
                return [], ""
            # The open after the print's last day, against the print's level.
            scale = rows.close[i] / rows.close_raw[i] if np.isfinite(rows.close_raw[i]) else 1.0
            moved = float(np.log(rows.close[i - 1] / rows.close[j - 1]))
            with np.errstate(invalid="ignore", divide="ignore"):
                back_open = -np.log(rows.open[i] * scale / rows.close[i - 1]) / moved
            if np.isfinite(back_open) and back_open < rule.print_open_back:
                return [], ""  # traded at the print's level the next morning: a real whipsaw
            why = (
                f"{describe(ev)}; reversed {share:.0%} within {k} session(s)"
                + (f", {back_open:.0%} back by the next open" if np.isfinite(back_open) else "")
                + ": a print that reverses"
            )
            return list(range(j, i + 1)), why
        if k < max_run and abs(float(s.x[i])) > abs(x) / 3:
            return [], ""  # a run of a print moves little in between
    return [], ""


def _date(rows: PriceRows, j: int) -> str:
    return str(rows.day[j])


def _event(
    rows: PriceRows, j: int, ev: dict[str, float], kind: str, action: str, reason: str
) -> dict[str, object]:
    return {
        "symbol": rows.symbol[j],
        "date": _date(rows, j),
        "kind": kind,
        "action": action,
        "return": float(np.expm1(ev["x"])),
        "prev_close": float(rows.close[j - 1]),
        "close": float(rows.close[j]),
        "sigma": ev["sigma"],
        "group_return": float(np.expm1(ev["g"])),
        "excess_sigmas": ev["z"],
        "ratio": ev["ratio"],
        "giveback": ev["giveback"],
        "open_share": ev["open_share"],
        "volume_ratio": ev["volume_ratio"],
        "dollar_volume_ratio": ev["dollar_volume_ratio"],
        "co_movers": int(ev["co_movers"]),
        "factor_day": bool(ev["factor_day"]),
        "reason": reason,
    }


# --------------------------------------------------------------------------------------------
# The stage as ingest runs it


@dataclass
class Cleaned:
    """What the stage hands on: the rows with the adjustments in force applied to `close`, the
    returns the model leaves out (`[symbol, date]`), the decisions table of the report and the
    user decisions to store with the data set."""

    final: pd.DataFrame
    breaks: list[list[str]]
    table: pd.DataFrame
    decisions: list[Decision]
    rebased: int = 0


def clean_returns(
    final: pd.DataFrame,
    groups: dict[str, str],
    *,
    decisions: list[Decision],
    applied: list[Decision],
    keep_detected: bool = False,
    rule: CleaningRule | None = None,
    judged: np.ndarray | None = None,
    kind: str = "raw",
) -> Cleaned:
    """The cleaning stage on the ingest's rows (sorted by symbol, date; `_new` marks this
    ingest's rows): the user's adjustments applied (`applied`: those the stored rows already
    carry), every large move examined, and the user's keep/drop/adjust winning over what the
    stage found (`keep_detected`: keep every return the stage would leave out).

    `judged` (a row mask; a merge's new or changed rows): only the moves into those rows are
    examined (`daily.kept_breaks` keeps the stored verdicts on the others). `kind`: what the
    closes are (`return_signatures.price_kind`)."""
    if len(final):
        factors = price_factors(
            final["symbol"].to_numpy(dtype=object),
            final["date"].to_numpy(),
            final["_new"].to_numpy(dtype=bool),
            decisions,
            applied,
        )
        if (factors != 1.0).any():
            final = final.assign(close=final["close"].to_numpy() * factors)
    events = detect_events(PriceRows.of(final, groups), rule, judged, kind)
    events["detected"] = events["action"]
    if keep_detected:
        events["action"] = "keep"
    events["factor"] = np.nan
    user = {(d.symbol, d.date): d for d in decisions}
    keys = list(zip(events["symbol"], events["date"], strict=True))
    for i, key in enumerate(keys):
        if key in user:
            events.loc[i, "action"] = user[key].action
            if user[key].action == "adjust":
                events.loc[i, "factor"] = user[key].factor
    seen = set(keys)
    extra = [d for d in decisions if (d.symbol, d.date) not in seen]
    if extra:
        rows = pd.DataFrame(
            {
                "symbol": [d.symbol for d in extra],
                "date": [d.date for d in extra],
                "kind": "user",
                "action": [d.action for d in extra],
                "factor": [d.factor if d.action == "adjust" else np.nan for d in extra],
                "reason": "your decision (the stage found nothing here)",
            }
        )
        events = pd.concat([events, rows], ignore_index=True)
    table = events.reindex(columns=[*EVENT_COLUMNS[:4], "factor", "detected", *EVENT_COLUMNS[4:]])
    table = table.sort_values(["symbol", "date"], ignore_index=True)
    dropped = table["action"] == "drop"
    breaks = [[s, d] for s, d in zip(table["symbol"][dropped], table["date"][dropped], strict=True)]
    final, rebased = _rebase(final, table)
    return Cleaned(final, breaks, table, decisions, rebased)


# The kinds whose left-out return moved the price's level for good.
LEVEL_KINDS: tuple[str, ...] = ("split", "distribution", "factor_mismatch")


def _rebase(final: pd.DataFrame, table: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """The closes before each level change the stage leaves out (and the user did not
    overrule) multiplied by its factor, as a vendor's adjusted close is: 1 / the split ratio,
    else the day's close over the one before (`table`'s `factor` and `reason` say which). The
    served close then shows no jump the model does not count as a return; the return itself
    stays left out. Applied in date order, so that later ones multiply earlier ones (as a
    later `eqrisk update` would). Returns the rows and how many levels were re-based."""
    on = (table["action"] == "drop") & (table["detected"] == "drop")
    on &= table["kind"].isin(LEVEL_KINDS).to_numpy()
    if not on.any() or not len(final):
        return final, 0
    close = final["close"].to_numpy(dtype=np.float64).copy()
    sym = final["symbol"].to_numpy(dtype=object)
    day = final["date"].to_numpy().astype("datetime64[D]")
    events = table[on].sort_values("date", kind="stable")
    ratios = events["ratio"].to_numpy(dtype=np.float64)
    moves = events["return"].to_numpy(dtype=np.float64)
    factors = np.where(np.isfinite(ratios), 1.0 / ratios, 1.0 + moves)
    names = events["symbol"].to_numpy(dtype=object)
    dates = events["date"].to_numpy().astype("datetime64[D]")
    for name, date, factor in zip(names, dates, factors, strict=True):
        lo = int(np.searchsorted(sym, name, side="left"))
        hi = int(np.searchsorted(sym, name, side="right"))
        close[lo : lo + int(np.searchsorted(day[lo:hi], date))] *= factor
    table.loc[events.index, "factor"] = factors
    notes = [f"; the closes before it x {f:.6g}" for f in factors]
    table.loc[events.index, "reason"] = events["reason"].astype(str) + notes
    return final.assign(close=close), len(events)


# The report's issue code of each kind the stage leaves out.
ISSUE_CODES: dict[str, str] = {
    "split": "SPLIT_SUSPECTED",
    "distribution": "DISTRIBUTION_SUSPECTED",
    "bad_print": "PRINT_REVERSED",
    "factor_mismatch": "FACTOR_MISMATCH",
}


def report_cleaning(cleaned: Cleaned, keep_detected: bool, issues: Issues) -> None:
    """The stage's findings as report issues: one per kind left out (examples: the largest),
    and the user's decisions applied."""
    table = cleaned.table
    found = table[table["detected"] == "drop"]
    for kind, code in ISSUE_CODES.items():
        rows = found[found["kind"] == kind]
        if rows.empty:
            continue
        top = rows.reindex(rows["return"].abs().sort_values(ascending=False).index)
        note = " Kept in the model (--keep-split-moves)." if keep_detected else ""
        issues.add(
            code,
            len(rows),
            top.head(MAX_EXAMPLES)[
                ["symbol", "date", "prev_close", "close", "return", "ratio"]
            ].to_dict("records"),
            message=(issue_message(code) + note) if note else None,
        )
    if cleaned.decisions:
        counts = pd.Series([d.action for d in cleaned.decisions]).value_counts()
        issues.add(
            "RETURN_DECISIONS",
            len(cleaned.decisions),
            [{"action": a, "returns": int(n)} for a, n in counts.items()],
        )

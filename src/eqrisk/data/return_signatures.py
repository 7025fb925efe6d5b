"""What a large move is taken for, from its evidence: the signatures of the cleaning stage.

The evidence that a move is no return depends on what the closes are (`PRICE_KINDS`):

- `adjusted` (the file's adjusted closes, or `--prices adjusted`): splits and distributions are
  already in the price, so nothing but a print that reverses (`return_cleaning`) or the user's
  decision leaves a return out; every other move is a `move` that stays.
- `raw` (traded closes, with or without the file's split/dividend factors): a `split` is a move
  of a split ratio that opened at the new level, keeps it and brings no more dollar turnover
  than a split explains (share volume after a k:1 split is k times the old one mechanically,
  dollar volume is not); a `distribution` is a large fall that opens at its level, keeps it,
  moves alone (its peers do not) and brings no rush of traders; a `split` also covers a move of
  at least a doubling or halving that no ratio matches but that was re-priced overnight with
  ordinary dollar turnover (a reverse split combined with a spin-off). Rows with closes only
  ("blind": no open, no volume) give no evidence that tells a spin-off from a crash: only a
  whole split ratio (2:1, 1:3, ...) whose level stays is left out there.

Whatever the kind, a move with the signature of a crash (heavy dollar turnover, an open or a
level that the move does not keep, co-movers) stays. Thresholds are in `CleaningRule`; their
figures on the real data are in docs/decisions/return-cleaning.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["PRICE_KINDS", "CleaningRule", "classify", "describe", "price_kind"]

# What the model's closes are, for the stage: see the module's docstring.
PRICE_KINDS: tuple[str, ...] = ("adjusted", "raw")


def price_kind(stated: str | None, read: list[str], stored: str | None = None) -> str:
    """The kind of the closes the stage judges: `adjusted` when `--prices adjusted` was
    stated or every price file read gave adjusted closes (`price_files.read_prices`'s
    `attrs["basis"]`), else `raw`; with no file read (a merge of nothing new), the kind stored
    with the data set."""
    if stated == "adjusted":
        return "adjusted"
    if read:
        return "adjusted" if all(b == "adjusted" for b in read) else "raw"
    return stored if stored in PRICE_KINDS else "raw"


@dataclass(frozen=True)
class CleaningRule:
    """The thresholds of the cleaning stage (log moves; sigma = the stock's robust daily vol).

    A move is examined when its excess over the group's median move that day is at least
    `floor` and `min_sigmas` sigma; a kept one is listed when its excess is `list_floor`. It is
    left out when one signature holds in full:

    - print: reversed by `reversal` (a share of the move) within `max_run` returns, both ends
      `print_sigmas` sigma and `print_floor`, each day's group move at most `group_share` of
      the stock's, back by the next open (`print_open_back`) where opens are known, no volume
      rush (`spike` times the 63-session median in shares and in dollars);
    - split (raw closes): within the split tolerance of a ratio of SPLIT_RATIOS, the level
      stays, dollar turnover below `split_spike` x its median, and below `split_doubt` x
      where the open is not within `split_open` of the move or the level gives back
      `split_giveback` (a crash that happens to fall by a ratio: PCG 2019-01-14, NFLX
      2011-10-25); or a move of `rebase_floor` that matches no ratio, with dollar turnover
      below `rebase_spike` x (a reverse split with a spin-off);
    - distribution (raw closes): a fall of `dist_floor` and `dist_sigmas` sigma whose level
      stays, shares below `dist_spike` x and dollars below `spike` x their median;
    and for the last two: the open at `open_share` of the move where opens are known (the
    price was re-based overnight), fewer co-movers than `comove_min` or `comove_share` of the
    session's symbols (others moving half as much the same way). "The level stays": within
    `horizon` sessions the price gives back less than `max_giveback` of the move
    (`blind_giveback` on close-only rows, where a split also needs a whole ratio and
    `blind_split_sigmas`).
    """

    floor: float = 0.10
    min_sigmas: float = 8.0
    list_floor: float = 0.20
    lookback: int = 63
    min_history: int = 20
    default_sigma: float = 0.02
    sigma_floor: float = 0.005
    min_group: int = 5
    horizon: int = 5
    max_giveback: float = 0.5
    open_share: tuple[float, float] = (0.7, 1.3)
    spike: float = 5.0
    split_spike: float = 5.0
    split_doubt: float = 2.5
    split_open: float = 0.1
    split_giveback: float = 0.15
    rebase_floor: float = 0.69
    rebase_spike: float = 2.5
    dist_spike: float = 10.0
    comove_min: int = 3
    comove_share: float = 0.01
    split_tolerance: float = 0.03
    split_tol_sigmas: float = 3.0
    split_max_tolerance: float = 0.06
    split_max_tolerance_large: float = 0.12
    fraction_tolerance: float = 0.005
    dist_floor: float = 0.30
    dist_sigmas: float = 15.0
    print_floor: float = 0.15
    print_sigmas: float = 10.0
    reversal: tuple[float, float] = (0.7, 1.4)
    max_run: int = 3
    print_open_back: float = 0.6
    group_share: float = 0.25
    factor_eps: float = 1e-6
    # Rows without an open and a volume ("blind": a close-only file) have less evidence, so
    # they need more of what is left.
    blind_print_sigmas: float = 25.0
    blind_split_sigmas: float = 20.0
    blind_giveback: float = 0.25
    blind_max_run: int = 2


def _stays(ev: dict[str, float], rule: CleaningRule) -> bool:
    """The level stays (unknown on the last session: taken as staying until later data)."""
    limit = rule.blind_giveback if ev["blind"] else rule.max_giveback
    return not ev["giveback"] >= limit


def _rebased(ev: dict[str, float], rule: CleaningRule) -> bool:
    """Opened at the new level (true where the file has no opens)."""
    lo, hi = rule.open_share
    return not np.isfinite(ev["open_share"]) or lo <= ev["open_share"] <= hi


def rush(ev: dict[str, float], rule: CleaningRule) -> bool:
    """A print's volume rush: shares and dollars both `spike` x their median (false where
    the file has no volume)."""
    return bool(ev["volume_ratio"] >= rule.spike and ev["dollar_volume_ratio"] >= rule.spike)


def _split_crash(ev: dict[str, float], rule: CleaningRule) -> str:
    """Why a move of a split ratio is a crash, or "": dollar turnover a split does not bring
    (a split leaves it as it was; the share count is not evidence, it moves by the ratio)."""
    dollars = _dollars(ev)
    if dollars >= rule.split_spike:
        return f"dollar volume {dollars:.1f}x its median or more: a rush a split does not bring"
    off_open = np.isfinite(ev["open_share"]) and abs(ev["open_share"] - 1.0) > rule.split_open
    gave = ev["giveback"] >= rule.split_giveback
    if dollars >= rule.split_doubt and (off_open or gave):
        how = f"opened at {ev['open_share']:.0%}" if off_open else f"gave back {ev['giveback']:.0%}"
        return f"dollar volume {dollars:.1f}x its median and {how}: traded like a crash"
    return ""


def _dollars(ev: dict[str, float]) -> float:
    """The dollar turnover against its median, the lower of the two readings of a file whose
    volume may be split-adjusted (earlier volumes in today's shares, prices as traded: the
    earlier dollars are then off by the day's re-pricing, 10x on C's 1:10)."""
    d = ev["dollar_volume_ratio"]
    return float(min(d, d * np.exp(-ev["x"])))


def _distribution_rush(ev: dict[str, float], rule: CleaningRule) -> bool:
    """Volume a distribution does not explain: `dist_spike` x the median share turnover (index
    funds trade a spin-off's parent on its ex-date: up to 7x on the real data's) or `spike` x
    the median dollar turnover (the parent is worth less after it: about 2-4x on those days)."""
    return bool(ev["volume_ratio"] >= rule.dist_spike or ev["dollar_volume_ratio"] >= rule.spike)


def _whole(ratio: float) -> bool:
    size = max(ratio, 1.0 / ratio)
    return size >= 2.0 and abs(size - round(size)) < 1e-9


def classify(ev: dict[str, float], rule: CleaningRule, kind: str) -> tuple[str, str]:
    """The kind of a move that is no print, and why (`kind`: what the closes are)."""
    desc = describe(ev)
    if kind == "adjusted":
        return "move", (
            f"{desc}; adjusted closes: a split or distribution is already in the price, so only "
            "a print that reverses or your decision leaves it out"
        )
    if ev["factor_day"] and np.isfinite(ev["raw_e"]):
        raw_z = abs(ev["raw_e"]) / ev["sigma"]
        if abs(ev["raw_e"]) < rule.floor or raw_z < rule.min_sigmas:
            return "factor_mismatch", (
                f"{desc}; the traded price moved {np.expm1(ev['raw_e'] + ev['g']):+.1%}: the "
                "vendor's split/dividend factors made a move the prices do not show"
            )
    against: list[str] = []
    if not _stays(ev, rule):
        against.append(f"gave back {ev['giveback']:.0%} within {rule.horizon} sessions")
    if not _rebased(ev, rule):
        against.append(f"opened at {ev['open_share']:.0%} of the move")
    if ev["co_movers"] >= ev["co_limit"]:
        against.append(f"{ev['co_movers']:.0f} other symbols moved half as much")
    found, what = _signature(ev, rule, against)
    if found and not against:
        if ev["factor_day"]:
            return "factor_mismatch", f"{desc}: the vendor's factors do not explain it ({what}?)"
        return found, f"{desc}: {what}"
    return "move", f"{desc}; a real move: " + ("; ".join(against) or "no event signature")


def _signature(ev: dict[str, float], rule: CleaningRule, against: list[str]) -> tuple[str, str]:
    """The event the move's signature names ('split', 'distribution', or '' for none) and in
    what words; what speaks against it is appended to `against`."""
    blind = bool(ev["blind"])
    ratio = np.isfinite(ev["ratio"])
    if blind:
        ratio = ratio and _whole(ev["ratio"]) and abs(ev["z"]) >= rule.blind_split_sigmas
    if ratio:
        crash = "" if blind else _split_crash(ev, rule)
        if crash:
            against.append(crash)
        return "split", f"a {_ratio_text(ev['ratio'])} split nobody adjusted"
    if blind:
        if abs(ev["e"]) >= rule.dist_floor:
            against.append("closes only: nothing tells a spin-off from a crash")
        return "", ""
    if abs(ev["e"]) >= rule.rebase_floor and _dollars(ev) < rule.rebase_spike:
        what = (
            "re-priced overnight by no split ratio, with ordinary dollar turnover (a split "
            "and a distribution on one day?)"
        )
        return ("split" if ev["x"] > 0 else "distribution"), what
    if ev["x"] < 0 and ev["e"] <= -rule.dist_floor and ev["z"] <= -rule.dist_sigmas:
        found = "distribution" if ev["history"] >= rule.min_history else ""
        if found and _distribution_rush(ev, rule):
            against.append(
                f"volume {ev['volume_ratio']:.1f}x shares, {ev['dollar_volume_ratio']:.1f}x "
                "dollars: a rush"
            )
        return found, "a spin-off or special dividend without a factor"
    if ev["x"] < 0 and ev["e"] <= -rule.list_floor:
        against.append(
            f"a fall under {-np.expm1(-rule.dist_floor):.0%} over its group: an earnings "
            "fall gives the same evidence"
        )
    return "", ""


def describe(ev: dict[str, float]) -> str:
    """The evidence in words."""
    parts = [
        f"{np.expm1(ev['x']):+.1%} ({ev['z']:+.0f} sigma over its group's {np.expm1(ev['g']):+.1%})"
    ]
    if np.isfinite(ev["open_share"]):
        parts.append(f"open at {ev['open_share']:.0%} of the move")
    if np.isfinite(ev["giveback"]):
        parts.append(f"gave back {ev['giveback']:.0%}")
    else:
        parts.append("level not seen yet (last session)")
    if np.isfinite(ev["volume_ratio"]):
        parts.append(
            f"volume {ev['volume_ratio']:.1f}x shares, {ev['dollar_volume_ratio']:.1f}x dollars"
        )
    return ", ".join(parts)


def _ratio_text(ratio: float) -> str:
    if ratio >= 1:
        return f"{ratio:g}:1" if ratio == round(ratio) else f"{2 * ratio:g}:2"
    inverse = 1.0 / ratio
    return f"1:{inverse:g}" if abs(inverse - round(inverse)) < 1e-9 else f"2:{2 * inverse:g}"

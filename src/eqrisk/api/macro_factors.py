"""The real Service B's macro and style factor keys, served from the ETFs of the data set, and
the correlation of a stock's returns with them (docs/decisions/drop-in-routes.md, "Macro
factors").

A key is answered from its own ETF's daily returns when the snapshot holds that ETF. A key whose
series the data lacks is answered as the vendor answers a factor with no rows: no rows in
/api/macro-factors, `null` in a correlation, and a warning naming what is missing; it is never
invented. `term_spread` (the vendor's VGIT) is served from IEF, the nearest Treasury ETF the
data holds, labelled as a proxy in `warnings` and in each row's `metadata`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from eqrisk.snapshot.versions import Snapshot


@dataclass(frozen=True)
class Factor:
    key: str
    sleeve: str  # "macro" or "style"
    etfs: tuple[str, ...]  # the vendor's ETF first, then a proxy the data may hold instead
    aliases: tuple[str, ...]


FACTORS: tuple[Factor, ...] = (
    Factor("inflation", "macro", ("TIP",), ("cpi", "tips", "tip")),
    Factor("term_spread", "macro", ("VGIT", "IEF"), ("ust10y2y", "10y2y", "10y-2y", "ust", "vgit")),
    Factor("short_rates", "macro", ("BIL",), ("short_rate", "rates", "bil", "tbill")),
    Factor("credit", "macro", ("HYG",), ("credit_spread", "hy", "hyg")),
    Factor("oil", "macro", ("USO",), ("wti", "brent", "uso")),
    Factor("gold", "macro", ("GLD",), ("xau", "gld", "bullion")),
    Factor("usd", "macro", ("UUP",), ("dxy", "dollar", "uup")),
    Factor("volatility", "macro", ("VXX",), ("vxx", "vol")),
    Factor("bitcoin", "macro", ("BITO",), ("btc", "xbt", "bito")),
    Factor("vix_spot", "macro", ("VIXCLS",), ("vix", "vixcls")),
    Factor("momentum", "style", ("MTUM",), ("mom", "mtum")),
    Factor("quality", "style", ("QUAL",), ("qual",)),
    Factor("low_vol", "style", ("USMV",), ("lowvol", "min_vol", "minvol", "usmv", "splv")),
    Factor("value", "style", ("VLUE",), ("val", "vlue")),
    Factor("growth", "style", ("IWF",), ("grw", "iwf")),
    Factor("size", "style", ("IWM",), ("small_cap", "smallcap", "iwm")),
    Factor("dividend", "style", ("SCHD",), ("div", "yield", "schd", "hdv")),
    Factor("moat", "style", ("MOAT",), ("wide_moat", "widemoat", "moat")),
)
BY_KEY = {f.key: f for f in FACTORS}
_ALIASES = {alias: f.key for f in FACTORS for alias in (f.key, *f.aliases)}
DEFAULT_KEYS = tuple(f.key for f in FACTORS)
_SPLIT = re.compile(r"[\s,]+")
MIN_PAIRS = 30


def parse_keys(given: str | list[str] | None) -> tuple[list[str], list[str]]:
    """Canonical keys asked for (aliases normalised, case-insensitive, de-duplicated; none
    given: all 18) and the unknown names (dropped by the caller with a warning)."""
    if given is None:
        return list(DEFAULT_KEYS), []
    names = _SPLIT.split(given.strip()) if isinstance(given, str) else given
    keys: list[str] = []
    unknown: list[str] = []
    for name in (n.strip().lower() for n in names):
        if not name:
            continue
        key = _ALIASES.get(name)
        if key is None:
            unknown.append(name)
        elif key not in keys:
            keys.append(key)
    return keys, unknown


@dataclass(frozen=True)
class Series:
    """A factor as served: its ETF row in the snapshot (None: the data lacks it) and the
    warning that says so, or that a proxy stands in."""

    key: str
    etf: str | None
    row: int | None
    warning: str | None

    @property
    def proxy(self) -> bool:
        return self.etf is not None and self.etf != BY_KEY[self.key].etfs[0]


def series_of(snap: Snapshot, key: str) -> Series:
    factor = BY_KEY[key]
    symbols = snap.index.symbols
    for etf in factor.etfs:
        sym = symbols.get(etf)
        if sym is not None and sym.last >= 0:
            warning = None
            if etf != factor.etfs[0]:
                warning = (
                    f"{key}: {etf} stands in as a proxy for {factor.etfs[0]}, which the data set "
                    "does not hold"
                )
            return Series(key, etf, sym.row, warning)
    wanted = " or ".join(factor.etfs)
    return Series(key, None, None, f"{key}: no series ({wanted} is not in the data set)")


def factor_returns(snap: Snapshot, s: Series) -> np.ndarray:
    """The factor's daily simple returns over every session (NaN throughout when missing)."""
    if s.row is None:
        return np.full(len(snap.sessions), np.nan)
    return np.asarray(snap.array("return")[s.row], dtype=np.float64)


def correlation(
    stock: np.ndarray, factor: np.ndarray, window: int, method: str
) -> tuple[float | None, int]:
    """(correlation, pairs used) of two aligned daily series: the last `window` sessions where
    both have a value; None under MIN_PAIRS pairs or with zero variance. Spearman is the
    Pearson correlation of average ranks (ties share their mean rank), as pandas computes it."""
    both = np.flatnonzero(np.isfinite(stock) & np.isfinite(factor))
    if len(both) < MIN_PAIRS:
        return None, len(both)
    used = both[-window:]
    a, b = stock[used], factor[used]
    if method == "spearman":
        a = pd.Series(a).rank().to_numpy()
        b = pd.Series(b).rank().to_numpy()
    if np.std(a) == 0 or np.std(b) == 0:
        return None, len(used)
    value = float(np.corrcoef(a, b)[0, 1])
    return (value if np.isfinite(value) else None), len(used)

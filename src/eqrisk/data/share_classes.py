"""Share classes of one company (GOOG and GOOGL, BRK.A and BRK.B, ...) share one company cap.

A share-count or market-cap source that lists each class with the company's market cap (the S&P
constituents files do) gives every class the whole company: Alphabet would count twice in the
treemap and in cap weights. The project's map (`reference/share_classes.csv`: company, symbol;
`EQRISK_SHARE_CLASSES` overrides it, an empty file turns it off) says which symbols are one
company; on each session the company's cap is the mean of its classes' caps, split equally
between the classes that have one, so the classes together count the company once.

A class not priced on a session (a partial update priced GOOGL but not yet GOOG) still counts
for CARRY_SESSIONS sessions with its last cap: the heatmap shows each stock's cap of its last
priced session within as many sessions (`snapshot.index.RECENT_SESSIONS`), so the priced class
must not take the whole company beside the unpriced one's stale half (issue 39: GOOGL 4.29T
beside GOOG 2.18T).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

CARRY_SESSIONS = 5  # equal to snapshot.index.RECENT_SESSIONS (a test keeps them equal)


def read_share_classes(path: Path | None = None) -> dict[str, str]:
    """symbol -> company of a map (CSV with columns company, symbol); the project's by default.
    ValueError (one line) for a file without those columns."""
    if path is None:
        ref = resources.files("eqrisk.data").joinpath("reference", "share_classes.csv")
        with ref.open("rb") as fh:
            frame = pd.read_csv(fh, dtype=str, keep_default_na=False)
    else:
        frame = pd.read_csv(Path(path), dtype=str, keep_default_na=False)
    names = {str(c).strip().lower(): c for c in frame.columns}
    if "company" not in names or "symbol" not in names:
        raise ValueError(f"{path}: a share-class map needs columns company, symbol")
    symbols = frame[names["symbol"]].str.strip().str.upper()
    company = frame[names["company"]].str.strip()
    keep = (symbols != "") & (company != "")
    return dict(zip(symbols[keep], company[keep], strict=True))


def company_caps(
    caps: np.ndarray, symbols: np.ndarray, classes: dict[str, str], *, copy: bool = True
) -> np.ndarray:
    """Caps (symbols x sessions) with each company of two or more listed classes counted once:
    each class with a cap that day carries the mean of the classes' caps / their number, a class
    without one that day counting with its cap of up to CARRY_SESSIONS sessions before
    (`copy=False`: in `caps` itself)."""
    out = caps.copy() if copy else caps
    groups: dict[str, list[int]] = {}
    for i, symbol in enumerate(symbols.tolist()):
        company = classes.get(str(symbol))
        if company is not None:
            groups.setdefault(company, []).append(i)
    for rows in groups.values():
        if len(rows) < 2:
            continue
        block = caps[rows]
        priced = np.isfinite(block)
        carried = pd.DataFrame(block).ffill(axis=1, limit=CARRY_SESSIONS).to_numpy()
        has = np.isfinite(carried)
        count = has.sum(axis=0)
        total = np.where(has, carried, 0.0).sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            each = total / count**2  # the mean cap (total / count), split between count classes
        out[rows] = np.where(priced, each[None, :], np.nan)
    return out

"""Issue 39: after `update --partial` priced GOOGL but not GOOG, Alphabet's cap counted about
1.5 times in the heatmap (GOOGL took the whole company beside GOOG's stale half). A class not
priced on a session counts, for as many sessions as the heatmap looks back, with its last cap."""

from __future__ import annotations

import numpy as np

from eqrisk.data.share_classes import CARRY_SESSIONS, company_caps
from eqrisk.snapshot.index import RECENT_SESSIONS

CLASSES = {"GOOG": "Alphabet", "GOOGL": "Alphabet"}


def _latest(caps: np.ndarray) -> np.ndarray:
    """Each row's cap of its last priced session (what the heatmap shows)."""
    out = np.full(len(caps), np.nan)
    for i, row in enumerate(caps):
        seen = np.flatnonzero(np.isfinite(row))
        out[i] = row[seen[-1]] if len(seen) else np.nan
    return out


def test_an_unpriced_class_still_counts_so_the_company_counts_once() -> None:
    symbols = np.array(["AAPL", "GOOG", "GOOGL"])
    # Each class listed with the whole company's cap (the S&P files do), Alphabet growing.
    company = np.array([4.20e12, 4.25e12, 4.30e12])
    caps = np.vstack([[3.9e12] * 3, company, company])
    caps[1, -1] = np.nan  # the partial update priced GOOGL, not yet GOOG
    out = company_caps(caps, symbols, CLASSES)
    latest = _latest(out)
    # The heatmap's Alphabet: GOOG's half on its last priced session plus GOOGL's share today.
    assert latest[1] == company[1] / 2
    assert latest[2] == (company[2] + company[1]) / 4
    assert abs(latest[1] + latest[2] - company[2]) < 0.01 * company[2]  # once, not 1.5 times
    assert latest[0] == 3.9e12  # other stocks untouched
    np.testing.assert_array_equal(out[1:, :2], np.vstack([company[:2] / 2, company[:2] / 2]))


def test_a_class_gone_longer_than_the_heatmap_looks_back_stops_counting() -> None:
    symbols = np.array(["GOOG", "GOOGL"])
    n = CARRY_SESSIONS + 3
    caps = np.full((2, n), 2.0e12)
    caps[0, 1:] = np.nan  # GOOG last priced on the first session
    out = company_caps(caps, symbols, CLASSES)
    assert out[1, CARRY_SESSIONS] == 2.0e12 / 2  # GOOG's cap still carried
    assert out[1, CARRY_SESSIONS + 1] == 2.0e12  # then GOOGL is the company alone
    assert RECENT_SESSIONS == CARRY_SESSIONS

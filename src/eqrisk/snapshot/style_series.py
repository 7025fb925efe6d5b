"""The second layer's style factors as Service A series: their daily returns and each stock's
loadings, read from the layer's stored files (`risk_layer`), for `/facts`, `/betas`,
`/factor_list` and `eqrisk export factors` (docs/decisions/factor-frames.md).

The timing is Service A's: the return at `teo` t is the factor's return on session t (the
session's cross-sectional regression, `sret`), and the loading at `teo` t is the exposure known
at the close of t, which the forecast and the regression of session t + 1 use (`sexp` of t + 1,
or `next-sexp` for the last close), so that loading(t - 1) x return(t) is the factor's part of
the return of t, as for the betas. A stock loads on the style factors on the sessions it is in
the layer (a non-zero exposure row); a version without the layer has no style factors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from eqrisk.snapshot.risk_layer import RISK_DIR, is_next, read_next, sessions_of
from eqrisk.snapshot.version import Snapshot


def style_names(manifest: Mapping[str, Any]) -> list[str]:
    """The version's style factors in F's order (none without the second layer)."""
    block = (manifest.get("risk") or {}).get("styles")
    return list(block["names"]) if block else []


def style_text(manifest: Mapping[str, Any]) -> dict[str, str]:
    """What each style factor is (the manifest's words)."""
    block = (manifest.get("risk") or {}).get("styles")
    return dict(block["text"]) if block else {}


def _chunked(snap: Snapshot, prefix: str, lo: int, hi: int) -> list[tuple[int, np.ndarray]]:
    """(offset from lo, rows) of the per-session files `prefix-<c>` over sessions [lo, hi)."""
    chunk = int(snap.manifest["arrays"]["grid"]["chunk"])
    out = []
    t = lo
    while t < hi:
        c, k = divmod(t, chunk)
        n = min(chunk - k, hi - t)
        block = np.load(snap.path / RISK_DIR / f"{prefix}-{c:05d}.npy", mmap_mode="r")
        out.append((t - lo, block[k : k + n]))
        t += n
    return out


def style_returns(snap: Snapshot, lo: int, hi: int) -> np.ndarray:
    """(hi - lo, S) the style factor returns of sessions [lo, hi) (NaN: not estimated)."""
    out = np.full((max(hi - lo, 0), len(style_names(snap.manifest))), np.nan)
    for at, block in _chunked(snap, "sret", lo, min(hi, sessions_of(snap.manifest))):
        out[at : at + len(block)] = block
    return out


def style_loadings(
    snap: Snapshot, rows: Sequence[int] | np.ndarray, lo: int, hi: int
) -> np.ndarray:
    """(len(rows), hi - lo, S) the loadings of symbol rows at `teo` [lo, hi): the exposures
    of the session after each (NaN where the version holds none: after the last close
    without a next-session forecast)."""
    rows = np.asarray(rows, dtype=np.int64)
    s = len(style_names(snap.manifest))
    out = np.full((len(rows), max(hi - lo, 0), s), np.nan)
    total = sessions_of(snap.manifest)
    for at, block in _chunked(snap, "sexp", lo + 1, min(hi + 1, total)):
        out[:, at : at + len(block)] = np.transpose(np.asarray(block)[:, rows, :], (1, 0, 2))
    if lo < total <= hi and is_next(snap.manifest, total):
        out[:, total - 1 - lo] = read_next(snap.path, "next-sexp")[rows]
    return out


def in_layer(loadings: np.ndarray) -> np.ndarray:
    """(..., S) loadings -> (...) whether the stock is in the layer there (published)."""
    out: np.ndarray = np.isfinite(loadings).all(axis=-1) & (loadings != 0.0).any(axis=-1)
    return out

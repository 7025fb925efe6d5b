"""Fields that are exact functions of stored ones (derived on read, never stored when the
writer has checked that the function gives back every bit)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from eqrisk.snapshot.chunks.grid import ChunkGrid, Sliceable
from eqrisk.snapshot.chunks.layout import same_bits

# Fields that are exact functions of others: (operation, source fields). Stored anyway when the
# writer finds a single differing bit.
DERIVATIONS: dict[str, tuple[str, ...]] = {
    "beta_mkt": ("same", "l1_mkt_hr"),
    "beta_sec": ("same", "l2_sec_hr"),
    "l1_rr": ("minus", "return", "l1_cfr"),
    "l2_rr": ("minus", "return", "l2_cfr"),
    "l3_rr": ("minus", "return", "l3_cfr"),
    "l1_res_er": ("one_minus", "l1_mkt_er"),
    # The cascade's `1.0 - er_m - er_s [- er_u]`, left to right; a row without the deeper
    # level (an ETF: L1 carried into the L2/L3 columns, its sector share NaN) stops earlier.
    "l2_res_er": ("one_minus_known", "l2_mkt_er", "l2_sec_er"),
    "l3_res_er": ("one_minus_known", "l3_mkt_er", "l3_sec_er", "l3_sub_er"),
}


def derive(op: str, sources: list[Any]) -> Any:
    """Apply one derivation to values read from its sources (arrays or scalars)."""
    if op == "same":
        return sources[0]
    if op == "minus":
        return np.subtract(sources[0], sources[1])
    if op == "one_minus":
        return np.subtract(1.0, sources[0])
    if op == "one_minus_known":
        out = np.subtract(1.0, sources[0])
        for more in sources[1:]:
            # `more == more` is False where NaN: there the level is absent, nothing subtracted.
            out = np.subtract(out, more, out=np.asarray(out), where=np.equal(more, more))
        return out[()] if np.ndim(out) == 0 else out  # one value stays a scalar
    raise ValueError(f"unknown derivation {op!r}")


def derivable(name: str, fields: Mapping[str, Sliceable], grid: ChunkGrid) -> bool:
    """True when DERIVATIONS[name] gives back every bit of `fields[name]` (checked per block)."""
    rule = DERIVATIONS.get(name)
    if rule is None or not all(s in fields and s not in DERIVATIONS for s in rule[1:]):
        return False
    op, *sources = rule
    for b in range(grid.blocks):
        r0, r1 = grid.rows(b)
        want = np.ascontiguousarray(fields[name][r0:r1, :], dtype=np.float64)
        with np.errstate(all="ignore"):
            got = derive(op, [np.asarray(fields[s][r0:r1, :], dtype=np.float64) for s in sources])
        if not same_bits(np.ascontiguousarray(got, dtype=np.float64), want):
            return False
    return True


def derivable_from(name: str, fields: Mapping[str, Sliceable], grid: ChunkGrid, lo: int) -> bool:
    """True when DERIVATIONS[name] gives back every bit of `fields[name]` from session `lo` on
    (an incremental build's new sessions; the earlier ones were checked when written)."""
    rule = DERIVATIONS.get(name)
    if rule is None:
        return False
    op, *sources = rule
    for b in range(grid.blocks):
        r0, r1 = grid.rows(b)
        want = np.ascontiguousarray(fields[name][r0:r1, lo:], dtype=np.float64)
        with np.errstate(all="ignore"):
            got = derive(op, [np.asarray(fields[s][r0:r1, lo:], dtype=np.float64) for s in sources])
        if not same_bits(np.ascontiguousarray(got, dtype=np.float64), want):
            return False
    return True

"""Incremental builds that read only the end of the ingested data set.

An incremental build needs the history only to prove it unchanged and to warm the model's
rolling series up before its first new chunk. The ingested data set proves the first part on
its own: each partition file (a symbol block and a calendar year) has a digest, and a version
records the digests of the data set it was built from (`data_proof`, in the manifest's
`inputs.data`). The years before the first partition that differs are then the previous
version's inputs, unread: the time chunks before that year's first session are proved
unchanged (`Window.proved`), and the build reads the sessions from `Window.base` on, a
multiple of the window `warmup` sessions earlier or more, from where every input series the
digests cover and every series of the tail run is exact again: the group portfolios'
winsorisation looks back MEMBER_VOL_WINDOW sessions; the kernels (the link betas of the flat
model, the tail run's cascade) re-anchor from scratch at multiples of the window and then
look back one window; the tail run starts two windows before its first chunk.

Anything else that reaches the history (the return breaks, the share-class map, the first
session, a data set without digests) sends the build back to the whole history, which then
decides as before; so does a tail that turns out not to be incremental.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from eqrisk.build.incremental import digest
from eqrisk.data.ingested import Stored
from eqrisk.data.panel import Panel
from eqrisk.model.resume import warmup
from eqrisk.model.run import ModelPlan, ModelResult
from eqrisk.snapshot import chunks
from eqrisk.snapshot.spliced import FieldSource, splice
from eqrisk.snapshot.tables import PANEL_ARRAYS

PROOF = "data-2"  # bump when what `data_proof` covers changes: older proofs never match


def data_proof(
    found: Stored, breaks: list[Any], share_classes: dict[str, str]
) -> dict[str, Any] | None:
    """What the ingested data set says about its history, for the next build to compare: the
    digest of every partition file, its first session, and digests of the return breaks and
    the share-class map (both reach every session). None when the data set records no
    partition digests (written before them, or one file)."""
    if found.legacy or found.digests is None:
        return None
    first = found.stats.days["date"].min()
    return {
        "scheme": PROOF,
        "parts": {f"{b}/{y}": d for (b, y), d in sorted(found.digests.items())},
        "first": str(pd.Timestamp(first).date()) if pd.notna(first) else None,
        "breaks": digest(sorted([str(s), str(d)] for s, d in breaks)),
        "share_classes": digest(sorted(share_classes.items())),
    }


@dataclass(frozen=True)
class Window:
    """The sessions a tail build reads: from `base` (an index into `calendar`, every session of
    the data set) on; the first `proved` time chunks are the previous version's."""

    base: int
    proved: int
    calendar: np.ndarray  # (T,) datetime64[D]

    @property
    def since(self) -> pd.Timestamp:
        return pd.Timestamp(self.calendar[self.base])

    @property
    def digested(self) -> pd.Timestamp | None:
        """The first session of the first chunk not proved: the price fields beyond the
        model's are digested (and written) from there on only, read from its year on. None
        when every chunk is proved (a calendar that ends on a chunk boundary, no partition
        changed): they are read with the others then."""
        at = self.proved * chunks.CHUNK_SESSIONS
        return pd.Timestamp(self.calendar[at]) if at < len(self.calendar) else None


def window_of(
    proof: dict[str, Any] | None,
    previous: dict[str, Any] | None,
    calendar: np.ndarray,
    window: int,
) -> tuple[Window | None, str]:
    """Where a tail build may begin reading, from this data set's proof and the previous
    version's manifest; (None, why) when the whole history is to be read."""
    if proof is None:
        return None, "the ingested data set records no partition digests (the next merge does)"
    old_inputs = (previous or {}).get("inputs") or {}
    old = old_inputs.get("data")
    if not isinstance(old, dict) or old.get("scheme") != PROOF:
        return None, "the previous version records no digests of its data set"
    for key, what in (
        ("first", "the first session"),
        ("breaks", "the return breaks"),
        ("share_classes", "the share classes"),
    ):
        if proof[key] != old.get(key):
            return None, f"{what} changed"
    now_parts, old_parts = proof["parts"], old["parts"]
    changed = [k for k in set(now_parts) | set(old_parts) if now_parts.get(k) != old_parts.get(k)]
    L = chunks.CHUNK_SESSIONS
    full = 0  # the previous version's whole chunks
    for entry in old_inputs.get("chunks", []):
        if int(entry["sessions"]) != L:
            break
        full += 1
    first_changed = len(calendar)
    if changed:
        year = min(int(k.split("/")[1]) for k in changed)
        first_changed = int(np.searchsorted(calendar, np.datetime64(f"{year}-01-01", "D")))
    proved = min(first_changed // L, full)
    base = max(0, (proved * L - warmup(window)) // window * window)
    if base <= 0:
        return None, "the sessions to read reach the data set's start"
    return Window(base, proved, np.asarray(calendar).astype("datetime64[D]")), ""


def tail_panel(panel: Panel, start: int, window: Window, previous: FieldSource) -> Panel:
    """The panel over the whole calendar as the version's writer reads it: sessions >= `start`
    from the tail plan's panel (which begins at `window.base`), earlier ones the previous
    version's stored price fields (read only if asked)."""
    names = {"close": "price_close", "market_cap": "market_cap"}
    names.update({name: name for name in PANEL_ARRAYS})
    new = {name: panel.field(name, start - window.base) for name in names}
    # Panel types its fields as dense arrays; the writer reads these as it reads any field.
    arrays: dict[str, Any] = dict(splice(new, start, previous, stored=names))
    return Panel(symbols=panel.symbols, sessions=window.calendar, **arrays)


def whole_result(
    result: ModelResult, start: int, window: Window, previous: Any, returns_excluded: int
) -> ModelResult:
    """A tail plan's result over the whole calendar: its sessions, the factor returns (the
    previous version's before `start`, the tail's after; K x T, small) and the count of
    returns the breaks exclude over the whole calendar."""
    flat = result.flat
    s = start - window.base
    old = np.asarray(previous.factor_returns[:, :start], dtype=np.float64)
    returns = np.concatenate([old, np.asarray(flat.returns)[:, s:]], axis=1)
    # The sectors' market betas are kept from `start` on only (NaN before: no value kept).
    beta = np.asarray(flat.sector_market_beta)[:, s:]
    link = np.full((len(beta), returns.shape[1]), np.nan)
    link[:, start:] = beta
    whole = replace(flat, returns=returns, market=returns[0], sector_market_beta=link)
    notes = {**result.notes, "returns_excluded": returns_excluded}
    return replace(result, sessions=window.calendar, flat=whole, notes=notes)


def with_history(plan: ModelPlan, previous: dict[str, Any]) -> ModelPlan:
    """A tail plan whose layout names the stocks the missing-cap rule weighted over the whole
    history: the previous version's (whose history before the tail is this one's) and the
    tail's."""
    before = (previous.get("model") or {}).get("caps_imputed_symbols") or []
    imputed = sorted({*map(str, before), *plan.layout.caps_imputed})
    return replace(plan, layout=replace(plan.layout, caps_imputed=imputed))

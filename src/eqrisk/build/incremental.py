"""Incremental builds: reuse the previous version's history when it is proved unchanged.

A build records, in its manifest (`inputs`), digests of everything the model's outputs depend
on: universe-wide ones (symbols, method settings, the classified master, the factor layout:
keys, each row's factor rows incl. leave-one-out, the flat model's exposures, the imputed
caps) and, per time chunk of the chunk grid, the sessions and every input series (returns
after the return breaks, the factor rows the cascade used incl. leave-one-out rows, the flat
factors and their link betas, and the stored price arrays). Every output at session t depends
only on inputs at sessions <= t (the kernels are causal; months and chunks are cut at fixed
session boundaries), so when the universe-wide digests match and the chunk digests match up to
chunk c0, chunks c < c0 of the previous version are what a full rebuild would write: they are
hard-linked unread, and only sessions >= c0 * L are computed (`model.resume.run_from`)
and written.
Otherwise the build says why and recomputes from the first changed chunk, or fully.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import xxhash

import eqrisk
from eqrisk.data.panel import Panel
from eqrisk.model.plan_slices import PlanOutline
from eqrisk.model.run import (
    ModelPlan,
    ModelResult,
    result_of,
)
from eqrisk.snapshot import chunks
from eqrisk.snapshot.spliced import FieldSource, as_arrays, splice
from eqrisk.snapshot.tables import PANEL_ARRAYS

DIGESTS = "inputs-2"  # bump when what the digests cover changes: older manifests never match
CHUNK_INPUTS = ("sessions", "returns", "factors", "flat", "close", *PANEL_ARRAYS, "market_cap")


def digest(*parts: Any) -> str:
    # XXH3-128: these digests detect changed data, not adversaries, and it hashes about 7x
    # faster than blake2b (a one-session build hashes the whole history's inputs).
    h = xxhash.xxh3_128()
    for part in parts:
        if isinstance(part, np.ndarray):
            arr = np.ascontiguousarray(part)
            h.update(_array_head(arr.dtype, arr.shape))
            h.update(_array_bytes(arr))
        else:
            h.update(json.dumps(part, sort_keys=True, default=str).encode())
        h.update(_END)
    return h.hexdigest()


_END = b"|"  # after each part of a digest


def _array_head(dtype: np.dtype[Any], shape: tuple[int, ...]) -> bytes:
    """What a digest hashes of an array before its bytes: its dtype and shape."""
    return str((dtype.str, shape)).encode()


def _array_bytes(values: np.ndarray) -> memoryview:
    """An array's bytes in row-major order, as a digest hashes them."""
    return np.ascontiguousarray(values).view(np.uint8).reshape(-1).data


def _master_frame(master: pd.DataFrame, symbols: np.ndarray) -> list[list[str]]:
    frame = master.set_index("symbol").reindex(symbols).astype(object)
    frame = frame.where(frame.notna(), None)
    return [
        [str(s), *map(str, row)] for s, row in zip(symbols, frame.itertuples(False), strict=True)
    ]


def input_digests(
    plan: ModelPlan,
    panel: Panel,
    master: pd.DataFrame,
    breaks: np.ndarray | None,
    *,
    base: int = 0,
    proved: list[dict[str, Any]] | None = None,
    sessions: int | None = None,
) -> dict[str, Any]:
    """The digests of a build's inputs: universe-wide, then per time chunk of the grid.

    A tail plan (`tail.Window`: the plan's first session is session `base` of a calendar of
    `sessions`) gives the chunks after the `proved` ones (the previous version's entries,
    which the data set proves unchanged, taken as they are); its arrays are exact there."""
    layout, flat = plan.layout, plan.flat
    universe = universe_digests(plan, master)
    total = len(plan.sessions) + base if sessions is None else sessions
    grid = chunks.ChunkGrid(len(plan.symbols), total)
    days = np.asarray(plan.sessions).astype("datetime64[D]")
    first = len(proved) if proved is not None else 0

    def chunk(c: int) -> dict[str, Any]:
        lo, hi = (t - base for t in grid.cols(c))
        return chunk_digests(
            days[lo:hi],
            plan.returns[:, lo:hi],
            breaks[:, lo:hi] if breaks is not None else None,
            layout.model_factors[:, lo:hi],
            digest(flat.returns[:, lo:hi], flat.sector_market_beta[:, lo:hi]),
            {
                "close": panel.close[:, lo:hi],
                **{
                    name: panel.field(name, lo, hi)
                    for name in PANEL_ARRAYS
                    if name in panel.read  # the others: `RowDigests`, as the blocks read them
                },
                "market_cap": panel.market_cap[:, lo:hi],
            },
        )

    # Threads over chunks: the strided copies of each chunk (numpy) release the GIL.
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        per_chunk = list(pool.map(chunk, range(first, grid.chunks)))
    return {"scheme": DIGESTS, "universe": universe, "chunks": [*(proved or []), *per_chunk]}


def universe_digests(plan: ModelPlan | PlanOutline, master: pd.DataFrame) -> dict[str, str]:
    """The digests of what a build's every session depends on: the universe, the method, the
    code, the master and the factor layout."""
    layout, flat = plan.layout, plan.flat
    return {
        "symbols": digest(plan.symbols.astype(str).tolist()),
        "method": digest(plan.shared.params.describe()),
        "code": digest(eqrisk.__version__, DIGESTS),
        "master": digest(_master_frame(master, plan.symbols)),
        "layout": digest(
            layout.keys, layout.fidx, layout.model_fidx, flat.names, flat.sources, flat.exposure
        ),
        "caps_imputed": digest(sorted(layout.caps_imputed)),
    }


def chunk_digests(
    days: np.ndarray,
    returns: np.ndarray,
    breaks: np.ndarray | None,
    model_factors: np.ndarray,
    flat: str,
    prices: dict[str, np.ndarray],
) -> dict[str, Any]:
    """The digests of one time chunk of a build's inputs (each array: that chunk's columns):
    its sessions, returns and returns left out, every factor row, the flat model's factors
    (`flat`: their digest) and the price fields (`prices`, in their order)."""
    digests = {
        "sessions": digest(days),
        "returns": digest(returns, breaks if breaks is not None else 0),
        "factors": digest(model_factors),
        "flat": flat,
        **{name: digest(values) for name, values in prices.items()},
    }
    return {"sessions": len(days), "digests": digests}


class RowDigests:
    """`digest(field[:, lo:hi])` of every time chunk of some fields that are never whole in
    memory: fed their rows one block at a time, in row order (a chunk's bytes are its rows'
    one after the other), so the digests equal, bit for bit, those of the whole arrays."""

    def __init__(self, names: tuple[str, ...], n: int, t: int) -> None:
        self.names, self.n, self.next = names, n, 0
        grid = chunks.ChunkGrid(n, t)
        self.cols = [grid.cols(c) for c in range(grid.chunks)]
        self.hashes: dict[str, list[Any]] = {}
        for name in names:
            self.hashes[name] = []
            for lo, hi in self.cols:
                h = xxhash.xxh3_128()
                h.update(_array_head(np.dtype(np.float64), (n, hi - lo)))
                self.hashes[name].append(h)

    def feed(self, start: int, rows: dict[str, np.ndarray]) -> None:
        """Rows [start, start + b) of every field (float64, b x T); rows fed before (a block
        read again for a second pass) are not fed twice."""
        size = len(rows[self.names[0]])
        if start + size <= self.next:
            return
        if start != self.next:
            raise RuntimeError(f"rows fed out of order: {start}, expected {self.next}")
        for name in self.names:
            values = np.asarray(rows[name], dtype=np.float64)
            for h, (lo, hi) in zip(self.hashes[name], self.cols, strict=True):
                h.update(_array_bytes(values[:, lo:hi]))
        self.next = start + size

    def into(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """`input_digests`'s answer with these fields' digests added to every chunk."""
        if self.next != self.n:
            raise RuntimeError(f"rows fed up to {self.next} of {self.n}")
        done = []
        for c, entry in enumerate(inputs["chunks"]):
            more = {}
            for name in self.names:
                h = self.hashes[name][c].copy()
                h.update(_END)
                more[name] = h.hexdigest()
            done.append({**entry, "digests": {**entry["digests"], **more}})
        return {**inputs, "chunks": done}


@dataclass
class Decision:
    """Where a build may start: chunk c0 (0 = a full build) and why not later."""

    chunk: int
    reasons: list[str] = field(default_factory=list)


def _date(sessions: np.ndarray, t: int) -> str:
    return str(np.asarray(sessions).astype("datetime64[D]")[t])


def decide(
    digests: dict[str, Any],
    previous: dict[str, Any] | None,
    plan: ModelPlan,
    previous_close: Any = None,
    *,
    calendar: np.ndarray | None = None,
    base: int = 0,
) -> Decision:
    """The first time chunk to compute, comparing this build's input digests with the previous
    version's manifest; the reasons say what stopped reuse earlier. A tail plan gives its
    `calendar` (every session) and `base` (where its own sessions begin in it)."""
    sessions = plan.sessions if calendar is None else calendar
    if previous is None:
        return Decision(0, ["no previous version"])
    old = previous.get("inputs")
    unusable = _unusable(previous)
    if unusable is not None:
        return Decision(0, [unusable])
    assert isinstance(old, dict)
    reasons = _universe_changes(digests["universe"], old["universe"], previous, plan)
    if reasons:
        return Decision(0, reasons)
    now_c, old_c = digests["chunks"], old["chunks"]
    c0 = _reused_chunks(now_c, old_c)
    full = chunks.CHUNK_SESSIONS
    if c0 < min(len(now_c), len(old_c)) and old_c[c0]["sessions"] == full:
        changed = sorted(
            k for k in now_c[c0]["digests"] if now_c[c0]["digests"][k] != old_c[c0]["digests"][k]
        )
        reasons.append(_revision(c0, changed, plan, previous_close, sessions, base))
    elif c0 < len(now_c):
        reasons.append(_recomputed_from(c0, old_c, sessions))
    return Decision(c0, reasons)


def _unusable(previous: dict[str, Any]) -> str | None:
    """Why the previous version's manifest cannot be compared with at all, or None."""
    old = previous.get("inputs")
    if not isinstance(old, dict) or old.get("scheme") != DIGESTS or "arrays" not in previous:
        return "the previous version records no input digests (built before them)"
    if previous["arrays"].get("layout") != chunks.LAYOUT:
        was = previous["arrays"].get("layout")
        return f"the previous version's chunks have another layout ({was})"
    return None


def _universe_changes(
    now_u: dict[str, Any], old_u: dict[str, Any], previous: dict[str, Any], plan: ModelPlan
) -> list[str]:
    """What changed of the whole universe (code, method, symbols, master, layout, the stocks
    weighted by the missing-cap rule): any of it recomputes every chunk."""
    reasons: list[str] = []
    if now_u.get("code") != old_u.get("code"):
        was_code = previous.get("eqrisk_version")
        reasons.append(f"eqrisk version changed ({was_code} -> {eqrisk.__version__})")
    if now_u["method"] != old_u["method"]:
        was = previous.get("method", {})
        now = plan.shared.params.describe()
        changed = sorted(k for k in now if was.get(k) != now[k])
        reasons.append("method settings changed: " + ", ".join(changed) if changed else "")
    if now_u["symbols"] != old_u["symbols"]:
        reasons += _symbol_changes(previous, plan)
    elif now_u["master"] != old_u["master"]:
        reasons.append("security master changed")
    if not reasons and now_u["layout"] != old_u["layout"]:
        reasons.append("factor hierarchy changed (ETFs or groups of the layout)")
    if not reasons and now_u["caps_imputed"] != old_u["caps_imputed"]:
        reasons.append("the stocks weighted by the missing-cap rule changed")
    return [r or "method settings changed" for r in reasons]


def _symbol_changes(previous: dict[str, Any], plan: ModelPlan) -> list[str]:
    """The symbols added and removed since the previous version (or that they moved)."""
    before = set(_previous_symbols(previous))
    now_set = set(plan.symbols.astype(str).tolist())
    added, removed = sorted(now_set - before), sorted(before - now_set)
    reasons = []
    if added:
        reasons.append(f"new symbols: {_names(added)}")
    if removed:
        reasons.append(f"symbols removed: {_names(removed)}")
    return reasons or ["symbols reordered"]


def _reused_chunks(now_c: list[dict[str, Any]], old_c: list[dict[str, Any]]) -> int:
    """The leading time chunks that are full in both versions with the same input digests."""
    full = chunks.CHUNK_SESSIONS
    c0 = 0
    while (
        c0 < min(len(now_c), len(old_c))
        and old_c[c0]["sessions"] == full
        and now_c[c0]["sessions"] == full
        and now_c[c0]["digests"] == old_c[c0]["digests"]
    ):
        c0 += 1
    return c0


def _recomputed_from(c0: int, old_c: list[dict[str, Any]], sessions: np.ndarray) -> str:
    """Why chunk c0, the previous version's last (partial) one, is recomputed: new sessions,
    or the last chunk's own."""
    lo = c0 * chunks.CHUNK_SESSIONS
    old_t = sum(int(e["sessions"]) for e in old_c)
    first_new = max(lo, min(old_t, len(sessions) - 1))
    if old_t < len(sessions):
        return (
            f"new sessions from {_date(sessions, first_new)}"
            f" ({len(sessions) - old_t}); recomputing from {_date(sessions, lo)}"
        )
    return f"the last chunk recomputed from {_date(sessions, lo)}"


def _names(symbols: list[str], most: int = 10) -> str:
    more = f" and {len(symbols) - most} more" if len(symbols) > most else ""
    return ", ".join(symbols[:most]) + more


def _previous_symbols(previous: dict[str, Any]) -> list[str]:
    names = previous.get("symbol_names", [])
    return [str(s) for s in names]


def _revision(
    c: int,
    changed: list[str],
    plan: ModelPlan,
    previous_close: Any,
    sessions: np.ndarray,
    base: int,
) -> str:
    """Why chunk c cannot be reused: which inputs changed, and for prices, how many symbols
    from which session (the previous version's prices of that chunk, compared)."""
    lo, hi = c * chunks.CHUNK_SESSIONS, (c + 1) * chunks.CHUNK_SESSIONS
    if "sessions" in changed:
        return f"the session calendar changed from {_date(sessions, lo)}"
    price_inputs = {"close", "returns", *PANEL_ARRAYS, "market_cap"}
    if previous_close is not None and price_inputs & set(changed):
        old = np.asarray(previous_close[:, lo:hi], dtype=np.float64)
        new = plan.panel.close[:, lo - base : hi - base]
        width = min(old.shape[1], new.shape[1])  # the shorter of the two ends the chunk
        old, new = old[:, :width], new[:, :width]
        differs = ~((old == new) | (np.isnan(old) & np.isnan(new)))
        rows = np.flatnonzero(differs.any(axis=1))
        if len(rows):
            first = lo + int(np.flatnonzero(differs.any(axis=0))[0])
            names = _names(plan.symbols[rows].astype(str).tolist(), 5)
            return (
                f"prices revised for {len(rows)} symbols ({names}) from "
                f"{_date(sessions, first)}; recomputing from {_date(sessions, lo)}"
            )
    return f"inputs changed ({', '.join(changed)}) from {_date(sessions, lo)}"


def tail_result(
    plan: ModelPlan, tail: dict[str, np.ndarray], start: int, previous: FieldSource
) -> ModelResult:
    """A ModelResult over the whole calendar whose metrics are the new sessions spliced onto
    the previous version's (`spliced.splice`: earlier sessions read lazily from it)."""
    return result_of(plan, as_arrays(splice(tail, start, previous)))


def first_last(
    plan: ModelPlan,
    start: int,
    previous_symbols: pd.DataFrame,
    sessions: np.ndarray,
    base: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's first and last priced session (-1 = none): from the new sessions where they
    are there, else from the previous version's symbols table (same rows, same history).
    `sessions`: the whole calendar; the plan's begin at its session `base`."""
    price = plan.panel.close[:, start - base :]
    has = np.isfinite(price)
    any_new = has.any(axis=1)
    width = price.shape[1]
    last_new = start + width - 1 - np.argmax(has[:, ::-1], axis=1)
    first_new = start + np.argmax(has, axis=1)
    before = np.asarray(sessions).astype("datetime64[D]")[:start]  # ascending, distinct

    def index(values: pd.Series) -> np.ndarray:
        """Each day's place among the sessions before `start` (-1: none, or not one)."""
        days = pd.to_datetime(values).to_numpy().astype("datetime64[D]")  # NaT: none
        at = np.searchsorted(before, days)
        found = at < len(before)
        found[found] = before[at[found]] == days[found]
        return np.where(found, at, -1).astype(np.int64)

    prev = previous_symbols.set_index("ticker").reindex(plan.symbols.astype(str))
    old_last, old_first = index(prev["latest_teo"]), index(prev["first_teo"])
    last = np.where(any_new, last_new, old_last)
    first = np.where(old_first >= 0, old_first, np.where(any_new, first_new, -1))
    return first, last


def derivations_hold(fields: dict[str, Any], derived: dict[str, Any], start: int) -> list[str]:
    """The fields the previous version derives on read whose rule breaks from `start` on."""
    grid = chunks.ChunkGrid(fields["return"].shape[0], fields["return"].shape[1])
    return [name for name in derived if not chunks.derivable_from(name, fields, grid, start)]

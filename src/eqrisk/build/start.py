"""Where a build starts (`start_of`), and the run from there when it is not the first session
(`run_tail`): the two steps of the one build path (`pipeline`) that an incremental build adds.

A build starts at time chunk 0 (the whole history) or at the first chunk the input digests
do not prove unchanged (`incremental.decide`), unless something else makes it full: the chunk
grid's block changed, more cells to compute than a Dask build runs in process
(`dask_min_cells`), a risk model that does not resume there (a tail build), or fields the
previous version derives on read whose rule breaks in the new sessions (known after the run).
The `Start` holds the manifest's `build` block; the reasons are said as they are decided.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from eqrisk.build import incremental, tail
from eqrisk.build.block_inputs import StreamedPlan
from eqrisk.build.distributed import RowReader
from eqrisk.build.risk_run import RiskInputs, risk_files, risk_resumes
from eqrisk.data.panel import Panel
from eqrisk.model.resume import BlockMap, run_from
from eqrisk.model.run import ModelPlan, ModelResult
from eqrisk.snapshot.chunks import CHUNK_SESSIONS
from eqrisk.snapshot.store import Previous
from eqrisk.snapshot.tables import PANEL_ARRAYS, MoreFiles, Reuse, Staged


@dataclass
class Start:
    """Where the run starts: time chunk `chunk` (0: the whole history) and the manifest's
    `build` block (mode and reasons; a start > 0 says from where). `cells`: symbols x sessions
    to compute; `decision` the digests' (None: not asked)."""

    chunk: int
    build: dict[str, Any] = field(default_factory=dict)
    cells: int = 0
    decision: incremental.Decision | None = None
    manifest: dict[str, Any] | None = None  # the previous version's (`_manifest`)

    @property
    def whole(self) -> bool:
        return self.chunk == 0


@dataclass
class Reading:
    """What a build read: `panel` (a tail build's from `window.base` on; a streamed plan's
    holds its symbols and sessions only), the return breaks' cells over it (None: a streamed
    plan's are in it), the tail window, the breaks over the whole calendar, where a block
    reads the price fields `panel` lacks (`rows`) and the streamed plan (`block_inputs`)."""

    panel: Panel
    breaks: np.ndarray | None = None
    window: tail.Window | None = None
    returns_excluded: int = 0
    rows: RowReader | None = None
    streamed: StreamedPlan | None = None


@dataclass
class Ran:
    """A run: the result over the whole calendar and the panel to write; from chunk 0 the
    arrays the blocks wrote (`staged`), from a chunk c > 0 the new sessions spliced onto the
    previous version's (`reuse`, with the risk model's files, `more`)."""

    result: ModelResult
    panel: Panel
    reuse: Reuse | None = None
    more: MoreFiles | None = None
    staged: Staged | None = None


@dataclass(frozen=True)
class Asked:
    """What the build was asked: the grid's block, the cells a Dask build runs in process (None:
    no Dask asked), the tail window (None: the whole history read)."""

    block_symbols: int
    dask_min_cells: int | None
    window: tail.Window | None


def start_of(
    opened: Previous,
    plan: ModelPlan,
    digests: dict[str, Any],
    asked: Asked,
    say: Callable[[str], None],
) -> Start:
    """Where a build of `plan` may start, comparing its digests with the previous version's
    (`opened`). With a window (a tail plan) the reasons of a whole-history start are left to
    the caller to say (it reads the whole history then)."""
    window = asked.window
    if opened.problem is not None:
        why = f"previous version unusable: {opened.problem}"
        return Start(0, {"mode": "full", "reasons": [why]})
    previous = opened.snapshot
    manifest = _manifest(opened)
    close = previous.array("price_close") if previous is not None and previous.chunked else None
    calendar = plan.sessions if window is None else window.calendar
    base = 0 if window is None else window.base
    decision = incremental.decide(digests, manifest, plan, close, calendar=calendar, base=base)
    if decision.chunk == 0 or manifest is None or opened.folder is None:
        return whole_after(decision, window, say)
    start = decision.chunk * CHUNK_SESSIONS
    cells = len(plan.symbols) * (len(calendar) - start)
    refused = _not_incremental(manifest, asked, cells, RiskInputs.of(plan, first=base), decision)
    if refused:
        return whole_after(decision, window, say, refused)
    for why in decision.reasons:
        say(why)
    limit = asked.dask_min_cells
    if limit is not None:
        say(f"incremental in process: {cells:,} cells, at most {limit:,} (dask_min_cells)")
    say(f"incremental: computing sessions from {str(calendar[start])[:10]}")
    build = {
        "mode": "incremental",
        "previous": opened.folder.name,
        "from_chunk": decision.chunk,
        "from_session": str(calendar[start])[:10],
        "reasons": decision.reasons,
    }
    if window is not None:
        build["read_from"] = str(window.since.date())
    return Start(decision.chunk, build, cells, decision, manifest)


def whole_after(
    decision: incremental.Decision,
    window: tail.Window | None,
    say: Callable[[str], None],
    *more: str,
) -> Start:
    """A start at the whole history after the digests' decision (and `more` reasons)."""
    reasons = [*decision.reasons, *more]
    if window is None:
        for why in reasons:
            say(why)
    return Start(0, {"mode": "full", "reasons": reasons}, decision=decision)


def _manifest(opened: Previous) -> dict[str, Any] | None:
    """The previous version's manifest with its symbols' names (what `decide` compares)."""
    if opened.snapshot is None:
        return None
    manifest = dict(opened.snapshot.manifest)
    manifest["symbol_names"] = opened.snapshot.symbols["ticker"].astype(str).tolist()
    return manifest


def _not_incremental(
    manifest: dict[str, Any],
    asked: Asked,
    cells: int,
    risk: RiskInputs,
    decision: incremental.Decision,
) -> str | None:
    """Why a build the digests let reuse chunks is full all the same (None: it is not)."""
    block = int(manifest["arrays"]["grid"]["block"])
    if block != asked.block_symbols:
        return f"the chunk grid's block changes ({block} -> {asked.block_symbols} symbols)"
    limit = asked.dask_min_cells
    if limit is not None and cells > limit:
        return f"{cells:,} cells to compute, more than {limit:,} (dask_min_cells)"
    if asked.window is not None and not risk_resumes(manifest, risk, decision.chunk):
        return "the previous version's risk model does not resume there"
    return None


def run_tail(
    opened: Previous, plan: ModelPlan, reading: Reading, start: Start, on: BlockMap
) -> Ran | str:
    """The run from `start` (> 0): every block's sessions from there (`resume.run_from`, its
    blocks on the executor's map `on`), spliced onto the previous version's; or why the
    build is to start at the whole history after all (a derivation the new sessions break)."""
    previous, window = opened.snapshot, reading.window
    assert previous is not None and opened.folder is not None
    manifest = start.manifest
    assert manifest is not None
    calendar = plan.sessions if window is None else window.calendar
    base = 0 if window is None else window.base
    at = start.chunk * CHUNK_SESSIONS
    computed = run_from(plan, at, base=base, on=on)
    result = incremental.tail_result(plan, computed, at, previous)
    written = reading.panel
    if window is not None:
        result = tail.whole_result(result, at, window, previous, reading.returns_excluded)
        written = tail.tail_panel(reading.panel, at, window, previous)
    fields: dict[str, Any] = dict(result.metrics)
    for name in PANEL_ARRAYS:
        fields[name] = written.field(name)
    broken = incremental.derivations_hold(fields, manifest["arrays"]["derived"], at)
    if broken:
        return f"fields no longer derived on read: {', '.join(broken)}"
    first, last = incremental.first_last(plan, at, previous.symbols, calendar, base)
    reuse = Reuse(start.chunk, opened.folder, manifest, last, first, start.build)
    risk = RiskInputs.of(plan, first=base)
    return Ran(result, written, reuse, risk_files(result, risk, reuse, written.sessions))

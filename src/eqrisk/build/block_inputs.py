"""What a block task of a full build reads (`BlockSource`): its rows' returns, leave-one-out
factor rows, prices and cap rank, and the factor series every block shares. Two sources:

- `InMemory`: a `ModelPlan` held whole (a panel in memory: the build bench, the tests, a
  rebuild whose history changed);
- `StreamedPlan` (`stream_plan`): the plan computed one time slice at a time
  (`model.plan_slices`), each slice's rows written to files per block of the chunk grid and
  dropped; a block's rows are read back from them. The builder (the Dask driver, or this
  process) never holds a universe-sized (n x T) array: its memory is a slice's (n x
  PIECE_SESSIONS) and one task's rows, whatever the length of the history.

The input digests of a streamed plan are computed as its slices pass (`incremental`'s
`chunk_digests`, the same bytes as a whole plan's), so that the next build can be incremental.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd

from eqrisk.build.incremental import DIGESTS, chunk_digests, digest, universe_digests
from eqrisk.model.plan_slices import LEAD, PlanOutline, PlanShape, plan_outline, slice_rows
from eqrisk.model.run import BlockInput, ModelPlan, SharedFactors
from eqrisk.snapshot import chunks
from eqrisk.snapshot.tables import PANEL_ARRAYS

PRICE_INPUTS = ("close", "market_cap", *PANEL_ARRAYS)
# Time chunks of the grid per slice of a streamed plan: a slice is read with LEAD sessions
# before it, so wider slices read less twice; its arrays are n x (this x CHUNK_SESSIONS).
PIECE_CHUNKS = 4
# (t0, t1) -> the close and market cap of every symbol on sessions [t0, t1) of the calendar.
SliceReader = Callable[[int, int], tuple[np.ndarray, np.ndarray]]


class BlockSource(Protocol):
    """Where the tasks of a full build get their rows."""

    @property
    def plan(self) -> ModelPlan | PlanOutline:
        """What the result is assembled from (`run.result_of`)."""

    @property
    def shape(self) -> tuple[int, int]: ...

    @property
    def shared(self) -> SharedFactors: ...

    @property
    def unread(self) -> tuple[str, ...]:
        """The price inputs the source does not hold (each task's are read for it)."""

    def block(self, start: int, stop: int) -> BlockInput: ...

    def prices(self, start: int, stop: int) -> dict[str, np.ndarray | None]:
        """The rows of every price input it holds; None where all NaN."""

    def rank(self, start: int, stop: int) -> np.ndarray | None:
        """The rows' cap rank; None where all NaN."""


def unless_all_nan(values: np.ndarray) -> np.ndarray | None:
    return None if np.isnan(values).all() else values


class InMemory:
    """The blocks of a plan held whole."""

    def __init__(self, plan: ModelPlan) -> None:
        self.plan = plan
        self.unread = plan.panel.unread
        held = [name for name in PRICE_INPUTS if name not in self.unread]
        self._held = {name: unless_all_nan(getattr(plan.panel, name)) for name in held}

    @property
    def shape(self) -> tuple[int, int]:
        return self.plan.returns.shape

    @property
    def shared(self) -> SharedFactors:
        return self.plan.shared

    @cached_property
    def _rank(self) -> np.ndarray | None:
        return self.plan.cap_ranks()

    def block(self, start: int, stop: int) -> BlockInput:
        return self.plan.block(start, stop)

    def prices(self, start: int, stop: int) -> dict[str, np.ndarray | None]:
        return {k: v[start:stop] if v is not None else None for k, v in self._held.items()}

    def rank(self, start: int, stop: int) -> np.ndarray | None:
        return self._rank[start:stop] if self._rank is not None else None


@dataclass
class StreamedPlan:
    """A plan whose rows are in files of `folder`, `{field}.{block}.{slice}.npy`: per block of
    the chunk grid and slice of sessions, the rows' returns, close, market cap and cap rank,
    and the block's leave-one-out rows (`loo[b]`: their numbers in the model's factor rows)."""

    plan: PlanOutline
    folder: Path
    grid: chunks.ChunkGrid
    pieces: list[tuple[int, int]]
    loo: list[np.ndarray]
    inputs: dict[str, Any]  # the input digests (`incremental.input_digests`'s)
    unread: tuple[str, ...] = PANEL_ARRAYS

    @property
    def shape(self) -> tuple[int, int]:
        return self.grid.n, self.grid.t

    @property
    def shared(self) -> SharedFactors:
        return self.plan.shared

    def _blocks(self, start: int, stop: int) -> range:
        grid = self.grid
        b0, b1 = start // grid.block, -(-stop // grid.block)
        if grid.rows(b0)[0] != start or grid.rows(b1 - 1)[1] != stop:
            raise ValueError(f"rows [{start}, {stop}) are not whole blocks of {grid.block}")
        return range(b0, b1)

    def _read(self, name: str, blocks: range, heights: list[int]) -> np.ndarray:
        out = np.empty((sum(heights), self.grid.t))
        top = 0
        for b, height in zip(blocks, heights, strict=True):
            for p, (t0, t1) in enumerate(self.pieces):
                # Mapped, copied once into place (no temporary array per piece).
                out[top : top + height, t0:t1] = np.load(
                    piece_path(self.folder, name, b, p), mmap_mode="r"
                )
            top += height
        return out

    def _rows(self, name: str, start: int, stop: int) -> np.ndarray:
        blocks = self._blocks(start, stop)
        heights = [self.grid.rows(b)[1] - self.grid.rows(b)[0] for b in blocks]
        return self._read(name, blocks, heights)

    def block(self, start: int, stop: int) -> BlockInput:
        layout = self.plan.layout
        blocks = self._blocks(start, stop)
        own = np.concatenate([self.loo[b] for b in blocks])
        published = layout.factors.shape[0]
        local = layout.model_fidx[start:stop].copy()
        loo = local >= published
        order = np.argsort(own, kind="stable")
        local[loo] = published + order[np.searchsorted(own, local[loo], sorter=order)]
        return BlockInput(
            start=start,
            stop=stop,
            returns=self._rows("returns", start, stop),
            own_factors=self._read("loo", blocks, [len(self.loo[b]) for b in blocks]),
            model_fidx=local,
            exposure=self.plan.flat.exposure[start:stop],
        )

    def prices(self, start: int, stop: int) -> dict[str, np.ndarray | None]:
        return {name: unless_all_nan(self._rows(name, start, stop)) for name in PRICE_HELD}

    def rank(self, start: int, stop: int) -> np.ndarray | None:
        return unless_all_nan(self._rows("rank", start, stop))


PRICE_HELD = ("close", "market_cap")  # what a streamed plan reads with the model's numbers


def piece_path(folder: Path, name: str, block: int, piece: int) -> Path:
    """The file of one field's rows of one grid block on one slice of sessions."""
    return folder / f"{name}.{block}.{piece}.npy"


def _read_ahead(
    read: SliceReader, spans: list[tuple[int, int]]
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """`read` of each span in turn, the next one read on a thread while the caller plans this
    one (Parquet's decoding and numpy's copies leave the GIL): at most two slices held."""
    with ThreadPoolExecutor(1, thread_name_prefix="eqrisk-plan-read") as pool:
        pending = pool.submit(read, *spans[0]) if spans else None
        for i in range(len(spans)):
            assert pending is not None
            got = pending.result()
            pending = pool.submit(read, *spans[i + 1]) if i + 1 < len(spans) else None
            yield got


def stream_plan(
    shape: PlanShape,
    read: SliceReader,
    folder: Path,
    master: pd.DataFrame,
    *,
    block_symbols: int = chunks.BLOCK_SYMBOLS,
    breaks: set[tuple[int, int]] | frozenset[tuple[int, int]] = frozenset(),
    progress: Callable[[str], None] | None = None,
) -> StreamedPlan:
    """The plan of `shape`, one slice of PIECE_CHUNKS time chunks at a time, its rows written
    into `folder` (`StreamedPlan`); `breaks`: the (row, session) cells of the returns left
    out (`corporate_actions.break_cells`)."""
    say = progress or (lambda _msg: None)
    n, n_t = shape.size, len(shape.sessions)
    grid = chunks.ChunkGrid(n, n_t, block_symbols)
    step = PIECE_CHUNKS * grid.chunk
    pieces = [(t0, min(t0 + step, n_t)) for t0 in range(0, n_t, step)]
    layout = shape.layout
    published = layout.published
    loo = []
    for b in range(grid.blocks):
        rows = layout.model_fidx[slice(*grid.rows(b))]
        loo.append(np.unique(rows[rows >= published]))
    factors = np.empty((published, n_t))
    imputed: set[int] = set()
    entries: list[dict[str, Any]] = []
    cells = np.array(sorted(breaks), dtype=np.int64).reshape(-1, 2)
    folder.mkdir(parents=True, exist_ok=True)
    slices = _read_ahead(read, [(t0 - min(LEAD, t0), t1) for t0, t1 in pieces])
    for p, ((t0, t1), (close, cap)) in enumerate(zip(pieces, slices, strict=True)):
        lead = min(LEAD, t0)
        if close.shape != (n, t1 - t0 + lead):
            raise RuntimeError(f"a slice read {close.shape}, not {(n, t1 - t0 + lead)}")
        exclude = np.zeros(close.shape, dtype=bool)
        inside = (cells[:, 1] >= t0 - lead) & (cells[:, 1] < t1)
        exclude[cells[inside, 0], cells[inside, 1] - (t0 - lead)] = True
        part = slice_rows(shape, close, cap, lead, exclude)
        factors[:, t0:t1] = part.model_factors[:published]
        imputed |= part.imputed
        held = {
            "returns": part.returns,
            "close": close[:, lead:],
            "market_cap": cap[:, lead:],
            "rank": part.rank,
        }
        for b in range(grid.blocks):
            r0, r1 = grid.rows(b)
            for name, values in held.items():
                np.save(piece_path(folder, name, b, p), values[r0:r1])
            np.save(piece_path(folder, "loo", b, p), part.model_factors[loo[b]])
        for c in range(t0 // grid.chunk, -(-t1 // grid.chunk)):
            lo, hi = grid.cols(c)
            cols = slice(lo - t0, hi - t0)
            entries.append(
                chunk_digests(
                    shape.sessions[lo:hi],
                    part.returns[:, cols],
                    exclude[:, lead:][:, cols],
                    part.model_factors[:, cols],
                    "",  # the flat model's: once every factor row is known
                    {"close": held["close"][:, cols], "market_cap": held["market_cap"][:, cols]},
                )
            )
        say(f"planned sessions {t1}/{n_t}")
        del close, cap, part, held, exclude
    outline = plan_outline(shape, factors, imputed, len(cells))
    flat = outline.flat
    for c, entry in enumerate(entries):
        lo, hi = grid.cols(c)
        entry["digests"]["flat"] = digest(flat.returns[:, lo:hi], flat.sector_market_beta[:, lo:hi])
    inputs = {
        "scheme": DIGESTS,
        "universe": universe_digests(outline, master),
        "chunks": entries,
    }
    return StreamedPlan(
        plan=outline, folder=folder, grid=grid, pieces=pieces, loo=loo, inputs=inputs
    )

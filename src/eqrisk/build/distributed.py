"""`eqrisk build --dask`: the model's per-symbol work on a Dask cluster, block by block, each
worker writing the chunk files of its own blocks into the new version.

The builder plans the run (returns, factor layout, flat factors, the cap rank: what needs the
universe; a full build's plan one slice of sessions at a time, its rows in files:
`block_inputs`), hands the small shared factor series to the cluster once as a task of its own
(the scheduler holds its inputs and recomputes it when the worker that held it is lost:
scattered data would be lost with that worker, whose copies Dask's memory manager thins out),
and sends each task the rows of whole blocks of the snapshot's chunk grid (`block_symbols`
symbols each, the `block_symbols` setting): their returns, prices and leave-one-out factor
rows, written to the staging folder (`.inputs/`, on the store every host mounts) and read there
by the task, never scattered to one worker, so that the scheduler reruns the task of a lost
worker on another (the rerun first removes what the lost one wrote of its blocks); the build
fails, with one line (DaskUnavailable), only when the cluster is gone. The worker runs
`eqrisk.model.run.run_block`, the very function of the local build, adds the price metrics of
its rows and writes its blocks' chunks (`chunks.write_block`, hard links to the previous
version's equal files) into a staging folder of the snapshot store, which every host mounts at
the same path. It returns only the chunk codes, the fields its rows could derive, the write
stats and each row's latest values: the builder never holds an (n x T) output array; it joins
the codes into the manifest, moves the staging folder's arrays into the new version and writes
the long table and the symbols table from the written chunks, one time chunk at a time.

`run_model_dask` (the arrays brought back to the caller) remains for callers that want the
numbers in memory.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd

from eqrisk.build.block_inputs import PRICE_INPUTS, BlockSource, unless_all_nan
from eqrisk.build.executors import (
    DaskUnavailable as DaskUnavailable,  # where the CLI and the tests have it from
)
from eqrisk.build.executors import Executor, Local, OnDask
from eqrisk.build.executors import dask_client as dask_client
from eqrisk.data.panel import Panel
from eqrisk.model.run import (
    BlockInput,
    ModelParams,
    ModelResult,
    PriceRows,
    SharedFactors,
    finish_model,
    join_metrics,
    plan_model,
    row_price_metrics,
    run_block,
)
from eqrisk.snapshot import chunks
from eqrisk.snapshot.tables import PANEL_ARRAYS, Staged

if TYPE_CHECKING:
    from distributed import Client

# numba's default threading layer must not be entered by two threads of one process at once:
# a worker started with several threads runs its blocks one at a time, each in parallel inside.
_KERNEL_LOCK = threading.Lock()
# Threads that write a block's time chunks: each holds a chunk of the block (about 60 MB at 512
# symbols x 512 sessions). Two on 2 cores: the blocks stage of 2,000 x 7,560 from about 18 s to
# 10-13 s; more than a few would hold more memory than they save time.
MAX_WRITERS = 4


@contextmanager
def _kernel(threads: int | None) -> Iterator[None]:
    """The kernels' turn in this process, on `threads` numba threads (None: as they are)."""
    import numba

    with _KERNEL_LOCK:
        if threads:
            ceiling = numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]  # set at import
            numba.set_num_threads(max(1, min(threads, ceiling)))
        yield


def _block_task(
    shared: SharedFactors, block: BlockInput, threads: int | None
) -> dict[str, np.ndarray]:
    """What a worker runs for one block."""
    with _kernel(threads):
        return run_block(shared, block)


def run_model_dask(
    panel: Panel,
    master: pd.DataFrame,
    params: ModelParams,
    client: Client,
    *,
    exclude: np.ndarray | None = None,
    block_rows: int = 500,
    progress: Callable[[str], None] | None = None,
) -> ModelResult:
    """`run_model` with the blocks run on the cluster of `client` (the same result, bit for
    bit); says `blocks done/total` as they come back."""
    say = progress or (lambda _msg: None)
    plan = plan_model(panel, master, params, exclude=exclude)
    bounds = plan.blocks(block_rows)
    executor = OnDask(client)
    n, n_t = plan.returns.shape
    joined: dict[str, np.ndarray] = {}
    say(f"blocks 0/{len(bounds)} done ({executor.workers} workers, {block_rows} symbols a block)")
    done_blocks = executor.map(_block_task, plan.shared, bounds, lambda b: plan.block(*b))
    for done, ((start, _stop), arrays) in enumerate(done_blocks, 1):
        for name, arr in arrays.items():
            if name not in joined:
                joined[name] = np.empty((n, n_t), dtype=arr.dtype)
            joined[name][start : start + len(arr)] = arr
        say(f"blocks {done}/{len(bounds)} done")
    return finish_model(plan, [(0, joined)])


# ---------------------------------------------------------------- workers write their blocks


@dataclass(frozen=True)
class BlockJob:
    """One task of a writing Dask build: grid blocks [b0, b1) (rows [start, stop)), their
    inputs, and where to write. `derive` None: leave out the derivable fields this block can
    derive; else exactly those (a second pass, when another block could not derive one)."""

    folder: str
    previous: str | None
    grid: chunks.ChunkGrid
    b0: int
    b1: int
    rows: BlockInput
    # The rows of the price arrays (close, market_cap and PANEL_ARRAYS, stored as a local
    # build stores them); None where all NaN (not sent: a source without open/high/low).
    prices: dict[str, np.ndarray | None]
    rank: np.ndarray | None  # (b x T) cap rank rows, None = all NaN (no caps)
    derive: tuple[str, ...] | None = None

    def price(self, name: str) -> np.ndarray:
        """The rows of one price array; an all-NaN one as a read-only view (no memory)."""
        values = self.prices[name]
        return values if values is not None else _nans(self.rows.returns.shape)


def _nans(shape: tuple[int, ...]) -> np.ndarray:
    return np.broadcast_to(np.float64(np.nan), shape)


@dataclass
class BlockWritten:
    """What a task returns: no (rows x T) array, only per-row values and the chunk codes."""

    b0: int
    b1: int
    names: list[str]  # the metrics, in the published order
    codes: dict[str, list[str]]  # per stored field, one code line per grid block
    derived: list[str]  # the fields left out (derived on read)
    stats: chunks.WriteStats
    last: np.ndarray  # (rows,) last priced session, -1 = none
    first: np.ndarray  # (rows,) first priced session, -1 = none
    latest: dict[str, np.ndarray] = field(default_factory=dict)  # each metric at `last`

    def nbytes(self) -> int:
        """The bytes of the arrays it carries (per row: the latest values and two indexes)."""
        return int(self.last.nbytes + self.first.nbytes) + sum(
            int(v.nbytes) for v in self.latest.values()
        )


# Reads rows [start, stop) of some price fields (names): one array per field, rows x sessions.
RowReader = Callable[[int, int, tuple[str, ...]], dict[str, np.ndarray]]


class _Rows:
    """Rows [start, start + b) of an (n x T) field, indexed with the whole field's row numbers
    (what `chunks.write_block` slices with)."""

    def __init__(self, values: np.ndarray, start: int, n: int) -> None:
        self.values, self.start = values, start
        self.shape = (n, values.shape[1])

    def __getitem__(self, key: tuple[slice, slice]) -> np.ndarray:
        rows, cols = key
        return self.values[rows.start - self.start : rows.stop - self.start, cols]


def _block_files(folder: Path, b: int) -> Iterator[Path]:
    arrays = folder / "arrays"
    if arrays.is_dir():
        for sub in arrays.iterdir():
            yield from sub.glob(f"{b}.*.npy")


def _write_task(shared: SharedFactors, job: BlockJob, threads: int | None) -> BlockWritten:
    """What a worker runs for one job: compute, write the blocks' chunks, return the codes."""
    with _kernel(threads):
        out = run_block(shared, job.rows)
    size, n_t = job.rows.returns.shape
    rank = job.rank if job.rank is not None else _nans((size, n_t))
    price = {name: job.price(name) for name in PRICE_INPUTS}
    prices = PriceRows(
        close=price["close"],
        close_raw=price["close_raw"],
        volume=price["volume"],
        market_cap=price["market_cap"],
        returns=job.rows.returns,
    )
    metrics = join_metrics(out, row_price_metrics(prices, rank))
    fields: dict[str, np.ndarray] = {**metrics}
    fields.update({name: price[name] for name in PANEL_ARRAYS})
    local = chunks.ChunkGrid(size, n_t)
    if job.derive is None:
        derived = [name for name in sorted(fields) if chunks.derivable(name, fields, local)]
    else:
        derived = list(job.derive)
        if not all(chunks.derivable(name, fields, local) for name in derived):
            raise RuntimeError(f"blocks {job.b0}-{job.b1}: a derivation changed between passes")
    folder = Path(job.folder)
    for b in range(job.b0, job.b1):  # a second pass replaces the first pass's files
        for path in _block_files(folder, b):
            path.unlink()
    start = job.rows.start
    stored = {k: _Rows(v, start, job.grid.n) for k, v in fields.items() if k not in derived}
    stats = chunks.WriteStats()
    codes: dict[str, list[str]] = {name: [] for name in sorted(stored)}
    previous = Path(job.previous) if job.previous is not None else None
    writers = min(threads or os.cpu_count() or 1, MAX_WRITERS)  # the block's cores write it
    for b in range(job.b0, job.b1):
        lines = chunks.write_block(
            folder, stored, job.grid, b, previous=previous, stats=stats, writers=writers
        )
        for name, line in lines.items():
            codes[name].append(line)
    has = np.isfinite(metrics["price_close"])
    priced = has.any(axis=1)
    last = np.where(priced, n_t - 1 - np.argmax(has[:, ::-1], axis=1), -1)
    first = np.where(priced, np.argmax(has, axis=1), -1)
    rows = np.flatnonzero(last >= 0)
    latest = {}
    for name, arr in metrics.items():
        values = np.full(size, np.nan)
        values[rows] = arr[rows, last[rows]]
        latest[name] = values
    return BlockWritten(
        b0=job.b0,
        b1=job.b1,
        names=list(metrics),
        codes=codes,
        derived=derived,
        stats=stats,
        last=last,
        first=first,
        latest=latest,
    )


INPUTS = ".inputs"  # a staging folder's block inputs, one file a task (removed at the end)


def write_model_dask(
    source: BlockSource,
    executor: Executor | Client | None,
    folder: Path,
    *,
    previous: Path | None = None,
    block_rows: int = chunks.BLOCK_SYMBOLS,
    progress: Callable[[str], None] | None = None,
    block_symbols: int = chunks.BLOCK_SYMBOLS,
    rows: RowReader | None = None,
) -> tuple[Staged, list[str]]:
    """Run the model block by block on `executor` (`executors.Local`, None, or `OnDask`: a
    Dask client is taken as the cluster to run on), each block writing the arrays of the
    version into `folder` (a staging folder on the shared store; chunks equal to `previous`'s
    are hard links to them). Tasks take whole blocks of the chunk grid: `block_rows` rounded
    up to a multiple of its block. Returns the staged arrays and the metric names in
    published order. No (n x T) output array is ever held: each block's outputs are written
    to its chunk files and dropped where it ran.

    A field is derived on read (not stored) when every block can derive it, as in a local
    build; a block that left out a field another block could not derive is run again.

    `rows` reads the rows [start, stop) of the price fields the source does not hold (a full
    build holds none of them: `build_snapshot`); each job holds its own."""
    say = progress or (lambda _msg: None)
    n, n_t = source.shape
    grid = chunks.ChunkGrid(n, n_t, block_symbols)
    per_task = max(1, -(-block_rows // grid.block))
    bounds = [(b, min(b + per_task, grid.blocks)) for b in range(0, grid.blocks, per_task)]
    folder.mkdir(parents=True, exist_ok=True)
    inputs = folder / INPUTS
    on: Executor
    if executor is None:
        on = Local()
    elif isinstance(executor, Local | OnDask):
        on = executor
    else:
        on = OnDask(cast("Client", executor))
    unread = source.unread  # read by each job (`rows`)
    if unread and rows is None:
        raise ValueError(f"no reader of the price fields the source lacks: {unread}")

    def prices(start: int, stop: int) -> dict[str, np.ndarray | None]:
        """The job's rows of every price input: the source's, and the others read now."""
        got = source.prices(start, stop)
        if unread:
            assert rows is not None
            got.update({k: unless_all_nan(v) for k, v in rows(start, stop, unread).items()})
        return got

    def job(item: tuple[int, int, tuple[str, ...] | None]) -> BlockJob:
        b0, b1, derive = item
        start, stop = grid.rows(b0)[0], grid.rows(b1 - 1)[1]
        return BlockJob(
            folder=str(folder),
            previous=str(previous) if previous is not None else None,
            grid=grid,
            b0=b0,
            b1=b1,
            rows=source.block(start, stop),
            prices=prices(start, stop),
            rank=source.rank(start, stop),
            derive=derive,
        )

    def run(
        jobs: Sequence[tuple[int, int, tuple[str, ...] | None]], what: str
    ) -> list[BlockWritten]:
        got: list[BlockWritten] = []
        answers = on.map(_write_task, source.shared, jobs, job, name="write", ship=inputs)
        for done, (_item, written) in enumerate(answers, start=1):
            got.append(written)
            say(f"blocks {done}/{len(jobs)} {what}")
        return got

    size = grid.block * per_task
    if isinstance(on, Local):
        say(f"blocks 0/{len(bounds)} written (in process, {size} symbols each)")
    else:
        say(
            f"blocks 0/{len(bounds)} written ({on.describe()}, {size} symbols a task, "
            "written by the workers)"
        )
    try:
        written = {w.b0: w for w in run([(b0, b1, None) for b0, b1 in bounds], "written")}
        derived = sorted(set.intersection(*(set(w.derived) for w in written.values())))
        again = [(w.b0, w.b1, tuple(derived)) for w in written.values() if w.derived != derived]
        if again:
            say(f"{len(again)} blocks written again: a field not derivable everywhere is stored")
            written.update({w.b0: w for w in run(again, "rewritten")})
    finally:
        shutil.rmtree(inputs, ignore_errors=True)
    return _staged(folder, grid, [written[b0] for b0, _ in bounds], derived), written[0].names


def _staged(
    folder: Path, grid: chunks.ChunkGrid, parts: list[BlockWritten], derived: list[str]
) -> Staged:
    """The parts (in block order) joined: the manifest's `arrays` block, stats, per-row values."""
    stats = chunks.WriteStats(derived=list(derived))
    table: dict[str, list[str]] = {name: [] for name in sorted(parts[0].codes)}
    for part in parts:
        if set(part.codes) != set(table):
            raise RuntimeError("the blocks stored different fields")
        for name, lines in part.codes.items():
            table[name].extend(lines)
        stats.written += part.stats.written
        stats.shared += part.stats.shared
        stats.empty += part.stats.empty
        stats.bytes_written += part.stats.bytes_written
        stats.written_files.extend(part.stats.written_files)
    arrays: dict[str, Any] = {
        "layout": chunks.LAYOUT,
        "grid": grid.describe(),
        "chunks": table,
        "derived": {name: list(chunks.DERIVATIONS[name]) for name in derived},
    }
    latest = {name: np.concatenate([p.latest[name] for p in parts]) for name in parts[0].latest}
    return Staged(
        folder=folder,
        arrays=arrays,
        stats=stats,
        last=np.concatenate([p.last for p in parts]),
        first=np.concatenate([p.first for p in parts]),
        latest=latest,
    )

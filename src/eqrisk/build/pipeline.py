"""`eqrisk build`: ingested data -> model -> a new snapshot version (the only place that joins
the three; the model itself does no I/O).

One path (`Build.on`), whatever was read and wherever the blocks run:

1. read (`build_snapshot`): the end of the data set when the years before it are proved
   unchanged (`tail`); else the whole history, as a panel in memory, or, for a build that can
   reuse nothing, as a plan streamed one slice of sessions at a time (`universe.streamed_build`);
2. plan: `model.run.plan_model` (or the streamed plan) and the input digests (`incremental`);
3. start (`start.start_of`): the first time chunk to compute, 0 = the whole history;
4. run: the blocks on an executor, `executors.Local` (this process) or `executors.OnDask`
   (`--dask`), one interface (`Executor.map`): from chunk 0 each block computes its rows and
   writes their chunks where it runs (`distributed.write_model_dask`: no (n x T) output is
   held); from a chunk c > 0 (an incremental build) each block computes its sessions from c
   (`resume.run_from`) and the new sessions are spliced onto the previous version's
   (`start.run_tail`). A start > 0 runs in process (with --dask, up to `dask_min_cells`);
5. write (`VersionStore.write`: the arrays staged by the blocks, or the new chunks beside
   links to the previous version's) and publish (`VersionStore.set_current`, inside it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from eqrisk.build import incremental, tail, unchanged
from eqrisk.build.block_inputs import BlockSource, InMemory
from eqrisk.build.distributed import RowReader, write_model_dask
from eqrisk.build.executors import Executor, Local, OnDask, dask_client
from eqrisk.build.risk_run import RiskInputs, risk_files
from eqrisk.build.start import Asked, Ran, Reading, Start, run_tail, start_of, whole_after
from eqrisk.build.universe import check_universe, open_universe, streamed_build
from eqrisk.data.corporate_actions import break_cells, return_breaks
from eqrisk.data.ingested import Stored, read_panel, read_rows
from eqrisk.data.master import Mappings
from eqrisk.data.panel import MODEL_FIELDS, PANEL_FIELDS, Panel
from eqrisk.data.share_classes import read_share_classes
from eqrisk.model.run import ModelParams, ModelPlan, ModelResult, plan_model, result_of
from eqrisk.model.run import run_block as run_block  # the block kernel the builds run
from eqrisk.snapshot.build_times import build_mode, record_build
from eqrisk.snapshot.chunks import BLOCK_SYMBOLS, open_arrays
from eqrisk.snapshot.store import Previous, VersionStore
from eqrisk.snapshot.tables import SnapshotContent
from eqrisk.snapshot.versions import store_of

# An incremental build asked to run on Dask runs in process up to this many cells (symbols x
# sessions computed): a one-session update of 5,000 symbols computes one chunk, 640,000 cells.
DASK_MIN_CELLS = 20_000_000
ingest_keys = ("data_source", "files", "merged_files", "ingested_at", "report_dir")


class WholeHistory(Exception):
    """A tail build that cannot be incremental: the whole history is read instead."""


def build_snapshot(
    home: Path,
    params: ModelParams,
    *,
    market_etf: str = "SPY",
    sector_map: Path | None = None,
    subsector_map: Path | None = None,
    keep: int = 3,
    force: bool = False,
    dask: str | None = None,
    dask_workers: int | None = None,
    block_rows: int = 1024,
    full: bool = False,
    progress: Callable[[str], None] | None = None,
    store: VersionStore | None = None,
    block_symbols: int | None = None,
    dask_min_cells: int = DASK_MIN_CELLS,
    share_classes: Path | None = None,
    skip_unchanged: bool = False,
) -> dict[str, Any]:
    """Build the model on the ingested data and publish it as the current snapshot of `store`
    (the CLI passes the configured one; default: the home's, `versions.store_of`).

    `dask` runs the model's per-symbol work on a Dask cluster in tasks of `block_rows`
    symbols, rounded up to whole blocks of the chunk grid ('local' = a LocalCluster of
    `dask_workers` processes, or a scheduler address); each worker writes its blocks' chunks
    and the published version is the same as a local build's, bit for bit.

    A local build is incremental when it can be: the digests of the model's inputs (see
    `incremental`) are compared with the previous version's; the time chunks before the first
    changed one are linked unread and only the sessions from there on are computed. `full`
    forces a full build. The manifest's `build` block (and the progress) says which and why.

    `block_symbols` is the chunk grid's block (S: the rows a Dask task writes as a unit, at
    least one block a task; None: the current version's, BLOCK_SYMBOLS for a first build, so
    that a store keeps its grid and its updates stay incremental). With `dask`, a build that
    reads the end of the data set (`tail`) runs in process when it computes at most
    `dask_min_cells` (symbols x sessions); any other is a full Dask build, planned one slice of
    sessions at a time (`universe.streamed_build`), as is every build that reuses nothing.

    Every build stores the risk forecast's accuracy record in the manifest (`risk_accuracy`):
    bias statistics and 12-month deviations per family of portfolios, kept as a running state
    beside the risk model's (`accuracy_store`), so an incremental build adds its new sessions'
    outcomes only and its record equals a full build's, bit for bit.

    With `skip_unchanged` (`eqrisk build`), raises `unchanged.NothingNew` when the current
    version was built from the same data and settings (unless `full` or `force`):
    nothing published, nothing pruned.

    Raises UniverseShrank, before estimating anything, when the universe (symbols or sessions)
    is less than half of the current snapshot's, unless `force`."""
    say = progress or (lambda _msg: None)
    started = time.perf_counter()  # the build's duration, for the servers' metrics
    store = store or store_of(home)
    say("reading ingested data")
    found, raw_master, master = open_universe(
        home, Mappings.load(sector_map, subsector_map), market_etf
    )
    classes = read_share_classes(share_classes)
    previous = store.previous()  # opened once for the whole build
    if block_symbols is None:
        block_symbols = current_block(previous)
    breaks_list = found.meta.get("return_breaks", [])
    proof = unchanged.with_settings(
        tail.data_proof(found, breaks_list, classes),
        unchanged.settings_digest(params, master, market_etf, block_symbols),
    )
    same = unchanged.built_from(previous, proof)
    if skip_unchanged and same is not None and not (full or force):
        raise unchanged.NothingNew(same)
    build = Build(
        store, master, params, say, previous=previous, meta=found.meta, keep=keep, dask=dask,
        dask_workers=dask_workers, block_rows=block_rows, full=full,
        block_symbols=block_symbols, dask_min_cells=dask_min_cells, proof=proof,
    )  # fmt: skip
    manifest = None
    if not full:
        reading = _tail_reading(found, raw_master, classes, proof, params, previous, force, say)
        try:
            manifest = build.on(reading) if reading is not None else None
        except WholeHistory as why_not:
            say(f"reading the whole history: {why_not}")
    whole = full or previous is None or previous.snapshot is None
    if manifest is None and (whole or dask is not None):
        # A build that cannot reuse anything (--full, or no version yet), or a Dask build that
        # reads the whole history, plans the model one slice of sessions at a time and each
        # block reads its own rows: the builder holds no (n x T) array.
        manifest = streamed_build(
            found, raw_master, classes, master, params, store, say, build.on,
            block_symbols=block_symbols, check=None if force else previous,
        )  # fmt: skip
    if manifest is None:
        # The whole history read for the model: each block reads its other price fields when
        # it is written (memory: two n x T arrays, not seven) when no chunk can be reused.
        fields = MODEL_FIELDS if whole else PANEL_FIELDS
        panel = read_panel(found, raw_master, classes, fields=fields)
        say(f"built the panel ({panel.shape[0]} symbols)")
        if not force:
            check_universe(previous, panel.shape)
        say(f"estimating the model ({panel.shape[0]} symbols x {panel.shape[1]} sessions)")

        def rows(start: int, stop: int, names: tuple[str, ...]) -> dict[str, np.ndarray]:
            return read_rows(found, panel.symbols[start:stop], panel.sessions, names)

        breaks = return_breaks(breaks_list, panel.symbols, panel.sessions)
        manifest = build.on(Reading(panel, breaks=breaks, rows=rows))
    seconds = time.perf_counter() - started
    record_build(store.root, build_mode(manifest, dask), seconds)
    return manifest


def current_block(previous: Previous | None) -> int:
    """The chunk grid's block of the current version, BLOCK_SYMBOLS when there is none."""
    if previous is None or previous.snapshot is None:
        return BLOCK_SYMBOLS
    return int(previous.snapshot.manifest["arrays"]["grid"]["block"])


def _tail_reading(
    found: Stored,
    raw_master: pd.DataFrame,
    classes: dict[str, str],
    proof: dict[str, Any] | None,
    params: ModelParams,
    previous: Previous,
    force: bool,
    say: Callable[[str], None],
) -> Reading | None:
    """The end of the data set only (`tail`): the sessions from the window's base on, the
    years before it proved unchanged by the data set's partition digests. None when the whole
    history is to be read (why is said)."""
    snapshot = previous.snapshot
    calendar = found.calendar().to_numpy()
    if (
        previous.problem is not None
        or snapshot is None
        or not snapshot.chunked
        or not len(calendar)
    ):
        return None
    breaks_list = found.meta.get("return_breaks", [])
    window, why = tail.window_of(
        proof, snapshot.manifest, calendar.astype("datetime64[D]"), params.window
    )
    if window is None:
        say(f"reading the whole history: {why}")
        return None
    if not force:
        check_universe(previous, (len(found.symbols()), len(calendar)))
    say(f"reading the ingested data from {window.since.date()} (the years before: unchanged)")
    panel = read_panel(found, raw_master, classes, since=window.since, others_since=window.digested)
    excluded = len(break_cells(breaks_list, panel.symbols, window.calendar))
    breaks = return_breaks(breaks_list, panel.symbols, panel.sessions)
    return Reading(panel, breaks=breaks, window=window, returns_excluded=excluded)


def publish_panel(
    home: Path | VersionStore,
    panel: Panel,
    master: pd.DataFrame,
    params: ModelParams,
    *,
    breaks: np.ndarray | None = None,
    meta: dict[str, Any] | None = None,
    keep: int = 3,
    dask: str | None = None,
    dask_workers: int | None = None,
    block_rows: int = 1024,
    full: bool = False,
    progress: Callable[[str], None] | None = None,
    previous: Previous | None = None,
    block_symbols: int = BLOCK_SYMBOLS,
    dask_min_cells: int = DASK_MIN_CELLS,
    proof: dict[str, Any] | None = None,
    rows: RowReader | None = None,
) -> dict[str, Any]:
    """The model on a panel (and its classified master) published as a new version of the
    store (`home`: a store, or a home whose store it is): the path of `build_snapshot` on a
    panel already read (the build bench calls it on a synthetic panel). Incremental unless
    `full` or `dask` (see `build_snapshot`); `previous` is the store's previous version when
    the caller opened it already. `proof`: the data set's digests (`tail.data_proof`),
    recorded for the next build. `rows`: where a block reads the price fields `panel` was
    read without (`Panel.read`; a build that reuses chunks needs them all in the panel)."""
    build = Build(
        store_of(home), master, params, progress or (lambda _msg: None), previous=previous,
        meta=meta or {}, keep=keep, dask=dask, dask_workers=dask_workers,
        block_rows=block_rows, full=full, block_symbols=block_symbols,
        dask_min_cells=dask_min_cells, proof=proof,
    )  # fmt: skip
    return build.on(Reading(panel, breaks=breaks, rows=rows))


@dataclass
class Planned:
    """What was read and planned: the plan (None: a streamed one, in `source`), its input
    digests, the blocks' source, where blocks read the price fields the source lacks and the
    digests of those, fed as they are read."""

    reading: Reading
    plan: ModelPlan | None
    digests: dict[str, Any]
    source: BlockSource
    rows: RowReader | None
    fed: incremental.RowDigests | None


@dataclass
class Build:
    """One build's settings and the path it takes on what was read (`on`)."""

    store: VersionStore
    master: pd.DataFrame
    params: ModelParams
    say: Callable[[str], None]
    previous: Previous | None = None  # opened by the caller already (else when needed)
    meta: dict[str, Any] = field(default_factory=dict)  # the ingest's
    keep: int = 3
    dask: str | None = None
    dask_workers: int | None = None
    block_rows: int = 1024
    full: bool = False
    block_symbols: int = BLOCK_SYMBOLS
    dask_min_cells: int = DASK_MIN_CELLS
    proof: dict[str, Any] | None = None

    def on(self, reading: Reading) -> dict[str, Any]:
        """Plan, start, run, write, publish (the module docstring). With a tail reading,
        raises WholeHistory when the build cannot start after chunk 0."""
        plan, digests, source = _planned(reading, self.master, self.params, self.previous)
        if self.proof is not None:
            digests["data"] = self.proof
        rows, fed = reading.rows, None  # the digests of the fields the blocks read, as read
        if source.unread and rows is not None:
            fed = incremental.RowDigests(source.unread, *source.shape)
            rows = _feeding(rows, fed)
        planned = Planned(reading, plan, digests, source, rows, fed)
        return self._from(self._start(plan, reading, digests), planned)

    def _from(self, start: Start, planned: Planned) -> dict[str, Any]:
        """Run the blocks from `start` on the executor, write and publish the version."""
        if start.whole:
            if planned.reading.window is not None:
                raise WholeHistory("; ".join(start.build["reasons"]))
            start = self._whole(start, streamed=planned.plan is None)
        with self._staging(start) as staging, self._executor(start) as executor:
            ran = self._run(start, planned, executor, staging)
            if isinstance(ran, str):  # the new sessions break a derivation: the whole history
                assert start.decision is not None
                whole = whole_after(start.decision, planned.reading.window, self.say, ran)
                return self._from(whole, planned)
            if not start.whole:
                self.say(f"writing the new sessions' chunks ({start.build['reasons'][-1]})")
            return self._write(ran, start, planned)

    def _opened(self) -> Previous:
        if self.previous is None:
            self.previous = self.store.previous()
        return self.previous

    def _start(self, plan: ModelPlan | None, reading: Reading, digests: dict[str, Any]) -> Start:
        """Where the run starts: the whole history for a streamed plan and with --full."""
        if plan is None or self.full:
            return Start(0)
        limit = self.dask_min_cells if self.dask is not None else None
        asked = Asked(self.block_symbols, limit, reading.window)
        return start_of(self._opened(), plan, digests, asked, self.say)

    def _whole(self, start: Start, *, streamed: bool) -> Start:
        """A start at the whole history with the reasons the manifest gives (the digests'
        where they were asked), said."""
        build = start.build
        if self.dask is not None:
            build = {"mode": "full", "reasons": ["--full" if self.full else "a Dask build"]}
        elif self.full:
            build = {"mode": "full", "reasons": ["--full"]}
        elif streamed:
            build = {"mode": "full", "reasons": [_no_previous(self.previous)]}
            self.say(build["reasons"][0])
        self.say(f"full build: {'; '.join(build['reasons'])}")
        return Start(0, build)

    def _staging(self, start: Start) -> AbstractContextManager[Path | None]:
        """Where the blocks of a run from the whole history write (the store's staging
        folder, which the new version takes over); a run from c > 0 hands its tail over."""
        return self.store.staging() if start.whole else nullcontext()

    @contextmanager
    def _executor(self, start: Start) -> Iterator[Executor]:
        """Where the blocks run: on Dask with --dask from the whole history, else here (a
        start > 0 computes at most `dask_min_cells`)."""
        if self.dask is None or not start.whole:
            yield Local()
            return
        self.say(f"starting Dask ({self.dask})")
        with dask_client(self.dask, workers=self.dask_workers) as client:
            yield OnDask(client)

    def _run(
        self, start: Start, planned: Planned, executor: Executor, staging: Path | None
    ) -> Ran | str:
        """The blocks on `executor`. From chunk 0 each block computes its rows and writes
        their chunks into `staging`; the tables are written from the written chunks, so no
        (n x T) output array is ever held here. From c > 0, each block's sessions from c,
        spliced onto the previous version's (`start.run_tail`; a str: why not after all)."""
        if not start.whole:
            assert planned.plan is not None
            return run_tail(self._opened(), planned.plan, planned.reading, start, executor.map)
        assert staging is not None
        source, local = planned.source, isinstance(executor, Local)
        staged, names = write_model_dask(
            source,
            executor,
            staging,
            previous=self.store.share_from(),
            block_rows=self.block_symbols if local else self.block_rows,
            block_symbols=self.block_symbols,
            progress=self.say,
            rows=planned.rows,
        )
        written = open_arrays(staging, staged.arrays)
        result = result_of(source.plan, {name: written[name] for name in names})
        _say_caps(result, self.say)
        return Ran(result, planned.reading.panel, staged=staged)

    def _write(self, ran: Ran, start: Start, planned: Planned) -> dict[str, Any]:
        """Write the run as the new version and publish it (`VersionStore.write`)."""
        digests, fed = planned.digests, planned.fed
        more = ran.more or risk_files(
            ran.result, RiskInputs.of(planned.source.plan), ran.reuse, ran.panel.sessions
        )
        content = SnapshotContent(
            result=ran.result,
            panel=ran.panel,
            master=self.master,
            data_source=str(self.meta.get("data_source", "unknown")),
            ingest={k: self.meta.get(k) for k in ingest_keys},
            reuse=ran.reuse,
            inputs=digests if fed is None else fed.into(digests),
            build=start.build,
            staged=ran.staged,
            block=self.block_symbols,
            more=more,
        )
        return self.store.write(content, keep=self.keep, progress=self.say)


def _planned(
    reading: Reading,
    master: pd.DataFrame,
    params: ModelParams,
    previous: Previous | None,
) -> tuple[ModelPlan | None, dict[str, Any], BlockSource]:
    """The plan the blocks read (None with a streamed plan, a full build's plan in files), the
    digests of its inputs and the blocks' source."""
    if reading.streamed is not None:
        return None, dict(reading.streamed.inputs), reading.streamed
    panel, window = reading.panel, reading.window
    plan = plan_model(panel, master, params, exclude=reading.breaks)
    base, proved, total = 0, None, None
    if window is not None:
        if previous is None or previous.snapshot is None:
            raise WholeHistory("no previous version")
        plan = tail.with_history(plan, previous.snapshot.manifest)
        base, total = window.base, len(window.calendar)
        proved = list(previous.snapshot.manifest["inputs"]["chunks"][: window.proved])
    digests = incremental.input_digests(
        plan, panel, master, reading.breaks, base=base, proved=proved, sessions=total
    )
    return plan, digests, InMemory(plan)


def _no_previous(previous: Previous | None) -> str:
    """Why a build without --full reuses nothing (`incremental.decide`'s words)."""
    if previous is not None and previous.problem is not None:
        return f"previous version unusable: {previous.problem}"
    return "no previous version"


def _feeding(rows: RowReader, fed: incremental.RowDigests) -> RowReader:
    """`rows`, feeding the digests of every block it reads."""

    def read(start: int, stop: int, names: tuple[str, ...]) -> dict[str, np.ndarray]:
        got = rows(start, stop, names)
        fed.feed(start, got)
        return got

    return read


def _say_caps(result: ModelResult, say: Callable[[str], None]) -> None:
    if result.notes.get("caps_imputed"):
        say(
            f"{result.notes['caps_imputed']} stocks without a market cap weighted by the median "
            "cap of their group (see docs/decisions/model.md, missing caps)"
        )

"""`eqrisk build`: ingested data -> model -> a new snapshot version (the only place that joins
the three; the model itself does no I/O)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd

from eqrisk.build import incremental, tail, unchanged
from eqrisk.build.block_inputs import BlockSource, InMemory, StreamedPlan
from eqrisk.build.risk_run import RiskInputs, risk_files, risk_resumes
from eqrisk.build.universe import check_universe, open_universe, streamed_build
from eqrisk.data.corporate_actions import break_cells, return_breaks
from eqrisk.data.ingested import Stored, read_panel, read_rows
from eqrisk.data.master import Mappings
from eqrisk.data.panel import MODEL_FIELDS, PANEL_FIELDS, Panel
from eqrisk.data.share_classes import read_share_classes
from eqrisk.model.resume import run_from
from eqrisk.model.run import (
    ModelParams,
    ModelPlan,
    ModelResult,
    plan_model,
    result_of,
)
from eqrisk.model.run import run_block as run_block  # the block kernel the builds run
from eqrisk.snapshot.build_times import build_mode, record_build
from eqrisk.snapshot.chunks import BLOCK_SYMBOLS, CHUNK_SESSIONS, open_arrays
from eqrisk.snapshot.store import Previous, VersionStore
from eqrisk.snapshot.tables import PANEL_ARRAYS, Reuse, SnapshotContent, Staged
from eqrisk.snapshot.versions import Snapshot, store_of

if TYPE_CHECKING:
    from eqrisk.build.distributed import RowReader

# An incremental build asked to run on Dask runs in process up to this many cells (symbols x
# sessions computed): a one-session update of 5,000 symbols computes one chunk, 640,000 cells.
DASK_MIN_CELLS = 20_000_000


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

    def publish_on(panel: Panel, **options: Any) -> dict[str, Any]:
        streamed = options.get("streamed") is not None
        return publish_panel(
            store,
            panel,
            master,
            params,
            breaks=None if streamed else return_breaks(breaks_list, panel.symbols, panel.sessions),
            meta=found.meta,
            keep=keep,
            dask=dask,
            progress=say,
            previous=previous,
            block_symbols=block_symbols,
            dask_min_cells=dask_min_cells,
            proof=proof,
            **options,
        )

    manifest = None
    if not full:
        manifest = _publish_tail(
            found, raw_master, classes, proof, params, previous, force, say, publish_on
        )
    whole = full or previous is None or previous.snapshot is None
    if manifest is None and (whole or dask is not None):
        # A build that cannot reuse anything (--full, or no version yet), or a Dask build that
        # reads the whole history, plans the model one slice of sessions at a time and each
        # block reads its own rows: the builder holds no (n x T) array.
        manifest = streamed_build(
            found, raw_master, classes, master, params, store, say, publish_on,
            block_symbols=block_symbols, check=None if force else previous,
            dask_workers=dask_workers, block_rows=block_rows, full=full,
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

        manifest = publish_on(
            panel,
            dask_workers=dask_workers,
            block_rows=block_rows,
            full=full,
            rows=rows,
        )
    seconds = time.perf_counter() - started
    record_build(store.root, build_mode(manifest, dask), seconds)
    return manifest


def current_block(previous: Previous | None) -> int:
    """The chunk grid's block of the current version, BLOCK_SYMBOLS when there is none."""
    if previous is None or previous.snapshot is None:
        return BLOCK_SYMBOLS
    return int(previous.snapshot.manifest["arrays"]["grid"]["block"])


class WholeHistory(Exception):
    """A tail build that cannot be incremental: the whole history is read instead."""


def _publish_tail(
    found: Stored,
    raw_master: pd.DataFrame,
    classes: dict[str, str],
    proof: dict[str, Any] | None,
    params: ModelParams,
    previous: Previous,
    force: bool,
    say: Callable[[str], None],
    publish_on: Callable[..., dict[str, Any]],
) -> dict[str, Any] | None:
    """The incremental build on the end of the data set only (`tail`): the sessions from the
    window's base on are read, the years before it proved unchanged by the data set's
    partition digests. None when the whole history is to be read (the build then decides on
    it as before; why is said)."""
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
    panel = read_panel(found, raw_master, classes, since=window.since)
    excluded = len(break_cells(breaks_list, panel.symbols, window.calendar))
    try:
        return publish_on(panel, window=window, returns_excluded=excluded)
    except WholeHistory as why_not:
        say(f"reading the whole history: {why_not}")
        return None


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
    window: tail.Window | None = None,
    returns_excluded: int = 0,
    rows: RowReader | None = None,
    streamed: StreamedPlan | None = None,
) -> dict[str, Any]:
    """The model on a panel (and its classified master) published as a new version of the
    store (`home`: a store, or a home whose store it is): the half of `build_snapshot` after
    the ingested data is read (the build bench calls it on a synthetic panel). Incremental
    unless `full` or `dask` (see `build_snapshot`); `previous` is the store's previous version
    when the caller opened it already. `proof`: the data set's digests (`tail.data_proof`),
    recorded for the next build. `rows`: where a block reads the price fields `panel` was
    read without (`Panel.read`; a build that reuses chunks needs them all in the panel).

    With `window`, `panel` holds the sessions from `window.base` on only (a tail build, see
    `tail`; `returns_excluded` counts the breaks over the whole calendar): raises WholeHistory
    when the build cannot be incremental. With `streamed` (`block_inputs.stream_plan`: a full
    build's plan, `panel` only its symbols and sessions), the blocks read their rows there."""
    say = progress or (lambda _msg: None)
    store = store_of(home)
    meta = meta or {}
    plan, digests, source = _planned(panel, master, params, breaks, window, previous, streamed)
    if proof is not None:
        digests["data"] = proof
    fed = None  # the digests of the fields the blocks read (`rows`), fed as they read them
    if source.unread and rows is not None:
        fed = incremental.RowDigests(source.unread, *source.shape)
        rows = _feeding(rows, fed)
    build: dict[str, Any] = {}

    def publish(
        result: ModelResult, *, staged: Staged | None = None, reused: SnapshotContent | None = None
    ) -> dict[str, Any]:
        """Write a build's result as the new version (the one place for the three paths): its
        arrays already written by the Dask workers when `staged` says so, the previous
        version's chunks before the first computed one shared by an incremental build
        (`reused`: its panel, reuse and risk inputs)."""
        reuse = reused.reuse if reused is not None else None
        written = reused.panel if reused is not None else panel
        more = reused.more if reused is not None else None
        content = SnapshotContent(
            result=result,
            panel=written,
            master=master,
            data_source=str(meta.get("data_source", "unknown")),
            ingest={k: meta.get(k) for k in ingest_keys},
            reuse=reuse,
            inputs=digests if fed is None else fed.into(digests),
            build=build,
            staged=staged,
            block=block_symbols,
            more=more or risk_files(result, RiskInputs.of(source.plan), reuse, written.sessions),
        )
        return store.write(content, keep=keep, progress=say)

    if plan is not None and not full:
        if previous is None:
            previous = store.previous()
        limit = dask_min_cells if dask is not None else None
        reused, build = _incremental(
            previous,
            plan,
            panel,
            master,
            digests,
            say,
            block_symbols,
            limit,
            window=window,
            returns_excluded=returns_excluded,
        )
        if reused is not None:
            say(f"writing the new sessions' chunks ({build['reasons'][-1]})")
            return publish(reused.result, reused=reused)
    if window is not None:
        raise WholeHistory("; ".join(build["reasons"]))
    build = _full_build(build, streamed=plan is None, full=full, dask=dask, previous=previous)
    if plan is None and not full and dask is None:  # a build that cannot reuse anything
        say(build["reasons"][0])
    say(f"full build: {'; '.join(build['reasons'])}")
    # One path, block by block, whose executor is this process (each block computed, written
    # and dropped: bounded memory) or the workers of the Dask cluster at `dask`.
    local = dask is None
    return _publish_dask(
        store,
        source,
        publish,
        address=dask,
        workers=None if local else dask_workers,
        block_rows=block_symbols if local else block_rows,
        block_symbols=block_symbols,
        say=say,
        rows=rows,
    )


def _planned(
    panel: Panel,
    master: pd.DataFrame,
    params: ModelParams,
    breaks: np.ndarray | None,
    window: tail.Window | None,
    previous: Previous | None,
    streamed: StreamedPlan | None,
) -> tuple[ModelPlan | None, dict[str, Any], BlockSource]:
    """The plan the blocks read (None with `streamed`, a full build's plan in files), the
    digests of its inputs and the blocks' source."""
    if streamed is not None:
        return None, dict(streamed.inputs), streamed
    plan = plan_model(panel, master, params, exclude=breaks)
    base, proved, total = 0, None, None
    if window is not None:
        if previous is None or previous.snapshot is None:
            raise WholeHistory("no previous version")
        plan = tail.with_history(plan, previous.snapshot.manifest)
        base, total = window.base, len(window.calendar)
        proved = list(previous.snapshot.manifest["inputs"]["chunks"][: window.proved])
    digests = incremental.input_digests(
        plan, panel, master, breaks, base=base, proved=proved, sessions=total
    )
    return plan, digests, InMemory(plan)


def _full_build(
    build: dict[str, Any],
    *,
    streamed: bool,
    full: bool,
    dask: str | None,
    previous: Previous | None,
) -> dict[str, Any]:
    """The manifest's `build` block of a full build: why it is full (`build`: the reasons
    the incremental decision gave, where it was asked)."""
    if dask is not None:
        return {"mode": "full", "reasons": ["--full" if full else "a Dask build"]}
    if full:
        return {"mode": "full", "reasons": ["--full"]}
    if streamed:
        return {"mode": "full", "reasons": [_no_previous(previous)]}
    return build


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


def _publish_dask(
    store: VersionStore,
    source: BlockSource,
    publish: Callable[..., dict[str, Any]],
    *,
    address: str | None,
    workers: int | None,
    block_rows: int,
    block_symbols: int,
    say: Callable[[str], None],
    rows: RowReader | None = None,
) -> dict[str, Any]:
    """A build block by block: the workers of the Dask cluster at `address` (None: this
    process, one block after the other) write the arrays into a staging folder of the snapshot
    store (every host mounts it), which the new version takes over (`publish`, inside the
    staging folder's lifetime); this process writes the tables from the written chunks and
    never holds an (n x T) output array."""
    from eqrisk.build.distributed import dask_client, write_model_dask

    with store.staging() as staging:

        def write(client: Any) -> tuple[Staged, list[str]]:
            return write_model_dask(
                source,
                client,
                staging,
                previous=store.share_from(),
                block_rows=block_rows,
                block_symbols=block_symbols,
                progress=say,
                rows=rows,
            )

        if address is None:
            staged, names = write(None)
        else:
            say(f"starting Dask ({address})")
            with dask_client(address, workers=workers) as client:
                staged, names = write(client)
        written = open_arrays(staging, staged.arrays)
        result = result_of(source.plan, {name: cast(np.ndarray, written[name]) for name in names})
        _say_caps(result, say)
        return publish(result, staged=staged)


ingest_keys = ("data_source", "files", "merged_files", "ingested_at", "report_dir")


def _incremental(
    opened: Previous,
    plan: ModelPlan,
    panel: Panel,
    master: pd.DataFrame,
    digests: dict[str, Any],
    say: Callable[[str], None],
    block_symbols: int = BLOCK_SYMBOLS,
    dask_min_cells: int | None = None,
    *,
    window: tail.Window | None = None,
    returns_excluded: int = 0,
) -> tuple[SnapshotContent | None, dict[str, Any]]:
    """The reused part of the previous version, when there is one: (content, build block), or
    (None, build block saying why the build is full). With `dask_min_cells` (a Dask build is
    asked for), a tail of more cells than that is left to a full Dask build. With `window`
    (a tail plan) the reasons of a full build are left to the caller to say."""
    folder = opened.folder
    previous: Snapshot | None = opened.snapshot
    if opened.problem is not None:
        return None, {"mode": "full", "reasons": [f"previous version unusable: {opened.problem}"]}
    manifest: dict[str, Any] | None = None
    if previous is not None:
        manifest = dict(previous.manifest)
        manifest["symbol_names"] = previous.symbols["ticker"].astype(str).tolist()
    close = previous.array("price_close") if previous is not None and previous.chunked else None
    calendar = plan.sessions if window is None else window.calendar
    base = 0 if window is None else window.base
    decision = incremental.decide(digests, manifest, plan, close, calendar=calendar, base=base)

    def full_build(*more: str) -> tuple[None, dict[str, Any]]:
        reasons = [*decision.reasons, *more]
        if window is None:
            for why in reasons:
                say(why)
        return None, {"mode": "full", "reasons": reasons}

    if decision.chunk == 0 or previous is None or manifest is None or folder is None:
        return full_build()
    start = decision.chunk * CHUNK_SESSIONS
    cells = len(plan.symbols) * (len(calendar) - start)
    risk = RiskInputs.of(plan, first=base)
    refused = _not_incremental(
        manifest, block_symbols, cells, dask_min_cells, window, risk, decision
    )
    if refused:
        return full_build(refused)
    for why in decision.reasons:
        say(why)
    if dask_min_cells is not None:
        say(f"incremental in process: {cells:,} cells, at most {dask_min_cells:,} (dask_min_cells)")
    say(f"incremental: computing sessions from {str(calendar[start])[:10]}")
    computed = run_from(plan, start, base=base)
    result = incremental.tail_result(plan, computed, start, previous)
    written = panel
    if window is not None:
        result = tail.whole_result(result, start, window, previous, returns_excluded)
        written = tail.tail_panel(panel, start, window, previous)
    fields: dict[str, Any] = dict(result.metrics)
    for name in PANEL_ARRAYS:
        fields[name] = getattr(written, name)
    broken = incremental.derivations_hold(fields, manifest["arrays"]["derived"], start)
    if broken:
        return full_build(f"fields no longer derived on read: {', '.join(broken)}")
    first, last = incremental.first_last(plan, start, previous.symbols, calendar, base)
    build = {
        "mode": "incremental",
        "previous": folder.name,
        "from_chunk": decision.chunk,
        "from_session": str(calendar[start])[:10],
        "reasons": decision.reasons,
    }
    if window is not None:
        build["read_from"] = str(window.since.date())
    reuse = Reuse(decision.chunk, folder, manifest, last, first, build)
    content = SnapshotContent(
        result=result,
        panel=written,
        master=master,
        data_source="",
        ingest={},
        reuse=reuse,
        more=risk_files(result, risk, reuse, written.sessions),
    )
    return content, build


def _not_incremental(
    manifest: dict[str, Any],
    block_symbols: int,
    cells: int,
    dask_min_cells: int | None,
    window: tail.Window | None,
    risk: RiskInputs,
    decision: incremental.Decision,
) -> str | None:
    """Why a build the digests let reuse chunks is full all the same (None: it is not)."""
    block = int(manifest["arrays"]["grid"]["block"])
    if block != block_symbols:
        return f"the chunk grid's block changes ({block} -> {block_symbols} symbols)"
    if dask_min_cells is not None and cells > dask_min_cells:
        return f"{cells:,} cells to compute, more than {dask_min_cells:,} (dask_min_cells)"
    if window is not None and not risk_resumes(manifest, risk, decision.chunk):
        return "the previous version's risk model does not resume there"
    return None

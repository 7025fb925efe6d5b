"""What a build reads: the ingested universe (`open_universe`), whole (`read_universe`) or one
slice of sessions at a time for a full build that holds no (n x T) array (`streamed_build`),
and the refusal of a universe much smaller than the current snapshot's (`check_universe`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from eqrisk.build.block_inputs import stream_plan
from eqrisk.build.start import Reading
from eqrisk.data.corporate_actions import break_cells
from eqrisk.data.ingested import Stored, read_master, read_panel, read_rows, stored
from eqrisk.data.master import Mappings, classify, priced_master
from eqrisk.data.panel import MODEL_FIELDS, PANEL_FIELDS, Panel, shrink_reason
from eqrisk.model.plan_slices import plan_shape
from eqrisk.model.run import ModelParams
from eqrisk.snapshot.store import Previous, VersionStore


class UniverseShrank(ValueError):
    """The new snapshot's universe is a sharp shrink of the current one's; `force` publishes."""


def check_universe(previous: Previous, shape: tuple[int, int]) -> None:
    """Refuse (before the model runs) a panel far smaller than the current snapshot's."""
    version = previous.current
    if version is None or previous.snapshot is None or previous.snapshot.path.name != version:
        return  # nothing good to protect: a new build is the repair
    manifest = previous.snapshot.manifest
    old = (int(manifest["universe_size"]), int(manifest["sessions"]))
    why = shrink_reason(old, shape)
    if why is not None:
        raise UniverseShrank(
            f"refused to publish {shape[0]} symbols x {shape[1]} sessions over the current "
            f"snapshot {version} ({old[0]} x {old[1]}): {why}; nothing changed; check the "
            "ingested data (`eqrisk ingest`) or pass --force to publish it anyway"
        )


def open_universe(
    home: Path, mappings: Mappings, market_etf: str
) -> tuple[Stored, pd.DataFrame, pd.DataFrame]:
    """The ingested data set (found), its raw master of the symbols it prices and that master
    classified. Symbols priced but absent from the master: registry ETFs classify themselves;
    the rest are unclassified stocks (market level only)."""
    found = stored(home)
    if found is None:
        raise FileNotFoundError(
            f"no ingested data under {home}: run `eqrisk ingest PRICES --master FILE` or "
            "`eqrisk demo` first"
        )
    raw_master = priced_master(read_master(found), found.symbols())
    return found, raw_master, classify(raw_master, mappings, market_etf=market_etf)


def read_universe(
    home: Path, mappings: Mappings, market_etf: str, share_classes: dict[str, str] | None = None
) -> tuple[Panel, pd.DataFrame, dict[str, Any]]:
    """The ingested data set as the model reads it: the panel (filled one symbol block at a
    time), the classified master of its symbols (`open_universe`) and the ingest's meta."""
    found, raw_master, master = open_universe(home, mappings, market_etf)
    return read_panel(found, raw_master, share_classes), master, found.meta


def streamed_build(
    found: Stored,
    raw_master: pd.DataFrame,
    classes: dict[str, str],
    master: pd.DataFrame,
    params: ModelParams,
    store: VersionStore,
    say: Callable[[str], None],
    publish_on: Callable[[Reading], dict[str, Any]],
    *,
    block_symbols: int,
    check: Previous | None,
) -> dict[str, Any]:
    """A full build whose plan is computed one slice of sessions at a time from the ingested
    data set (`block_inputs.stream_plan`, its rows in a scratch folder of the store while the
    build runs) and whose blocks read their own rows: the builder holds no (n x T) array.
    `check`: the previous version a much smaller universe is refused against (`--force`:
    None). `publish_on(reading)` publishes it (`pipeline.Build.on`); the reading's panel
    holds the symbols and sessions only."""
    calendar = found.calendar()
    if calendar.empty:
        raise ValueError(f"the ingested data set under {found.folder} holds no price")
    symbols = found.symbols()
    if check is not None:
        check_universe(check, (len(symbols), len(calendar)))
    shape = plan_shape(symbols, calendar.to_numpy(), master, params)
    say(f"estimating the model ({len(symbols)} symbols x {len(calendar)} sessions)")

    def read(t0: int, t1: int) -> tuple[np.ndarray, np.ndarray]:
        since, until = calendar[t0], calendar[t1 - 1]
        part = read_panel(found, raw_master, classes, since=since, until=until, fields=MODEL_FIELDS)
        return part.close, part.market_cap

    def rows(start: int, stop: int, names: tuple[str, ...]) -> dict[str, np.ndarray]:
        return read_rows(found, symbols[start:stop], shape.sessions, names)

    cells = break_cells(found.meta.get("return_breaks", []), symbols, shape.sessions)
    with store.staging() as folder:
        streamed = stream_plan(
            shape, read, folder, master, block_symbols=block_symbols, breaks=cells, progress=say
        )
        hollow = np.broadcast_to(np.float64(np.nan), (len(symbols), len(calendar)))
        # not held: the plan's files hold them
        arrays: dict[str, Any] = dict.fromkeys(PANEL_FIELDS, hollow)
        panel = Panel(symbols=symbols, sessions=shape.sessions, **arrays, read=())
        return publish_on(Reading(panel, rows=rows, streamed=streamed))

"""`eqrisk build`: ingested data -> model -> a new snapshot version (the only place that joins
the three; the model itself does no I/O)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from eqrisk.data.master import Mappings, classify
from eqrisk.data.store import read_ingested, to_panel
from eqrisk.model.risk import ModelParams, run_model
from eqrisk.snapshot.store import write_snapshot
from eqrisk.snapshot.tables import SnapshotContent


def build_snapshot(
    home: Path,
    params: ModelParams,
    *,
    market_etf: str = "SPY",
    sector_map: Path | None = None,
    subsector_map: Path | None = None,
    keep: int = 3,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Build the model on the ingested data and publish it as the current snapshot."""
    say = progress or (lambda _msg: None)
    say("reading ingested data")
    prices, raw_master, meta = read_ingested(home)
    present = pd.Index(prices["symbol"].unique())
    missing = present.difference(raw_master["symbol"].astype(str))
    if len(missing):
        # Symbols priced but absent from the master: registry ETFs classify themselves; the
        # rest are unclassified stocks (market level only).
        raw_master = pd.concat(
            [raw_master, pd.DataFrame({"symbol": missing, "asset_type": "stock"})],
            ignore_index=True,
        )
    raw_master = raw_master[raw_master["symbol"].isin(present)]
    master = classify(raw_master, Mappings.load(sector_map, subsector_map), market_etf=market_etf)
    say(f"building the panel ({len(present)} symbols)")
    panel = to_panel(prices, raw_master)
    say(f"estimating the model ({panel.shape[0]} symbols x {panel.shape[1]} sessions)")
    result = run_model(panel, master, params)
    content = SnapshotContent(
        result=result,
        panel=panel,
        master=master,
        data_source=str(meta.get("data_source", "unknown")),
        ingest={k: meta.get(k) for k in ("data_source", "files", "ingested_at", "report_dir")},
    )
    return write_snapshot(home, content, keep=keep, progress=say)

"""The demo pipeline: generate the seeded market, ingest it as a user's files, build it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from eqrisk.build.pipeline import build_snapshot
from eqrisk.data.demo import DATA_SOURCE as DEMO_SOURCE
from eqrisk.data.demo import generate_demo, write_demo_files
from eqrisk.data.ingest import ingest
from eqrisk.model.run import ModelParams
from eqrisk.snapshot.store import VersionStore


class DemoDataInvalid(RuntimeError):
    """The generated demo market failed ingest validation (a generator bug, never user data)."""


def build_demo(
    home: Path,
    *,
    seed: int = 7,
    start: str | None = None,
    params: ModelParams | None = None,
    market_etf: str = "SPY",
    max_move: float = 0.5,
    replace: bool = False,
    force: bool = False,
    progress: Callable[[str], None] | None = None,
    store: VersionStore | None = None,
) -> dict[str, Any]:
    """The demo pipeline, written once: generate the seeded market, write it as a vendor would
    (`<home>/demo/`), ingest it through the user's path, build and publish its snapshot.

    `eqrisk demo`, the tests' demo home and the benchmarks all call this. `replace` and `force`
    pass to `ingest` and `build_snapshot` (the CLI sets both after checking that the home holds
    only demo data). Returns the new snapshot's manifest; raises DemoDataInvalid when the
    generated data does not validate."""
    say = progress or (lambda _msg: None)
    say("generating the demo market")
    market = generate_demo(seed=seed) if start is None else generate_demo(seed=seed, start=start)
    files = write_demo_files(market, home / "demo")
    report = ingest(
        [files["prices"]],
        files["master"],
        home=home,
        max_move=max_move,
        replace=replace,
        data_source=DEMO_SOURCE,
        progress=say,
    )
    if not report.ok:
        raise DemoDataInvalid(f"the demo data failed validation; see {report.report_dir}")
    return build_snapshot(
        home,
        params or ModelParams(),
        market_etf=market_etf,
        force=force,
        progress=say,
        store=store,
    )

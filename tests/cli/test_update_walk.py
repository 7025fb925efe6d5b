"""The walk of `eqrisk update FILE` through the code (docs/CONTRIBUTING.md, "The walk of an
update"): a real `eqrisk update` process on a copy of the demo home, with a profiler that
records the first call and the number of calls of every function of the package, passes each
stage once and in order: read, judge, merge, plan, run, write, publish."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

from eqrisk.data.calendar import sessions_between

from .test_cli_imports import NOT_FOR_UPDATE, not_for

# Each stage, the function that marks it (module, qualified name).
STAGES = {
    "read": "eqrisk.data.ingest_read.read_inputs",
    "judge": "eqrisk.data.ingest_read.check_rows",
    "merge": "eqrisk.data.merge_rows.combine",
    "plan": "eqrisk.model.run.plan_model",
    "run": "eqrisk.model.run.run_block",
    "write": "eqrisk.snapshot.store.VersionStore.write",
    "publish": "eqrisk.snapshot.store.VersionStore.set_current",
}

# The command under a profiler: every call of a function of the package counted, and the
# order of the first calls, written to the file named first.
TRACED = """
import collections, json, sys
from pathlib import Path

out, argv = Path(sys.argv[1]), sys.argv[2:]
calls, first = collections.Counter(), {}

def seen(frame, event, arg):
    if event == "call" and "/eqrisk/" in frame.f_code.co_filename:
        key = frame.f_globals.get("__name__", "?") + "." + frame.f_code.co_qualname
        calls[key] += 1
        first.setdefault(key, len(first))

sys.setprofile(seen)
from eqrisk.cli import app
status = None
try:
    app(argv, prog_name="eqrisk")
except SystemExit as exc:
    status = exc.code
sys.setprofile(None)
out.write_text(json.dumps({"status": status, "calls": calls, "first": first,
                           "modules": sorted(sys.modules)}))
"""


def _next_session(home: Path, path: Path) -> None:
    """The demo's last session again as the next one, every price 1% up: one new session."""
    prices = pd.read_csv(home / "demo" / "demo_prices.csv.gz")
    last = prices[prices["date"] == prices["date"].max()]
    start = pd.Timestamp(last["date"].iloc[0])
    following = sessions_between(start, start + pd.Timedelta(days=10))[1]
    new = last.assign(date=following.strftime("%Y-%m-%d"))
    for column in ("open", "high", "low", "close", "adjusted_close"):
        new[column] = new[column] * 1.01
    new.to_csv(path, index=False)


def test_an_update_passes_each_stage_once_in_order(demo_home: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    shutil.copytree(demo_home, home, ignore=shutil.ignore_patterns("accounts.db*"))
    update = tmp_path / "next.csv"
    _next_session(home, update)
    trace = tmp_path / "trace.json"
    env = {**os.environ, "EQRISK_HOME": str(home)}
    env.pop("EQRISK_SNAPSHOTS", None)
    proc = subprocess.run(
        [sys.executable, "-c", TRACED, str(trace), "update", str(update)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(trace.read_text())
    assert doc["status"] in (None, 0)
    calls, first = doc["calls"], doc["first"]
    assert {stage: calls.get(name, 0) for stage, name in STAGES.items()} == dict.fromkeys(STAGES, 1)
    order = sorted(STAGES, key=lambda stage: first[STAGES[stage]])
    assert order == list(STAGES)
    # Between them: the returns judged on the merged rows and the data set written before the
    # build; the build decides where to start after planning and before running.
    assert first[STAGES["merge"]] < first["eqrisk.data.return_cleaning.clean_returns"]
    assert first["eqrisk.data.ingested.write_ingested"] < first[STAGES["plan"]]
    decide = first["eqrisk.build.incremental.decide"]
    assert first[STAGES["plan"]] < decide < first[STAGES["run"]]
    assert "incremental build" in proc.stdout + proc.stderr
    # The master: asked for by the ingest (its levels report) and by the build, classified once.
    assert calls["eqrisk.data.master.classify"] == 2
    assert calls["eqrisk.data.master._classified"] == 1
    modules = set(doc["modules"])
    assert not_for(modules, NOT_FOR_UPDATE) == []
    # Of the commands, the data commands' module alone (and the bucket's push, asked after
    # the build; nothing configured, it pushes nothing).
    commands = {m for m in modules if m.startswith("eqrisk.cli.")}
    assert commands <= {"eqrisk.cli.app", "eqrisk.cli.output", "eqrisk.cli.data",
                        "eqrisk.cli.bucket", "eqrisk.cli.snapshots"}  # fmt: skip

"""`kill -9` of an ingest at every step of its writing (each file written, folder made, rename
and removal, counted in the process): the ingested data set is the old one or the new one, whole,
once the next command has started; nothing of the killed ingest is left behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from eqrisk.data import ingested as store
from eqrisk.data.calendar import sessions_between
from eqrisk.data.ingest import ingest
from helpers import tree_hash

pytestmark = pytest.mark.reliability

# The child: an ingest whose filesystem steps are counted; at step KILL_AT it kills itself with
# SIGKILL before the step runs (0: run to the end and print the number of steps).
CHILD = r"""
import os, pathlib, shutil, signal, sys
import pandas as pd, pyarrow.parquet as pq
kill_at, steps = int(sys.argv[3]), [0]
def counted(owner, name):
    real = getattr(owner, name)
    def step(*args, **kwargs):
        steps[0] += 1
        if steps[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)
    setattr(owner, name, step)
for owner, name in [(pathlib.Path, "rename"), (pathlib.Path, "write_text"),
                    (pathlib.Path, "mkdir"), (shutil, "rmtree"), (pq, "write_table"),
                    (pd.DataFrame, "to_parquet"), (pd.DataFrame, "to_csv")]:
    counted(owner, name)
from eqrisk.data.ingest import ingest
ingest([pathlib.Path(sys.argv[2])], None, home=pathlib.Path(sys.argv[1]), merge=True)
print(steps[0])
"""


def _child(home: Path, prices: Path, kill_at: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(home), str(prices), str(kill_at)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )


def _frame() -> pd.DataFrame:
    rng = np.random.default_rng(3)
    days = sessions_between(pd.Timestamp("2022-01-03"), pd.Timestamp("2022-03-31"))
    symbols = ["AAA", "BBB", "CCC", "DDD"]
    closes = 20 * np.exp(np.cumsum(rng.normal(0, 0.01, (len(symbols), len(days))), axis=1))
    return pd.DataFrame({"date": np.tile(days.strftime("%Y-%m-%d"), len(symbols)),
                         "symbol": np.repeat(symbols, len(days)), "close": closes.ravel()})  # fmt: skip


def _state(home: Path) -> tuple[int, str]:
    """(sessions, data_source) of the ingested data set as the next command sees it."""
    prices, _, meta = store.read_ingested(home)
    return int(prices["date"].nunique()), str(meta["data_source"])


def test_an_ingest_killed_at_any_step_leaves_the_old_or_the_new_set(
    tmp_path: Path, figures
) -> None:
    frame = _frame()
    days = sorted(frame["date"].unique())
    first = tmp_path / "first.csv"
    frame[frame["date"] < days[-1]].to_csv(first, index=False)
    last = tmp_path / "last.csv"
    frame[frame["date"] == days[-1]].to_csv(last, index=False)
    base = tmp_path / "base"
    ingest([first], None, home=base)
    old, new = (len(days) - 1, "first"), (len(days), "first")
    old_tree = tree_hash(base)

    reference = tmp_path / "reference"
    shutil.copytree(base, reference)
    done = _child(reference, last, 0)
    assert done.returncode == 0, done.stderr
    steps = int(done.stdout.split()[-1])
    assert steps >= 6  # report folder and files, three data files, two renames, a removal
    assert _state(reference) == new

    seen: dict[str, int] = {"old": 0, "new": 0, "aside": 0}
    for kill_at in range(1, steps + 1):
        home = tmp_path / f"kill-{kill_at}"
        shutil.copytree(base, home)
        proc = _child(home, last, kill_at)
        assert proc.returncode == -signal.SIGKILL, (kill_at, proc.stderr)
        if not store.ingested_dir(home).exists():
            seen["aside"] += 1
            assert list(home.glob(".ingest-old-*")), f"no data set at all after step {kill_at}"
        state = _state(home)  # the next start: recovers a set left aside
        assert state in (old, new), (kill_at, state)
        if state == old:  # the old set, byte for byte (report folders aside)
            assert tree_hash(home) == old_tree, kill_at
        seen["old" if state == old else "new"] += 1
        left = sorted(p.name for p in home.glob(".ingest-*"))
        assert left == [], (kill_at, left)
        # The next ingest runs as usual and gives the new set.
        assert ingest([last], None, home=home, merge=True).ok
        assert _state(home) == new
        meta = json.loads((store.ingested_dir(home) / "meta.json").read_text())
        assert meta["data_source"] == "first"
        shutil.rmtree(home)
    assert seen["old"] >= 1 and seen["new"] >= 1 and seen["aside"] == 1
    figures(steps=steps, **seen)

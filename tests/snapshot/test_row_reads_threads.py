"""Rows read by many threads at once from a store just opened (a server's first requests on a
version): every thread is given the same chunk mappings, and the tables the row kernel walks
keep the mappings they point into alive, through `close_files` too. A mapping replaced or
dropped under a reading thread crashed the process (SIGSEGV in `ChunkStore.full_row`, seen in
`test_dropin_macro`), so the readers run in a child process and the test reads its exit status
and its count of wrong rows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHILD = r"""
import gc
import sys
import threading
from pathlib import Path

import numpy as np

from eqrisk.snapshot import chunks

folder, rounds = Path(sys.argv[1]), int(sys.argv[2])
grid = chunks.ChunkGrid(n=40, t=600, block=20, chunk=16)
rng = np.random.default_rng(0)
fields = {f"f{k}": rng.normal(size=(grid.n, grid.t)) for k in range(6)}
for k in range(3):  # runs with gaps: group files beside the fields' own chunks
    fields[f"f{k}"][rng.random((grid.n, grid.t)) < 0.3] = np.nan
arrays, _ = chunks.write_arrays(folder, fields, grid)
names = chunks.open_arrays(folder, arrays)["f0"].store.fields
want = {r: np.stack([fields[name][r] for name in names]).tobytes() for r in range(grid.n)}
sys.setswitchinterval(1e-6)  # threads switch between any two steps of opening a chunk
wrong = 0
for _ in range(rounds):
    opened = chunks.open_arrays(folder, arrays)
    store = opened["f0"].store
    start = threading.Barrier(6)
    got = {}

    def read(r):
        start.wait()
        got[r] = store.full_row(r).tobytes()

    threads = [threading.Thread(target=read, args=(r,)) for r in (0, 1, 2, 21, 22, 23)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wrong += sum(got[r] != want[r] for r in got)
    chunks.close_files(opened)  # what a build's pass does between its steps
    gc.collect()  # the mappings nothing holds are unmapped now
    wrong += sum(store.full_row(r).tobytes() != want[r] for r in (0, 21, 39))
print("wrong rows", wrong)
"""


def test_rows_read_by_threads_at_once_are_right_and_do_not_crash(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), "6"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "wrong rows 0"

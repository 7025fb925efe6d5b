"""WAL checkpoints off the commit path (SQLite only).

SQLite's automatic checkpoint runs inside the connection that commits past 1,000 WAL pages: on
the charge writer's connection that meant a 20-75 ms copy and sync every ~140 groups, and every
request waiting for a charge waited for it (the p99 of metered calls). The writer's connection
turns the automatic checkpoint off (`wal_autocheckpoint=0`) and this thread, on its own
connection, checkpoints instead:

- every `every_s` it runs PASSIVE checkpoints: each copies what the WAL holds into the
  database file and syncs it while the writer keeps committing (a PASSIVE checkpoint never
  takes the write lock). It repeats (up to `MORE_PASSES`) until a pass finds nothing new: the
  WAL is then all in the database and the next commit starts the WAL file over from its
  beginning. At a server's pace a short pass falls between two groups and the WAL stays a few
  hundred kB. Without this the WAL stays a little ahead of every checkpoint under continuous
  commits and grows without bound (what an earlier attempt with one pass per round saw);
- behind a writer that never pauses (no pass ever finds nothing new) and a WAL past
  `finish_frames`, the writer copies the last few pages itself, between two groups, on its own
  connection (`finish`: the group before already has its answers). Holding the writer's lock
  from this thread for that pass was tried: with the GIL to win back before the lock is
  released, the writer waited up to 24 ms for it. The syncs of a checkpoint take up to
  ~100 ms on this shared machine while other processes write gigabytes, which is why the
  writer does this only as a last resort;
- past `restart_frames` (another process writing too, a reader holding an old snapshot), a
  RESTART checkpoint waits for the writers and readers of every process, once, and starts the
  WAL over.

Durability is SQLite's, unchanged: with `synchronous=NORMAL` in WAL mode a commit is in the WAL
file when the charge's answer leaves (it survives the process being killed; a power cut may lose
the last transactions, as before). A checkpoint only moves committed pages into the database
file, with its own syncs, before the WAL may be reused.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from sqlalchemy import Engine

logger = logging.getLogger("eqrisk.accounts")

CHECKPOINT_EVERY_S = 0.1
MORE_PASSES = 4  # passes a round makes at most while commits keep arriving
FINISH_FRAMES = 2_048  # ~8 MB of 4 kB pages: past this, the writer copies the last pages
RESTART_FRAMES = 16_384  # ~64 MB of 4 kB pages: past this, a checkpoint that waits for everyone


def wal_checkpoint(cursor: Any, mode: str = "PASSIVE") -> tuple[int, int, int]:
    """(busy, frames in the WAL, frames checkpointed) of one checkpoint in `mode`."""
    cursor.execute(f"PRAGMA wal_checkpoint({mode})")
    busy, log, done = cursor.fetchone()
    return int(busy), int(log), int(done)


class Checkpointer:
    """A thread that checkpoints the WAL of `engine`'s SQLite database beside the charge
    writer, which calls `finish` between two groups when a round asks for it."""

    def __init__(
        self,
        engine: Engine,
        *,
        every_s: float = CHECKPOINT_EVERY_S,
        finish_frames: int = FINISH_FRAMES,
        restart_frames: int = RESTART_FRAMES,
    ) -> None:
        self.engine = engine
        self.every_s = every_s
        self.finish_frames = finish_frames
        self.restart_frames = restart_frames
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # What it did, for the tests and the bench.
        self.rounds = 0
        self.converged = 0  # rounds after which the WAL started over
        self.finishes = 0
        self.restarts = 0
        self.max_frames = 0
        self.finish_s_max = 0.0  # the longest `finish` held the writer
        self.delta_due = False  # set by a round, cleared by the writer's `finish`

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name="eqrisk-wal-checkpointer", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop after one last checkpoint (so an idle server leaves a short WAL behind)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None

    def _run(self) -> None:
        conn = self.engine.raw_connection()
        try:
            cursor = conn.cursor()
            try:
                while not self._stop.wait(self.every_s):
                    self._round(cursor)
                self._round(cursor)
            finally:
                cursor.close()
        finally:
            conn.close()

    def _round(self, cursor: Any) -> None:
        try:
            self.checkpoint(cursor)
        except Exception:  # e.g. a disk error: the next round tries again, the commits go on
            logger.exception("WAL checkpoint failed")

    def checkpoint(self, cursor: Any) -> None:
        """One round: passes beside the commits until one finds nothing new (the WAL then
        starts over at the next commit); behind a writer that never pauses, the writer is
        asked to copy the last few pages itself (`finish`) once the WAL holds
        `finish_frames`, and past `restart_frames` a RESTART checkpoint waits for everyone."""
        self.rounds += 1
        _busy, frames, _done = wal_checkpoint(cursor)  # the WAL's frames when it began
        self.max_frames = max(self.max_frames, frames)
        if frames <= 0:
            return  # an empty WAL (or not in WAL mode): nothing to do
        for _ in range(MORE_PASSES):
            _busy, now, done = wal_checkpoint(cursor)
            if now == frames and done == now:
                self.converged += 1
                return  # all in the database, nothing committed since: the WAL starts over
            frames = now
        self.max_frames = max(self.max_frames, frames)
        if frames > self.finish_frames:
            self.delta_due = True
        if frames > self.restart_frames:
            self.restarts += 1
            wal_checkpoint(cursor, "RESTART")

    def finish(self, conn: Any) -> None:
        """Run by the writer between two groups when `delta_due`: copy what was committed
        since the last pass (a few pages). The WAL is then all in the database and the
        writer's next transaction starts it over from the beginning."""
        self.delta_due = False
        started = time.perf_counter()
        cursor = conn.cursor()
        try:
            wal_checkpoint(cursor)
        except Exception:
            logger.exception("WAL checkpoint failed")
        finally:
            cursor.close()
        self.finish_s_max = max(self.finish_s_max, time.perf_counter() - started)
        self.finishes += 1

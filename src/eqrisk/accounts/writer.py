"""One charge writer per process: the charges of concurrent requests commit together.

A request's charge used to be its own write transaction; under load they queued on SQLite's one
write lock (with back-off sleeps) or on PostgreSQL's row lock, each paying a commit. Here the
event loop gathers the charges of its requests: while one group is being committed, the next
one gathers, and it is handed over, whole, the moment the first is done. One thread writes the
groups (`Accounts.charge_many`: one transaction, each charge decided in order as if alone, never
below zero) and hands each group's outcomes back to its loop in one call. So a group grows with
the load, a lone request waits for nobody, and each group costs one thread wake-up each way,
not one per charge (thread hand-offs were most of the cost once the SQL was cheap).

The thread keeps one database connection while it lives (no pool checkout per group), starts on
the first group and ends, closing it, after `idle_s` without one, so an application built and
dropped (tests build many) leaves no thread behind. On SQLite that connection never checkpoints
the WAL itself: a `Checkpointer` thread (accounts/checkpoint.py) lives as long as the writer and
does it beside the commits, so no group waits for a checkpoint.

Outages (docs/decisions/outages.md): every group goes through the database's guard
(`Accounts.backend`), so while the database is down a group is answered `BackendUnavailable`
(a 503) at once. A group whose COMMIT got no answer is settled before anyone is answered
(`_settle`): its 2xx if it committed, a 503 if not; and where the database cannot even be asked,
a 503 now and its charges taken back later if it had committed (`accounts/doubt.py`). So an
answer that is not a 2xx is never charged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.pool import PoolProxiedConnection

from eqrisk.accounts.backends import BackendUnavailable, one_line
from eqrisk.accounts.book import Accounts
from eqrisk.accounts.charges import Charge, ChargeRequest, CommitUnknown
from eqrisk.accounts.checkpoint import CHECKPOINT_EVERY_S, Checkpointer
from eqrisk.accounts.doubt import Doubt, InDoubt

logger = logging.getLogger("eqrisk.accounts")

SQLITE_AUTOCHECKPOINT = 1000  # SQLite's default, restored on a connection given back to the pool
MAX_GROUP = 512  # charges per transaction at most (a bound on one commit's work and latency)

# A group handed to the thread, and where its outcomes (or its error) go.
Done = Callable[[list[Charge] | BaseException], None]


@dataclass
class _LoopGroups:
    """One event loop's charges: those waiting for the next group, and whether a group of
    this loop is being committed now."""

    waiting: list[tuple[ChargeRequest, asyncio.Future[Charge]]] = field(default_factory=list)
    in_flight: bool = False
    scheduled: bool = False


class ChargeWriter:
    def __init__(
        self,
        accounts: Accounts,
        *,
        idle_s: float = 5.0,
        checkpoint_s: float = CHECKPOINT_EVERY_S,
        journal: Path | None = None,
    ) -> None:
        self.accounts = accounts
        self.idle_s = idle_s
        self.checkpoint_s = checkpoint_s
        self._sqlite = accounts.engine.dialect.name == "sqlite"
        self.checkpointer: Checkpointer | None = None  # the running thread's (one per thread)
        self._queue: queue.SimpleQueue[tuple[list[ChargeRequest], Done]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopGroups] = (
            weakref.WeakKeyDictionary()
        )
        self.groups = 0  # transactions committed (or failed): for the bench and the tests
        self.charges = 0
        # Groups whose COMMIT got no answer: settled at once ("committed" / "aborted"), or
        # recorded until the database answers again (`in_doubt`, `taken_back` charges).
        self.in_doubt = InDoubt(journal)
        self.settled: Counter[str] = Counter()
        self.taken_back = 0

    # -- the event loop's side --------------------------------------------------------------
    async def charge(self, request: ChargeRequest) -> Charge:
        """The charge's outcome, once the group it joined has committed."""
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is None:
            state = self._loops[loop] = _LoopGroups()
        future: asyncio.Future[Charge] = loop.create_future()
        state.waiting.append((request, future))
        if not state.in_flight and not state.scheduled:
            # After this turn of the loop: the requests it is running may charge too.
            state.scheduled = True
            loop.call_soon(self._hand_over, loop, state)
        return await future

    def _hand_over(self, loop: asyncio.AbstractEventLoop, state: _LoopGroups) -> None:
        state.scheduled = False
        group = [(r, f) for r, f in state.waiting if not f.cancelled()]  # gone: not charged
        state.waiting = []
        if not group:
            return
        state.in_flight = True

        def done(outcome: list[Charge] | BaseException) -> None:  # runs in the writer thread
            # A loop closed meanwhile has nobody waiting any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._resolve, loop, state, group, outcome)

        self.submit([r for r, _ in group], done)

    def _resolve(
        self,
        loop: asyncio.AbstractEventLoop,
        state: _LoopGroups,
        group: list[tuple[ChargeRequest, asyncio.Future[Charge]]],
        outcome: list[Charge] | BaseException,
    ) -> None:
        for n, (_, future) in enumerate(group):
            if future.done():
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome[n])
        state.in_flight = False
        if state.waiting:  # what gathered meanwhile goes at once
            self._hand_over(loop, state)

    # -- the writer thread ------------------------------------------------------------------
    def submit(self, requests: Sequence[ChargeRequest], done: Done) -> None:
        """Queue a group; `done` is called from the writer thread with its outcomes, in order
        (or with the error that failed it)."""
        self._queue.put((list(requests), done))
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="eqrisk-charge-writer", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        conn: PoolProxiedConnection | None = None
        checkpointer = None
        if self._sqlite:
            checkpointer = Checkpointer(self.accounts.engine, every_s=self.checkpoint_s)
            self.checkpointer = checkpointer
            checkpointer.start()
        self.in_doubt.adopt()  # what a process that died left to take back
        try:
            while True:
                # While charges wait to be taken back, wake up to try again (and stay).
                wait = self.accounts.backend.retry_s if len(self.in_doubt) else self.idle_s
                try:
                    first = self._queue.get(timeout=wait)
                except queue.Empty:
                    self._take_back()
                    with self._lock:  # submit() puts before it reads _thread: nothing is lost
                        if self._queue.empty() and not len(self.in_doubt):
                            self._thread = None
                            return
                    continue
                groups = [first]  # groups of several loops (or that queued up) commit together
                size = len(first[0])
                while size < MAX_GROUP:
                    try:
                        groups.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                    size += len(groups[-1][0])
                conn = self._commit(groups, conn)
                if conn is None:
                    continue
                if len(self.in_doubt):
                    self._take_back()  # the database answers again
                if checkpointer is not None and checkpointer.delta_due:
                    checkpointer.finish(conn)  # the answers of this group are already sent
        except BaseException:
            with self._lock:  # an unexpected end: the next submit starts a new thread
                self._thread = None
            raise
        finally:
            if checkpointer is not None:
                checkpointer.stop()
            if conn is not None:
                self._release(conn)

    def _connect(self) -> PoolProxiedConnection:
        conn = self.accounts.write_connection()
        if self._sqlite:
            try:
                _set_autocheckpoint(conn, 0)  # the checkpointer thread does it
            except BaseException:
                conn.invalidate()
                raise
        return conn

    def _release(self, conn: PoolProxiedConnection) -> None:
        """Back to the pool as it came (other users of the connection checkpoint as usual)."""
        if self._sqlite:
            try:
                _set_autocheckpoint(conn, SQLITE_AUTOCHECKPOINT)
            except Exception:
                conn.invalidate()  # not in a state to lend to anyone: closed, not pooled
                return
        conn.close()

    def _commit(
        self, groups: list[tuple[list[ChargeRequest], Done]], conn: PoolProxiedConnection | None
    ) -> PoolProxiedConnection | None:
        """Charge the groups in one transaction on `conn` (opened if None) and hand each its
        outcomes; returns the connection to keep, None when it failed (it may be broken).

        The database unavailable (or found so by this attempt): every group gets the
        `BackendUnavailable` (a 503), nothing charged. A COMMIT without an answer is settled
        first (`_settle`). Any other error: each group is tried alone, so one bad charge
        fails only its own group."""
        requests = [r for rs, _ in groups for r in rs]
        self.groups += 1
        self.charges += len(requests)
        backend = self.accounts.backend
        try:
            with backend.guard():
                kept = conn is not None
                if conn is None:
                    conn = self._connect()
                try:
                    outcomes = self._charge(requests, conn)
                except Exception as exc:
                    if not kept or not backend.is_outage(exc):
                        raise
                    # The kept connection died while unused (a restart of the database, a
                    # network cut since the last group): the COMMIT was never sent, so the
                    # group is tried once more, on a new connection.
                    conn.invalidate()
                    conn = None
                    conn = self._connect()
                    outcomes = self._charge(requests, conn)
        except BackendUnavailable as exc:
            for _, done in groups:
                done(exc)
            return self._drop(conn)
        except Exception as exc:
            if len(groups) == 1:
                groups[0][1](exc)
                return self._drop(conn)
            for rs, done in groups:
                try:
                    with backend.guard():
                        alone = self._charge(rs, None)
                except Exception as error:
                    done(error)
                else:
                    done(alone)
            return self._drop(conn)
        start = 0
        for rs, done in groups:
            done(outcomes[start : start + len(rs)])
            start += len(rs)
        return conn

    def _charge(
        self, requests: list[ChargeRequest], conn: PoolProxiedConnection | None
    ) -> list[Charge]:
        """One charge transaction on `conn` (None: a connection of its own); a COMMIT without
        an answer settled (`_settle`)."""
        try:
            return self.accounts.charge_many(requests, conn=conn)
        except CommitUnknown as doubt:
            return self._settle(doubt, requests)

    @staticmethod
    def _drop(conn: PoolProxiedConnection | None) -> None:
        if conn is not None:
            conn.invalidate()  # a failed group may have broken it: open anew next time

    def _settle(self, doubt: CommitUnknown, requests: list[ChargeRequest]) -> list[Charge]:
        """The outcomes of a group whose COMMIT got no answer, once the database says whether
        it committed: its outcomes if it did; if it did not, `BackendUnavailable` (nothing was
        charged). When the database cannot be asked now, the group is recorded in `in_doubt`
        (its charges are taken back if it did commit, `_take_back`) and answered
        `BackendUnavailable`: an answer that is not a 2xx is never charged."""
        backend = self.accounts.backend
        try:
            outcome = self.accounts.settle(doubt.xid, doubt.pid)
        except Exception as exc:
            self.in_doubt.add(Doubt(doubt.xid, doubt.pid, tuple(r.request_id for r in requests)))
            logger.warning(
                "charge group of %d: the commit of transaction %s got no answer and the "
                "database cannot be asked (%s); answered 503, its charges are taken back if "
                "it committed",
                len(requests),
                doubt.xid,
                one_line(exc),
            )
            backend.failed(exc)
            raise backend.unavailable("a charge could not be confirmed") from exc
        self.settled[outcome] += 1
        logger.warning(
            "charge group of %d: the commit of transaction %s got no answer; it %s",
            len(requests),
            doubt.xid,
            outcome,
        )
        if outcome == "committed":
            return doubt.results
        raise backend.unavailable("the connection to the database failed; nothing was charged")

    def _take_back(self) -> None:
        """Settle the recorded doubts while the database answers: the charges of one that did
        commit are taken back (its requests were answered with an error)."""
        backend = self.accounts.backend
        for doubt in self.in_doubt.items():
            if backend.down:
                return
            try:
                with backend.guard():
                    taken = self.accounts.undo(doubt.xid, doubt.pid)
            except Exception as exc:
                logger.warning("charges of transaction %s not settled yet: %s", doubt.xid, exc)
                return
            self.taken_back += taken
            self.in_doubt.drop(doubt)
            logger.warning(
                "transaction %s settled: %d charge(s) of requests answered 503 taken back",
                doubt.xid,
                taken,
            )


def _set_autocheckpoint(conn: PoolProxiedConnection, pages: int) -> None:
    cursor = conn.cursor()
    try:
        cursor.execute(f"PRAGMA wal_autocheckpoint={int(pages)}")
    finally:
        cursor.close()

"""Per-key rate limits, moving window, exact for every process that shares the count:

- memory: one server process; exact and the fastest (no I/O, O(1) a hit: `MemoryWindow`);
- a SQLite file under `home`: the worker processes of one machine (`serve --workers N`
  without Redis); one write transaction per hit, so concurrent workers never both take the
  last request of a window;
- Redis (the `limits` library) when `EQRISK_REDIS_URL` is set: every worker and host. Every
  Redis command is bounded (`redis_connect_timeout_s`, `redis_timeout_s`, no retries); while
  Redis is unavailable each process counts in its own memory (docs/decisions/outages.md:
  limits fail over to per-process counts, nothing is refused because Redis is down).
"""

from __future__ import annotations

import math
import sqlite3
import threading
import time
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from limits import RateLimitItem, parse, storage, strategies
from redis.backoff import NoBackoff
from redis.retry import Retry

from eqrisk.accounts.backends import Backend, BackendUnavailable, redis_outage

SQLITE_FILE = "ratelimits.sqlite3"
_PURGE_EVERY = 1000  # hits between sweeps of rows whose window has passed (keys gone quiet)


@dataclass(frozen=True)
class Decision:
    allowed: bool
    limit: int
    remaining: int
    reset_time: float  # unix time when the window frees a request

    def headers(self) -> dict[str, str]:
        return {
            "X-RateLimit-Limit": str(self.limit),
            "X-RateLimit-Remaining": str(self.remaining),
            "X-RateLimit-Reset": str(math.ceil(self.reset_time)),
        }

    @property
    def retry_after(self) -> int:
        return max(1, math.ceil(self.reset_time - time.time()))


@lru_cache(maxsize=64)
def _item(spec: str) -> RateLimitItem:
    return parse(spec)


class MemoryWindow:
    """A moving window in this process's memory: per key, the times of its counted requests
    still inside the window, oldest first. A hit drops the times that left the window from the
    front and appends its own: O(1) amortized, whatever the limit and the rate.

    (The `limits` library's memory storage keeps a list that each hit inserts at the front of
    and a timer thread, restarted every 10 ms under load, that sweeps every key: at a few
    thousand requests a second that was most of a metered request's cost.)"""

    def __init__(self) -> None:
        self._times: dict[str, deque[float]] = {}
        self._lock = threading.Lock()
        self._hits = 0

    def hit(self, key: str, amount: int, window_s: int) -> tuple[bool, int, float]:
        """(allowed, requests now counted in the window, unix time its oldest one leaves)."""
        now = time.time()
        edge = now - window_s
        with self._lock:
            times = self._times.get(key)
            if times is None:
                times = self._times[key] = deque()
            while times and times[0] <= edge:
                times.popleft()
            allowed = len(times) < amount
            if allowed:
                times.append(now)
            count, oldest = len(times), times[0] if times else now
            self._hits += 1
            if self._hits % _PURGE_EVERY == 0:  # forget keys whose window is empty
                for name in [k for k, t in self._times.items() if not t or t[-1] <= edge]:
                    if name != key:
                        del self._times[name]
        return allowed, count, oldest + window_s


class SqliteWindow:
    """A moving window in a SQLite file: one row per counted request, `(key, at, expires)`.

    A hit is one `BEGIN IMMEDIATE` transaction (the file's write lock): drop the key's rows that
    left the window, count the rest, add a row if under the limit. SQLite serialises the
    transactions of every process that opens the file, so the count is exact across them.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = threading.local()
        self._hits = 0
        with self._connect() as db:  # the schema once, before any worker thread needs it
            db.execute(
                "CREATE TABLE IF NOT EXISTS hits (key TEXT NOT NULL, at REAL NOT NULL, "
                "expires REAL NOT NULL)"
            )
            db.execute("CREATE INDEX IF NOT EXISTS hits_key_at ON hits (key, at)")
            db.execute("CREATE INDEX IF NOT EXISTS hits_expires ON hits (expires)")

    def _connect(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            self._local.db = db
        return db

    def hit(self, key: str, amount: int, window_s: int) -> tuple[bool, int, float]:
        """(allowed, requests now counted in the window, unix time its oldest one leaves)."""
        db = self._connect()
        now = time.time()
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("DELETE FROM hits WHERE key = ? AND at <= ?", (key, now - window_s))
            count, oldest = db.execute(
                "SELECT count(*), min(at) FROM hits WHERE key = ?", (key,)
            ).fetchone()
            allowed = count < amount
            if allowed:
                db.execute("INSERT INTO hits VALUES (?, ?, ?)", (key, now, now + window_s))
                count += 1
                oldest = now if oldest is None else oldest
            self._hits += 1
            if self._hits % _PURGE_EVERY == 0:
                db.execute("DELETE FROM hits WHERE expires <= ?", (now,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return allowed, count, oldest + window_s


class RateLimiter:
    def __init__(
        self,
        redis_url: str | None = None,
        *,
        sqlite_path: Path | None = None,
        connect_timeout_s: float = 2.0,
        timeout_s: float = 2.0,
        retry_s: float = 1.0,
    ) -> None:
        self._window: SqliteWindow | MemoryWindow | None = None
        self._limiter: strategies.MovingWindowRateLimiter | None = None
        # Redis's state as the requests see it; while it is unavailable every process counts
        # on its own (`_fallback`): limits hold per process, nothing is refused for Redis.
        self.backend = Backend(
            "redis", is_outage=redis_outage, retry_s=retry_s, configured=bool(redis_url)
        )
        self._fallback = MemoryWindow()
        self.fallback_hits = 0
        if redis_url:
            options: dict[str, Any] = {
                "socket_connect_timeout": connect_timeout_s,
                "socket_timeout": timeout_s,
                "retry": Retry(NoBackoff(), 0),  # one attempt: the timeouts are the whole wait
            }
            backend = storage.storage_from_string(redis_url, **options)
            self._limiter = strategies.MovingWindowRateLimiter(backend)
            self._storage = backend
        elif sqlite_path:
            self._window = SqliteWindow(sqlite_path)
        else:
            self._window = MemoryWindow()
        # A network round trip or a file lock per hit: the gate calls it from a worker thread.
        self.blocking = not isinstance(self._window, MemoryWindow)
        self.kind = "redis" if redis_url else "sqlite" if sqlite_path else "memory"

    def hit(self, key_id: str, spec: str) -> Decision:
        """Count one request of `key_id` against `spec` (e.g. "5/minute") unless it is over."""
        item = _item(spec)
        if self._limiter is not None:
            try:
                with self.backend.guard():
                    allowed = self._limiter.hit(item, "eqrisk", key_id)
                    stats = self._limiter.get_window_stats(item, "eqrisk", key_id)
                return Decision(
                    allowed=allowed,
                    limit=item.amount,
                    remaining=max(0, stats.remaining),
                    reset_time=stats.reset_time,
                )
            except BackendUnavailable:
                self.fallback_hits += 1
        window = self._window or self._fallback
        allowed, count, reset = window.hit(
            item.key_for("eqrisk", key_id), item.amount, item.get_expiry()
        )
        return Decision(allowed, item.amount, max(0, item.amount - count), reset)

    def ping(self) -> None:
        """Ask Redis whether it answers (the readiness check), updating its state; raises
        `BackendUnavailable` when it does not. Without Redis: nothing to ask."""
        if self._limiter is None:
            return
        client: Any = getattr(self._storage, "storage")  # noqa: B009 - RedisStorage's client
        with self.backend.probe():
            # The client's own PING: its errors say why, and mark Redis down (`check()` would
            # swallow them into False, which left the state as it was).
            client.ping()


class FailedKeys:
    """Unknown or revoked keys presented per client address, against a limit (setting
    `invalid_key_limit`): past it the address is refused (429) without its keys being looked up
    until the window frees a try, so guessing keys goes at the limit's pace, not the server's.
    Counted in the rate limiter's storage (shared by the workers); the refusal itself is
    decided in this process, from the count its own last failure saw."""

    MAX_BLOCKED = 10_000

    def __init__(self, limiter: RateLimiter, spec: str) -> None:
        self.limiter = limiter
        self.spec = spec
        self._blocked: dict[str, float] = {}  # address -> unix time it may try again

    def retry_after(self, address: str) -> int | None:
        """Seconds until `address` may present an unknown key again (None: it may now)."""
        until = self._blocked.get(address)
        if until is None:
            return None
        left = until - time.time()
        if left <= 0:
            del self._blocked[address]
            return None
        return max(1, math.ceil(left))

    def failed(self, address: str) -> Decision:
        """Count one unknown key from `address` (call it off the event loop when the limiter
        is `blocking`)."""
        decision = self.limiter.hit(f"invalid-key:{address}", self.spec)
        if decision.remaining == 0:
            if len(self._blocked) >= self.MAX_BLOCKED:
                now = time.time()
                self._blocked = {a: t for a, t in self._blocked.items() if t > now}
            self._blocked[address] = decision.reset_time
        return decision

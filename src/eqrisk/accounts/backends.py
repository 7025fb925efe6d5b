"""The state of a backend (the accounts database, Redis) as the requests see it, and the guard
every request-time call to it goes through (docs/decisions/outages.md).

A backend is `up` until a call fails for a reason that is the backend's (unreachable, timed
out, out of connections), then `down`: calls fail at once with `BackendUnavailable` (no wait)
until `retry_s` has passed, when one call at a time is let through to try it again; its
success brings the backend back `up`. So during an outage a request waits for a timeout at most
once per `retry_s` per process, and every other one is answered at once.
"""

from __future__ import annotations

import logging
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

logger = logging.getLogger("eqrisk.backends")

State = Literal["up", "down", "unknown", "off"]

# SQLite's primary result codes that say the file, not the statement, is the problem:
# BUSY, LOCKED, READONLY, IOERR, FULL, CANTOPEN.
_SQLITE_OUTAGE = frozenset({5, 6, 8, 10, 13, 14})


class BackendUnavailable(Exception):
    """A backend cannot answer now: the request gets a 503 with `Retry-After`."""

    def __init__(self, backend: str, reason: str, retry_after_s: float) -> None:
        super().__init__(f"{backend} unavailable: {reason}")
        self.backend = backend
        self.reason = reason
        self.retry_after_s = max(1, math.ceil(retry_after_s))


@dataclass(frozen=True)
class BackendState:
    """What `/api/ready` (and a metrics exporter) reports of a backend."""

    name: str
    state: State
    since: float  # unix time of the last change of `state`
    error: str | None = None  # the last failure's one-line reason, while down

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"state": self.state, "since": round(self.since, 3)}
        if self.error:
            out["error"] = self.error
        return out


def one_line(exc: BaseException) -> str:
    """An exception as one short log-safe line (drivers' messages span several)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]


def database_outage(exc: BaseException) -> bool:
    """Whether a database error is the database's condition rather than the statement's: a
    connection that failed or timed out, a server shutting down or out of resources, a lock
    that was not granted in time; on SQLite a busy, locked, read-only, full or unreadable file."""
    from sqlalchemy import exc as sa

    if isinstance(exc, sa.DBAPIError):
        if exc.connection_invalidated:
            return True
        exc = exc.orig if exc.orig is not None else exc
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        return code is not None and code & 0xFF in _SQLITE_OUTAGE
    import psycopg

    # psycopg's OperationalError covers SQLSTATE classes 08 (connection), 53 (resources),
    # 57 (operator intervention: shutdown, statement or lock timeout) and 58 (system), and
    # its own timeouts; InterfaceError a connection that is already closed.
    return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)


def redis_outage(exc: BaseException) -> bool:
    """Whether a Redis error means Redis cannot answer (connection, timeout, loading, busy)."""
    from limits.errors import StorageError
    from redis import exceptions as rx

    if isinstance(exc, StorageError):
        exc = exc.storage_error
    return isinstance(
        exc, rx.ConnectionError | rx.TimeoutError | rx.BusyLoadingError | rx.ReadOnlyError
    )


class Backend:
    """One backend's state and guard (see the module docstring). Thread-safe: the event loop,
    the charge writer and the worker threads of key lookups share it."""

    def __init__(
        self,
        name: str,
        *,
        is_outage: Callable[[BaseException], bool],
        retry_s: float = 1.0,
        configured: bool = True,
    ) -> None:
        self.name = name
        self.is_outage = is_outage
        self.retry_s = retry_s
        self._lock = threading.Lock()
        self._state: State = "unknown" if configured else "off"
        self._since = time.time()
        self._error: str | None = None
        self._next_try = 0.0  # monotonic time from which a call may try a down backend
        self._trying = False  # one call at a time tries a down backend
        self._reported = -math.inf  # monotonic time of the last call's outcome
        self.failures = 0  # calls failed for the backend's reason (for tests and metrics)

    def state(self) -> BackendState:
        with self._lock:
            return BackendState(self.name, self._state, self._since, self._error)

    @property
    def down(self) -> bool:
        """Down, and not yet time to try again (a call would fail at once)."""
        with self._lock:
            return self._state == "down" and time.monotonic() < self._next_try

    def unavailable(self, reason: str | None = None) -> BackendUnavailable:
        with self._lock:
            left = self._next_try - time.monotonic()
            why = reason or self._error or "not answering"
        return BackendUnavailable(self.name, why, max(left, self.retry_s))

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Run a call to the backend: refused at once while it is down (`BackendUnavailable`),
        else its outcome updates the state; an outage error becomes `BackendUnavailable`, any
        other error passes through unchanged."""
        trying = self._admit()
        try:
            yield
        except BackendUnavailable:
            self._release(trying)
            raise
        except BaseException as exc:
            if self.is_outage(exc):
                self.failed(exc)
                raise self.unavailable(one_line(exc)) from exc
            self._release(trying)
            raise
        self.succeeded()

    @contextmanager
    def probe(self) -> Iterator[None]:
        """Like `guard`, but tries the backend even while it is down (the readiness check)."""
        try:
            yield
        except BaseException as exc:
            if self.is_outage(exc):
                self.failed(exc)
                raise self.unavailable(one_line(exc)) from exc
            raise
        self.succeeded()

    def _admit(self) -> bool:
        """True when this call is the one trying a down backend."""
        with self._lock:
            if self._state != "down":
                return False
            if self._trying or time.monotonic() < self._next_try:
                left = max(self._next_try - time.monotonic(), 0.0)
                error = BackendUnavailable(self.name, self._error or "down", left or self.retry_s)
            else:
                self._trying = True
                return True
        raise error

    def _release(self, trying: bool) -> None:
        if trying:
            with self._lock:
                self._trying = False

    def reported_within(self, seconds: float) -> bool:
        """Whether a call's outcome updated the state within the last `seconds`."""
        with self._lock:
            return time.monotonic() - self._reported < seconds

    def succeeded(self) -> None:
        with self._lock:
            self._trying = False
            self._reported = time.monotonic()
            if self._state == "up":
                return
            was, since = self._state, self._since
            self._state, self._since, self._error = "up", time.time(), None
        if was == "down":
            logger.warning("%s up again after %.1f s down", self.name, time.time() - since)

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            self._trying = False
            self._reported = time.monotonic()
            self.failures += 1
            self._next_try = time.monotonic() + self.retry_s
            self._error = one_line(exc)
            if self._state == "down":
                return
            self._state, self._since = "down", time.time()
        logger.warning("%s down: %s", self.name, one_line(exc))
